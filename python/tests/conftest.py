"""Shared helpers of the gpumem Python tests.

Each test that needs a configured library runs its code in a fresh Python
process (run()): the library reads GPUMEM_CONFIG once, when it is loaded,
and a process may hold one configuration (simulated device or GPU); a
crash in one test then cannot take the others down."""

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(HERE)  # python/
ROOT = os.path.dirname(PACKAGE)
# The tests that import the package in this process (not through run())
# find it here whichever test file pytest collects first: run alone,
# test_library.py's in-process tests did not.
if PACKAGE not in sys.path:
    sys.path.insert(0, PACKAGE)


def library_path():
    for p in (os.environ.get("GPUMEM_LIBRARY"), os.path.join(PACKAGE, "gpumem", "libgpumem.so"),
              os.path.join(ROOT, "build", "libgpumem.so")):
        if p and os.path.exists(p):
            return p
    return None


def run(code, config="", env=None, check=True, timeout=300):
    """Runs code (dedented) in a new Python with the package importable and
    GPUMEM_CONFIG=config; returns the CompletedProcess (stdout, stderr).
    GPUMEM_TEST_EXTRA_CONFIG, if set, is appended to every test's config:
    the whole suite under one more setting (chunk_handles=true, say)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PACKAGE + os.pathsep + e.get("PYTHONPATH", "")
    extra = os.environ.get("GPUMEM_TEST_EXTRA_CONFIG", "")
    e["GPUMEM_CONFIG"] = ",".join(c for c in (config, extra) if c)
    e.pop("GPUMEM_LIBRARY", None) if library_path() is None else None
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True,
                       text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    return p


def under_each(script, allocators):
    """Runs script once per allocator, each in a process of its own with
    ALLOCATOR set to its name; returns {allocator: the dict of its last
    "RESULT <json>" line}, failing if a run exits badly or prints none."""
    import json
    results = {}
    for allocator in allocators:
        p = run(script, env={"ALLOCATOR": allocator}, check=False)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        assert p.returncode == 0 and line, f"{allocator}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
        results[allocator] = json.loads(line[-1][len("RESULT "):])
    return results


def _has_gpu():
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU (torch.cuda.is_available() is False)"
    return True, ""


def _has_cupy():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # ImportError, or CUDA errors without a GPU
        return False, f"CuPy with a GPU is not available ({type(e).__name__}: {e})"
    return True, ""


needs_library = pytest.mark.skipif(library_path() is None,
                                   reason="libgpumem.so is not built: run scripts/lib.sh")
_gpu, _gpu_why = _has_gpu()
needs_gpu = pytest.mark.skipif(not _gpu or os.environ.get("GPUMEM_NO_GPU_TESTS") == "1", reason=_gpu_why or "GPUMEM_NO_GPU_TESTS=1")
_cupy, _cupy_why = _has_cupy()
needs_cupy = pytest.mark.skipif(not _cupy, reason=_cupy_why)
