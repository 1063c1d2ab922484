"""gpumem: a GPU memory manager, for PyTorch and CuPy programs.

    import gpumem.torch
    gpumem.torch.use(limit="40GiB")   # before the first CUDA allocation
    ...                                # the program, unchanged

gpumem.torch and gpumem.cupy install gpumem as the framework's allocator;
this module holds what both share: the library (libgpumem.so, found beside
the package or through GPUMEM_LIBRARY), its configuration, and its numbers.
"""

import json

from ._lib import GpumemError, OutOfMemory, OutOfMemoryError, load

__all__ = ["GpumemError", "OutOfMemory", "OutOfMemoryError", "configure", "trim",
           "stats", "snapshot", "reset_peaks", "last_oom", "serve", "version", "library"]


def library():
    """The loaded libgpumem (see gpumem._lib.Library)."""
    return load()


def version():
    """The library's version string."""
    return load().version()


def _limit_config(limit):
    if limit is None:
        return None
    if isinstance(limit, bool):
        raise TypeError("limit: want a size in bytes, a string such as '40GiB' or '90%', or a fraction")
    if isinstance(limit, int):
        if limit <= 0:
            raise ValueError(f"limit {limit}: want a positive number of bytes")
        return f"limit={limit}"
    if isinstance(limit, float):
        if not 0 < limit <= 1:
            raise ValueError(f"limit {limit}: a fraction of the device's memory must be above 0 and at most 1")
        return f"limit={limit * 100!r}%"
    if isinstance(limit, str):
        return f"limit={limit}"
    raise TypeError(f"limit: {type(limit).__name__}: want an int, a float fraction or a string")


def configure(config=None, *, limit=None):
    """Applies a configuration string (as GPUMEM_CONFIG: "limit=40GiB,
    release_after=30s") and/or a limit: bytes (int), a size ("40GiB"), a
    percentage ("90%") or a fraction (0.9) of each device's memory. Before
    the first allocation every key may change; after, only the limit."""
    lib = load()
    if config:
        lib.configure(config)
    c = _limit_config(limit)
    if c:
        lib.configure(c)


# Called by trim() before it trims: the framework modules' own clean-up
# (gpumem.cupy gives back the pools of collected graphs).
_before_trim = []


def trim(device=-1):
    """Gives every unused byte of device (-1: every device) back to the driver now."""
    for hook in list(_before_trim):
        hook()
    load().trim(device)


def stats(device=0):
    """The allocator's numbers for device, as a dict (gpumem_stats)."""
    return load().stats(device).as_dict()


def reset_peaks(device=-1):
    """Starts the peaks over from what is held now."""
    load().reset_peaks(device)


def snapshot(device=0):
    """The allocator's segments, spans and blocks, as a dict."""
    return json.loads(load().snapshot_json(device))


def serve(addr="127.0.0.1:0"):
    """Serves gpumem's statistics, snapshots and Prometheus metrics over HTTP
    on addr (port 0 picks one) and returns the address bound:
    http://ADDR/metrics, http://ADDR/debug/gpumem/stats."""
    return load().serve(addr)


def last_oom():
    """The verdict of this thread's last out-of-memory (an OutOfMemory, with
    cause "limit", "device" or "fragmentation", the numbers and what would
    have fit: would_fit, after_trim, with_virtual), or None."""
    return load().last_oom()
