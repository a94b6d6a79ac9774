"""Task graphs: builder (Graph, Node), stream capture, executable graphs."""
