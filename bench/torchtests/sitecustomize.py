"""Makes gpumem PyTorch's CUDA allocator at interpreter start, for running
PyTorch's own tests under it (bench/torchtests/run.sh).

Python imports `sitecustomize` from sys.path when the interpreter starts;
run.sh puts bench/torchtests on PYTHONPATH so that this file is the one.

- GPUMEM_TORCH_ALLOCATOR unset or empty: does nothing and prints nothing.
  That is the run under PyTorch's own allocator.
- GPUMEM_TORCH_ALLOCATOR=gpumem: imports torch and calls
  gpumem.torch.use() before any test code runs (so before PyTorch's
  allocator is initialized), then says so on stderr in one line. If that
  fails, the process exits with status 3: a run that was asked for gpumem
  never goes on under PyTorch's allocator.
- Any other value: exits with status 2.

Child processes (tests that start `python -c ...` or a multiprocessing
spawn pool) do not inherit the setting: it is removed from os.environ once
read, so they start with PyTorch's allocator as a fresh interpreter would.
GPUMEM_TORCH_INHERIT=1 keeps it, making every child use gpumem too.

gpumem's own configuration comes from its usual environment (GPUMEM_CONFIG,
GPUMEM_LIBRARY); use() is called with no limit.
"""

import os
import sys


def _install():
    want = os.environ.get("GPUMEM_TORCH_ALLOCATOR", "")
    if not want:
        return
    if want != "gpumem":
        sys.stderr.write(f"sitecustomize (bench/torchtests): GPUMEM_TORCH_ALLOCATOR={want!r}: "
                         "want 'gpumem' or unset\n")
        os._exit(2)
    if os.environ.get("GPUMEM_TORCH_INHERIT") != "1":
        del os.environ["GPUMEM_TORCH_ALLOCATOR"]
    try:
        import gpumem.torch
        gpumem.torch.use()
        if not gpumem.torch.installed():
            raise RuntimeError("gpumem.torch.use() returned but gpumem.torch.installed() is False")
    except BaseException as e:  # noqa: BLE001 - anything here must stop the run
        sys.stderr.write("sitecustomize (bench/torchtests): could not make gpumem PyTorch's "
                         f"allocator: {type(e).__name__}: {e}\n")
        sys.stderr.flush()
        os._exit(3)
    sys.stderr.write(f"sitecustomize (bench/torchtests): gpumem is PyTorch's CUDA allocator "
                     f"in pid {os.getpid()}\n")


_install()
