"""gpumem as PyTorch's CUDA allocator.

    import gpumem.torch
    gpumem.torch.use(limit="40GiB")   # before the first CUDA allocation

use() loads libgpumem into PyTorch through CUDAPluggableAllocator and wires
what PyTorch does not pass to a pluggable allocator by itself:

- torch.cuda.empty_cache() gives gpumem's cache back to the driver;
- torch.cuda.set_per_process_memory_fraction() sets gpumem's limit;
- torch.cuda.mem_get_info() answers within the limit (free: what could
  still be allocated, cache included);
- torch.Tensor.record_stream() keeps memory from reuse until the other
  stream's work is done;
- torch.cuda.memory_allocated(), max_memory_allocated(), memory_reserved(),
  max_memory_reserved(), reset_peak_memory_stats(), memory_stats() and
  memory_summary(), which raise for a pluggable allocator, answer from
  gpumem's numbers;
- an out-of-memory raises torch.cuda.OutOfMemoryError, as PyTorch's own
  allocator does, with gpumem's verdict (limit, device or fragmentation,
  the numbers, and what would have fit: a smaller request, after
  empty_cache(), with mode=virtual); last_oom() returns it as an object.

record(path) writes a gpumem trace of the code it wraps, for gpumem replay.
"""

import contextlib
import os
import sys
import tempfile
import threading

from . import _lib, configure

__all__ = ["use", "installed", "stats", "trim", "snapshot", "memory_summary", "last_oom", "record"]

_state = {"installed": False}
_patched = {}


def installed():
    """Whether gpumem is PyTorch's allocator in this process."""
    return _state["installed"]


def use(limit=None, *, config=None):
    """Makes gpumem PyTorch's CUDA allocator. Call it before PyTorch
    initializes its allocator: before the first CUDA allocation,
    torch.cuda.set_device or torch.cuda.init (importing torch is fine);
    afterwards PyTorch refuses to change allocators and this raises
    RuntimeError saying so.

    limit: bytes (int), a size ("40GiB"), a percentage ("90%") or a
    fraction (0.9) of each device's memory; config: a configuration string
    as in GPUMEM_CONFIG ("release_after=30s,span_size=32MiB")."""
    import torch

    if _state["installed"]:
        configure(config, limit=limit)
        return
    lib = _lib.load()
    configure(config, limit=limit)
    # NCCL must not rely on record_stream from C++, which a pluggable
    # allocator does not receive (PyTorch 2.11's default already).
    os.environ.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(lib.path, "gpumem_alloc", "gpumem_free")
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise RuntimeError(
            "gpumem.torch.use() must run before PyTorch initializes its CUDA allocator "
            "(at the first CUDA allocation, torch.cuda.set_device or torch.cuda.init); "
            f"it already has ({e})") from None
    tlib = os.path.join(os.path.dirname(torch.__file__), "lib")
    if lib.torch_errors(os.path.join(tlib, "libc10.so"), os.path.join(tlib, "libc10_cuda.so")) != _lib.SUCCESS:
        import warnings
        warnings.warn("gpumem: " + lib.last_error() + " (PyTorch " + torch.__version__ + ")", RuntimeWarning, stacklevel=2)
    _state["allocator"] = allocator
    _state["installed"] = True
    _patch(torch, lib)


def _device(device):
    import torch
    return torch.cuda._utils._get_device_index(device, optional=True)


def _patch(torch, lib):
    cuda = torch.cuda
    mem = torch.cuda.memory

    def empty_cache():
        """Gives gpumem's cache back to the driver (patched by gpumem.torch)."""
        lib.trim(-1)

    def set_per_process_memory_fraction(fraction, device=None):
        """Caps gpumem's memory on device at fraction of it (patched by gpumem.torch)."""
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        lib.set_memory_fraction(_device(device), fraction)

    def mem_get_info(device=None):
        """(free, total) as a program on gpumem sees them: total is the limit,
        free what could still be allocated (patched by gpumem.torch)."""
        return lib.mem_info(_device(device))

    def memory_stats(device=None):
        return _torch_stats(lib.stats(_device(device)))

    def memory_allocated(device=None):
        return lib.stats(_device(device)).active

    def max_memory_allocated(device=None):
        return lib.stats(_device(device)).peak_active

    def memory_reserved(device=None):
        return lib.stats(_device(device)).reserved

    def max_memory_reserved(device=None):
        return lib.stats(_device(device)).peak_reserved

    def reset_peak_memory_stats(device=None):
        lib.reset_peaks(_device(device))

    def summary(device=None, abbreviated=False):
        return memory_summary(device)

    def record_stream(self, stream):
        """Keeps this tensor's memory from reuse until stream's work up to its
        free is done (patched by gpumem.torch)."""
        if self.is_cuda:
            lib.record_stream(self.untyped_storage().data_ptr(), self.device.index, stream.cuda_stream)

    for name, fn in [("empty_cache", empty_cache),
                     ("set_per_process_memory_fraction", set_per_process_memory_fraction),
                     ("mem_get_info", mem_get_info),
                     ("memory_stats", memory_stats),
                     ("memory_allocated", memory_allocated),
                     ("max_memory_allocated", max_memory_allocated),
                     ("memory_reserved", memory_reserved),
                     ("max_memory_reserved", max_memory_reserved),
                     ("reset_peak_memory_stats", reset_peak_memory_stats),
                     ("reset_max_memory_allocated", reset_peak_memory_stats),
                     ("memory_summary", summary)]:
        for module in (cuda, mem):
            if hasattr(module, name):
                _patched[(module.__name__, name)] = getattr(module, name)
                setattr(module, name, fn)
    _patched[("torch.Tensor", "record_stream")] = torch.Tensor.record_stream
    torch.Tensor.record_stream = record_stream


