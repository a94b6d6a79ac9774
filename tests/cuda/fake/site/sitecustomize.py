"""With this folder on PYTHONPATH and ``STREAMRT_CUDA_FAKE=1``, every Python process installs the
fake CUDA runtime at startup: ``make gpu-check-fake`` rehearses ``scripts/gpu_check.sh`` (tests,
benchmarks, summary and table) without a GPU."""

import os
import sys

if os.environ.get("STREAMRT_CUDA_FAKE") == "1":
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..")))
    from tests.cuda.fake import install

    install()
