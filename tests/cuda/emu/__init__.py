"""A CPU emulator for the operators' CUDA C kernels (see ``emu.py``); used by test_ops_cuda_emulated."""
