"""The operators' CUDA C on the CPU emulator (``streamrt.emu``; see ``emu.py``): used by
test_ops_cuda_emulated and the fake CUDA runtime."""
