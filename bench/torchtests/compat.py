"""What the stored test_cuda.py (PyTorch's main branch, a little after the
2.11 cut: see README.md) and test_cudagraph_trees.py (2024) ask of
torch.testing._internal that PyTorch 2.11 does not have, defined as the test file of 2.11 defined it itself. Applied
by the plugin and by preflight before the test file is imported; each name
is set only where missing, and said on stderr."""

import sys


def apply():
    try:
        import torch
        from torch.testing._internal import common_utils
    except ImportError:  # no torch (the harness's selftest): nothing to define
        return

    if not hasattr(common_utils, "TEST_CUDAMALLOCASYNC"):
        # test/test_cuda.py of PyTorch 2.11: TEST_CUDA and the backend.
        common_utils.TEST_CUDAMALLOCASYNC = (torch.cuda.is_available()
                                             and torch.cuda.get_allocator_backend() == "cudaMallocAsync")
        print("compat: common_utils.TEST_CUDAMALLOCASYNC defined as 2.11's test_cuda.py did", file=sys.stderr)

    try:
        from torch.testing._internal import inductor_utils
    except ImportError:
        inductor_utils = None
    if inductor_utils is not None and not hasattr(inductor_utils, "HAS_CUDA"):
        # test/inductor/test_cudagraph_trees.py of 2024 imports HAS_CUDA,
        # which 2.11 names HAS_CUDA_AND_TRITON.
        inductor_utils.HAS_CUDA = getattr(inductor_utils, "HAS_CUDA_AND_TRITON", torch.cuda.is_available())
        print("compat: inductor_utils.HAS_CUDA defined as HAS_CUDA_AND_TRITON", file=sys.stderr)
