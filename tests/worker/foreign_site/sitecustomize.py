"""Test-only start-up hook for the worker environment of tests/worker/test_environments.py (NOT shipped).

TensorRT-LLM needs Python 3.10/3.12, MPI and a CUDA driver; the test machine has Python 3.11 and no GPU, and the
environment runs the FAKE tensorrt_llm (tests/engines/fake_tensorrt_llm). This hook, on the worker's PYTHONPATH
only, makes SpecDeck's capability check see a supported Python, libmpi and libcuda — the one mocked part of an
otherwise real second environment (its own interpreter, transformers 4.57.3, no torch, no Qt).
"""

import sys

from app.engines.trtllm import capability as _capability_pkg  # noqa: F401  (loads the submodule)

_cap = sys.modules["app.engines.trtllm.capability"]
_cap._python_version = lambda: (3, 12)
_cap._load_mpi = lambda: True
_cap._load_cuda_driver = lambda: True