def _torch_stats(s):
    """gpumem's numbers under torch.cuda.memory_stats()'s keys (those that
    have a meaning here; "allocated" is PyTorch's: blocks, rounded)."""
    out = {}
    for key, cur, peak in [("allocated_bytes", s.active, s.peak_active),
                           ("active_bytes", s.active, s.peak_active),
                           ("requested_bytes", s.allocated, s.peak_allocated),
                           ("reserved_bytes", s.reserved, s.peak_reserved)]:
        out[f"{key}.all.current"] = cur
        out[f"{key}.all.peak"] = peak
    out["inactive_split_bytes.all.current"] = s.cached - s.releasable
    out["active.all.current"] = s.live_buffers
    out["allocation.all.allocated"] = s.allocs
    out["allocation.all.freed"] = s.frees
    out["num_ooms"] = s.ooms
    out["num_device_calls"] = s.device_calls
    out["num_trims"] = s.trims
    out["fragmentation"] = s.fragmentation
    out["limit"] = s.limit
    return dict(sorted(out.items()))


def stats(device=None):
    """gpumem's numbers for device (default: the current one), as a dict."""
    return _lib.load().stats(_device(device)).as_dict()


def trim(device=None):
    """Gives device's cache (default: every device's) back to the driver now."""
    _lib.load().trim(-1 if device is None else _device(device))


def snapshot(device=None):
    """gpumem's segments, spans and blocks on device, as a dict."""
    import json
    return json.loads(_lib.load().snapshot_json(_device(device)))


def last_oom():
    """The verdict of this thread's last out-of-memory, or None."""
    return _lib.load().last_oom()


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def memory_summary(device=None):
    """A readable table of gpumem's numbers on device."""
    s = _lib.load().stats(_device(device))
    rows = [("in use (requested)", s.allocated, s.peak_allocated),
            ("in use (blocks)", s.active, s.peak_active),
            ("held from the driver", s.reserved, s.peak_reserved),
            ("cached", s.cached, None),
            ("  releasable now", s.releasable, None),
            ("  largest free piece", s.largest_free, None)]
    lines = ["gpumem memory summary, device %d (limit %s)" % (_device(device), _size(s.limit)),
             "%-24s %14s %14s" % ("", "current", "peak")]
    for name, cur, peak in rows:
        lines.append("%-24s %14s %14s" % (name, _size(cur), "" if peak is None else _size(peak)))
    lines.append("fragmentation %.1f%%; %d live buffers; %d allocations, %d frees; "
                 "%d driver calls; %d out-of-memory" % (100 * s.fragmentation, s.live_buffers,
                                                        s.allocs, s.frees, s.device_calls, s.ooms))
    return "\n".join(lines)


# --- record ---------------------------------------------------------------

_SITE_DEPTH = 8


def _short(filename):
    i = filename.rfind("site-packages" + os.sep)
    if i >= 0:
        return filename[i:]
    try:
        rel = os.path.relpath(filename)
        return rel if not rel.startswith("..") else filename
    except ValueError:
        return filename


class _Sites:
    """Interns the Python call sites of allocations while a recording runs:
    the callback runs on the allocating thread (ctypes takes the GIL), reads
    the Python stack that called into PyTorch, and names each new stack once
    in the trace."""

    def __init__(self, lib, device):
        self.lib, self.device = lib, device
        self.ids = {}
        self.lock = threading.Lock()
        self.callback = _lib.SITE_CALLBACK(self._site)

    def _site(self, device):
        try:
            if device != self.device:
                return 0
            frame = sys._getframe(1)
            key, frames = [], []
            while frame is not None and len(frames) < _SITE_DEPTH:
                code = frame.f_code
                key.append((id(code), frame.f_lineno))
                frames.append(f"{code.co_name} {_short(code.co_filename)}:{frame.f_lineno}")
                frame = frame.f_back
            key = tuple(key)
            with self.lock:
                site = self.ids.get(key)
                if site is None:
                    site = len(self.ids) + 1
                    text = " < ".join(frames) if frames else "<no Python frame: a C++ thread such as autograd's>"
                    self.lib.record_site(self.device, site, text)
                    self.ids[key] = site
            return site
        except Exception:  # never let a site break an allocation
            return 0


@contextlib.contextmanager
def record(path, device=None, sites=True):
    """Writes a gpumem trace of the allocations made inside the block to
    path (gzip-compressed when it ends in .gz), with streams and, if sites,
    the Python call site of each allocation. Replay it with
    `gpumem replay PATH` under any policy.

    Under gpumem (after use()) the library records; under PyTorch's own
    allocator, PyTorch's memory history is recorded and converted (the
    importer of `gpumem import`)."""
    import torch
    lib = _lib.load()
    dev = _device(device)
    if _state["installed"]:
        lib.record_start(dev, path)
        s = None
        if sites:
            s = _Sites(lib, dev)
            lib.set_site_callback(s.callback)
        try:
            yield
        finally:
            if s is not None:
                lib.set_site_callback(_lib.SITE_CALLBACK())
            lib.record_stop(dev)
        return
    torch.cuda.memory._record_memory_history(context="alloc" if sites else None,
                                             stacks="python", max_entries=10_000_000, device=dev)
    try:
        yield
    finally:
        snap = torch.cuda.memory._snapshot(device=dev)
        torch.cuda.memory._record_memory_history(enabled=None, device=dev)
        import pickle
        with tempfile.NamedTemporaryFile(suffix=".pickle", delete=False) as f:
            pickle.dump(snap, f)
        try:
            lib.import_snapshot(f.name, os.fspath(path))
        finally:
            os.unlink(f.name)
