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
  empty_cache(), with mode=virtual); last_oom() returns it as an object;
- CUDA graphs keep their memory: what a capture allocates (on any stream
  of the capture) comes from the graph's private pool, which serves no
  other allocation until the graph is reset or collected, as under
  PyTorch's allocator. Wired: torch.cuda.CUDAGraph's capture_begin,
  capture_end (and capture_end_pre where it exists), reset and its
  collection; torch._C's _cuda_beginAllocateCurrentThreadToPool,
  _cuda_beginAllocateToPool, _cuda_beginAllocateCurrentStreamToPool,
  _cuda_endAllocateToPool, _cuda_endAllocateCurrentStreamToPool,
  _cuda_releasePool and _cuda_checkPoolLiveAllocations (torch.cuda.graph,
  make_graphed_callables, use_mem_pool and torch.compile's graph trees call
  these), also where a module imported them by name;
- torch.compile(mode="reduce-overhead"): the allocator checkpoints its CUDA
  graph trees take and put back (_cuda_getCheckpointState,
  _cuda_setCheckpointPoolState) and the storage helpers around them
  (_cuda_cudaCachingAllocator_raw_delete, _free_And_Remove_DeleterFn,
  _has_Standard_Deleter) work on gpumem's pools (_checkpoint.py).

- cuDNN's benchmark (torch.backends.cudnn.benchmark) gets its workspace
  size from gpumem: PyTorch's C++ cacheInfo query, which
  CUDAPluggableAllocator refuses, is answered (clib/torch_allocator.c);
- settings of PyTorch's own CUDA allocator (PYTORCH_CUDA_ALLOC_CONF,
  torch.cuda.memory._set_allocator_settings: expandable_segments,
  max_split_size_mb, ...) have no effect under gpumem, which says so once
  per setting (gpumem's own: GPUMEM_CONFIG, gpumem.configure()), except
  graph_capture_record_stream_reuse, which gpumem follows: a buffer freed
  during a capture after record_stream is reused within the capture once
  the graph joins its streams' work (gpumem_set_capture_reuse);
- out-of-memory observers (torch._C._cuda_attach_out_of_memory_observer)
  are called on gpumem's out-of-memory, with PyTorch's arguments;

- torch.cuda.memory_stats() answers with PyTorch's keys wherever gpumem
  has the figure, memory_summary() in PyTorch's table layout, and
  torch.cuda.memory._record_memory_history, _snapshot, _dump_snapshot and
  memory_snapshot in PyTorch's snapshot format, with Python frames
  (_torchmem.py): torch.cuda._memory_viz renders it, gpumem import reads
  it.

record(path) writes a gpumem trace of the code it wraps, for gpumem replay.

Where things are (the module is in rooms; this one holds the public calls:
use(), installed(), configure(), stats(), trim(), snapshot(), last_oom(),
memory_summary(), record()):

- _torch_state.py: what the rooms share: _state, _patched, _lock, and
  _put, _replace_all and _device, which put gpumem's functions in the
  places of PyTorch's (keeping the originals in _patched);
- _torch_plugin.py: the plug-in's wiring once use() has made gpumem the
  allocator (_patch): torch.cuda's and torch.accelerator's memory
  functions, record_stream, PyTorch's allocator settings, out-of-memory
  observers;
- _torch_graphs.py: CUDA graphs and private pools: CUDAGraph's capture,
  torch._C's pool calls, MemPool, allocator checkpoints (_checkpoint.py);
- _torch_history.py: memory history and snapshots (_record_memory_history,
  _snapshot, _dump_snapshot, memory_snapshot; their format: _torchmem.py);
- _torchmem.py: memory_stats' keys, memory_summary's table and the
  history's format; _sharing.py: CUDA tensors through torch.multiprocessing.

The rooms' private names are importable from gpumem.torch too (tests and
bench scripts use them); they are the rooms' own objects, defined once.
"""

import contextlib
import os
import tempfile

from . import _checkpoint, _lib, _torchmem, configure
# The rooms (see above). Their names are gpumem.torch's as before the split.
from ._torch_state import _state, _patched, _lock, _put, _device, _replace_all
from ._torch_graphs import (_pool_id, _GraphPools, _graph_states, _graph_pools, _quietly, _capture_pool,
                            _patch_graphs, _release_pool, _patch_mempool, _own_function, _custom_allocators,
                            _patch_custom_allocator, _patch_graph_class, _patch_pool_calls)
from ._torch_history import _patch_history
from ._torch_plugin import (_patch, _DEVICE_SETTINGS, _FOLLOWED_SETTINGS, _said_settings, _settings,
                            _settings_ignored, _follow_settings, _patch_allocator_settings, _nested,
                            _patch_oom_observers)

__all__ = ["use", "installed", "stats", "trim", "snapshot", "memory_summary", "last_oom", "record"]


def installed():
    """Whether gpumem is PyTorch's allocator in this process."""
    return _state["installed"]


def _nccl_hook_refusal(env):
    """The one line use() fails with where PyTorch would register its own
    allocator's segments with NCCL (TORCH_NCCL_USE_TENSOR_REGISTER_
    ALLOCATOR_HOOK): through a pluggable allocator the process aborts
    ("terminate called without an active exception") in its first NCCL
    collective (PyTorch 2.11, H200, one rank and two; bench/gate/ncclhook.py).
    None where it is off."""
    v = env.get("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "").strip().lower()
    if v in ("", "0", "false", "no", "off"):
        return None
    return ("gpumem: TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=" + env["TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"] +
            " registers PyTorch's own allocator's segments with NCCL, which a pluggable allocator cannot serve "
            "(the process would abort at its first collective): unset it to train on gpumem")


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
    refusal = _nccl_hook_refusal(os.environ)
    if refusal:
        raise RuntimeError(refusal)
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
    # cuDNN's benchmark asks the allocator, from C++, how much it could
    # hand out (cacheInfo), which CUDAPluggableAllocator refuses.
    if lib.torch_cache_info(os.path.join(tlib, "libtorch_cuda.so")) != _lib.SUCCESS:
        import warnings
        warnings.warn(lib.last_error() + " (PyTorch " + torch.__version__ + ")", RuntimeWarning, stacklevel=2)
    # C++ memory history (torch::cuda::_record_memory_history and
    # _memory_snapshot_pickled) fails with gpumem's line naming the Python
    # calls that work. Left as PyTorch's message if it cannot be: no
    # warning, as nothing else changes.
    lib.torch_cpp_history(os.path.join(tlib, "libtorch_cuda.so"))
    _state["allocator"] = allocator
    _state["installed"] = True
    _patch(torch, lib)
    # CUDA tensors through torch.multiprocessing: gpumem's chunks as file
    # descriptors, not PyTorch's IPC handles, which the plug-in cannot give.
    from . import _sharing
    _sharing.install(torch, lib)


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
        hist = _state.get("history")
        if sites and hist is not None and hist.sites is not None:
            raise RuntimeError("gpumem: record() while torch.cuda.memory._record_memory_history is on: "
                               "the two share the call-site hook; turn the history off first")
        lib.record_start(dev, path)
        s = None
        if sites:
            # Each new call site is named in the trace once (_torchmem.Sites).
            interned = _torchmem.Sites(lambda site, frames: lib.record_site(dev, site, _torchmem.site_text(frames)))
            s = _lib.SITE_CALLBACK(lambda device: interned.site() if device == dev else 0)
            lib.set_site_callback(s)
        _state["recording"] = _state.get("recording", 0) + 1
        try:
            yield
        finally:
            _state["recording"] -= 1
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
