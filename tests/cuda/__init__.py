"""cuda-backend tests, the fake CUDA runtime (``fake/``) and the kernel emulator (``emu/``)."""
