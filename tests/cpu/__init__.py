"""Tests of the cpu backend itself: address space, worker queues, delay injection, graph replay."""
