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
"""

import contextlib
import inspect
import os
import sys
import tempfile
import threading
import types
import warnings
import weakref

from . import _checkpoint, _lib, _torchmem, configure

__all__ = ["use", "installed", "stats", "trim", "snapshot", "memory_summary", "last_oom", "record"]

_state = {"installed": False}
_patched = {}  # (module or class, name) -> what gpumem put its own in the place of
_lock = threading.Lock()


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


def _put(modules, name, fn):
    """Puts fn in the place of name in each of modules that has it (None
    skipped), keeping the original in _patched."""
    for module in modules:
        if module is not None and hasattr(module, name):
            _patched[(module.__name__, name)] = getattr(module, name)
            setattr(module, name, fn)


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
        if fraction < 0 or fraction > 1:  # PyTorch's check and words
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        lib.set_memory_fraction(_device(device), fraction)

    def mem_get_info(device=None):
        """(free, total) as a program on gpumem sees them: total is the limit,
        free what could still be allocated (patched by gpumem.torch)."""
        return lib.mem_info(_device(device))

    accumulated_base = {}  # device -> memory_stats at reset_accumulated_memory_stats

    def memory_stats(device=None):
        """PyTorch's keys over gpumem's numbers (patched by gpumem.torch)."""
        dev = _device(device)
        return _torchmem.memory_stats(lib.stats(dev), accumulated_base.get(dev))

    def reset_accumulated_memory_stats(device=None):
        """Counts the accumulated figures of memory_stats (.allocated,
        .freed, num_*) from now (patched by gpumem.torch)."""
        dev = _device(device)
        accumulated_base[dev] = _torchmem.memory_stats(lib.stats(dev))

    def get_per_process_memory_fraction(device=None):
        """gpumem's limit as a fraction of the device's memory (patched by
        gpumem.torch)."""
        dev = _device(device)
        _, limit = lib.mem_info(dev)  # total as a program on gpumem sees it: the limit
        total = torch.cuda.get_device_properties(dev).total_memory
        return min(1.0, limit / total) if limit else 1.0

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
        """PyTorch's table over gpumem's numbers (patched by gpumem.torch)."""
        dev = _device(device)
        return _torchmem.memory_summary(lib.stats(dev), dev, abbreviated, accumulated_base.get(dev))

    def record_stream(self, stream):
        """Keeps this tensor's memory from reuse until stream's work up to its
        free is done (patched by gpumem.torch)."""
        if self.is_cuda:
            lib.record_stream(self.untyped_storage().data_ptr(), self.device.index, stream.cuda_stream)

    def memory_stats_as_nested_dict(device=None):
        """memory_stats nested by the dots of its keys, as PyTorch's
        (patched by gpumem.torch)."""
        return _nested(memory_stats(device))

    for name, fn in [("memory_stats_as_nested_dict", memory_stats_as_nested_dict),
                     ("empty_cache", empty_cache),
                     ("set_per_process_memory_fraction", set_per_process_memory_fraction),
                     ("mem_get_info", mem_get_info),
                     ("memory_stats", memory_stats),
                     ("memory_allocated", memory_allocated),
                     ("max_memory_allocated", max_memory_allocated),
                     ("memory_reserved", memory_reserved),
                     ("max_memory_reserved", max_memory_reserved),
                     ("reset_peak_memory_stats", reset_peak_memory_stats),
                     ("reset_max_memory_allocated", reset_peak_memory_stats),
                     ("memory_summary", summary),
                     ("reset_accumulated_memory_stats", reset_accumulated_memory_stats),
                     ("get_per_process_memory_fraction", get_per_process_memory_fraction)]:
        _put((cuda, mem), name, fn)
    # torch.accelerator's memory functions (2.9 and later) ask the C++
    # allocator, which CUDAPluggableAllocator refuses: gpumem's, where the
    # current accelerator is CUDA.
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        for name, fn in [("empty_cache", empty_cache), ("memory_stats", memory_stats),
                         ("memory_allocated", memory_allocated), ("max_memory_allocated", max_memory_allocated),
                         ("memory_reserved", memory_reserved), ("max_memory_reserved", max_memory_reserved),
                         ("reset_peak_memory_stats", reset_peak_memory_stats),
                         ("reset_accumulated_memory_stats", reset_accumulated_memory_stats),
                         ("get_memory_info", mem_get_info)]:
            _put((acc, getattr(acc, "memory", None)), name, fn)
    # torch._C's entry points behind them, for code that calls them directly.
    news = {"_cuda_memoryStats": lambda device: memory_stats_as_nested_dict(device),
            "_cuda_resetAccumulatedMemoryStats": lambda device: reset_accumulated_memory_stats(device),
            "_cuda_resetPeakMemoryStats": lambda device: reset_peak_memory_stats(device),
            "_cuda_emptyCache": lambda *a: empty_cache()}
    _replace_all(torch, {k: v for k, v in news.items() if hasattr(torch._C, k)})
    _patched[("torch.Tensor", "record_stream")] = torch.Tensor.record_stream
    torch.Tensor.record_stream = record_stream
    _patch_graphs(torch, lib)
    _patch_history(torch, lib)
    _patch_oom_observers(torch, lib)
    _patch_allocator_settings(torch, lib)


# Settings of PyTorch's CUDA caching allocator (PYTORCH_CUDA_ALLOC_CONF,
# torch.cuda.memory._set_allocator_settings) that tune the allocator gpumem
# replaces: they change nothing under gpumem. (pinned_* settings tune
# PyTorch's host allocator, which stays PyTorch's.)
_DEVICE_SETTINGS = ("backend", "expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb",
                    "roundup_power2_divisions", "garbage_collection_threshold", "release_lock_on_cudamalloc",
                    "per_process_memory_fraction")
# Settings gpumem follows: key -> what gpumem.torch does with its value.
_FOLLOWED_SETTINGS = {"graph_capture_record_stream_reuse": "set_capture_reuse"}
_said_settings = set()


def _settings(conf):
    """The (key, value) pairs of a settings string ("key:value,..."),
    stripped."""
    for item in str(conf or "").split(","):
        key, _, value = item.partition(":")
        yield key.strip(), value.strip()


def _settings_ignored(conf, where):
    """Warns once per setting of conf ("key:value,...") that tunes PyTorch's
    own CUDA allocator, saying it has no effect under gpumem."""
    keys = []
    for key, _ in _settings(conf):
        if key in _DEVICE_SETTINGS and (where, key) not in _said_settings:
            _said_settings.add((where, key))
            keys.append(key)
    if keys:
        warnings.warn(f"gpumem: {where} sets {', '.join(keys)} for PyTorch's own CUDA allocator, which "
                      "gpumem replaces: no effect under gpumem.torch.use(); gpumem's settings are "
                      "GPUMEM_CONFIG or gpumem.configure()", RuntimeWarning, stacklevel=3)
    return keys


def _follow_settings(conf, lib):
    """Applies the settings of conf ("key:value,...") that gpumem follows
    (graph_capture_record_stream_reuse: reuse within a capture). A value
    other than True or False is PyTorch's to refuse; gpumem leaves it."""
    for key, value in _settings(conf):
        setter = _FOLLOWED_SETTINGS.get(key)
        value = value.lower()
        if setter and value in ("true", "false"):
            try:
                getattr(lib, setter)(value == "true")
            except _lib.GpumemError as e:  # the program goes on without it
                warnings.warn(f"{e} ({key})", RuntimeWarning, stacklevel=3)


def _patch_allocator_settings(torch, lib):
    """Says so, once per setting, when PyTorch's allocator settings are given
    under gpumem: in PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF at use(),
    or through torch.cuda.memory._set_allocator_settings (which still passes
    them on: PyTorch's getters read them)."""
    followed = False
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):  # PyTorch's order: the first set wins
        if os.environ.get(var):
            _settings_ignored(os.environ[var], var)
            if not followed:
                _follow_settings(os.environ[var], lib)
                followed = True
    mem = torch.cuda.memory
    # PyTorch's uncached mode, for tools that check each access against its
    # allocation (compute-sanitizer): gpumem's too (gpumem_set_caching).
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        lib.set_caching(False)
    enable = getattr(mem, "caching_allocator_enable", None)
    if enable is not None:
        def caching_allocator_enable(value=True):
            """PyTorch's switch for its CUDA allocator's cache: gpumem's
            cache too. While off, each allocation outside a graph's or
            MemPool's pool is the driver's own and its free goes straight
            back (patched by gpumem.torch)."""
            lib.set_caching(bool(value))
            return enable(value)

        _put((mem, torch.cuda), "caching_allocator_enable", caching_allocator_enable)
    orig = getattr(mem, "_set_allocator_settings", None)
    if orig is None:
        return

    def _set_allocator_settings(env):
        """PyTorch's allocator settings; those of its CUDA allocator have no
        effect under gpumem, which says so once each (patched by
        gpumem.torch)."""
        _settings_ignored(env, "torch.cuda.memory._set_allocator_settings")
        out = orig(env)  # PyTorch's checks first: a bad value is its error
        _follow_settings(env, lib)
        return out

    _put((mem,), "_set_allocator_settings", _set_allocator_settings)


def _nested(flat):
    """{"a.b.c": v} as {"a": {"b": {"c": v}}} (PyTorch's memoryStats)."""
    out = {}
    for key, value in flat.items():
        *path, last = key.split(".")
        d = out
        for part in path:
            d = d.setdefault(part, _torchmem.NestedStats())
        d[last] = value
    return out


def _patch_oom_observers(torch, lib):
    """torch._C._cuda_attach_out_of_memory_observer (torch.cuda.memory.
    _attach_out_of_memory_observer): each observer is called as under
    PyTorch's allocator, observer(device, alloc_size, limit or device
    total, device_free), when an allocation runs out of memory, before
    the error is raised. An observer that raises is reported as a
    warning: the error raised stays the out-of-memory."""
    observers = []

    def on_oom(device, size, limit, free):
        for obs in list(observers):
            try:
                obs(device, size, limit, free)
            except Exception as e:
                warnings.warn(f"gpumem: an out-of-memory observer raised {type(e).__name__}: {e}",
                              RuntimeWarning)

    callback = _lib.OOM_CALLBACK(on_oom)

    def make(orig):
        def attach(observer):
            with _lock:
                observers.append(observer)
                if len(observers) == 1:
                    _state["oom_callback"] = callback  # kept alive while set
                    lib.set_oom_callback(callback)
        return attach

    news = {}
    orig = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if orig is not None:
        news["_cuda_attach_out_of_memory_observer"] = make(orig)
        _replace_all(torch, news)


def _patch_history(torch, lib):
    """PyTorch's memory history and snapshots, answered by gpumem
    (_torchmem.History): _record_memory_history, _snapshot, _dump_snapshot,
    memory_snapshot and torch._C._cuda_isHistoryEnabled."""
    hist = _state["history"] = _torchmem.History(lib)
    mem = torch.cuda.memory

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                               device=None, clear_history=False, **kwargs):
        """Records gpumem's allocations and frees for _snapshot (patched by
        gpumem.torch)."""
        if _state.get("recording"):
            raise RuntimeError("gpumem: _record_memory_history while gpumem.torch.record() runs: "
                               "the two share the call-site hook; end the recording first")
        hist.record(enabled, context, stacks, max_entries, device, clear_history, **kwargs)

    def _augmented(snap, augment_with_fx_traces):
        # PyTorch's own pass (torch.cuda.memory imports it): frames in code
        # FX generated get the FX node they ran (fx_node_op, fx_node_name,
        # fx_original_trace). A PyTorch without it has no such option.
        if not augment_with_fx_traces:
            return snap
        fn = getattr(getattr(torch.cuda, "memory", None), "_augment_memory_snapshot_stack_traces", None)
        if fn is None:
            raise TypeError("gpumem: this PyTorch's _snapshot has no augment_with_fx_traces")
        return fn(snap)

    def _snapshot(device=None, augment_with_fx_traces=False):
        """gpumem's segments and history in PyTorch's snapshot format
        (patched by gpumem.torch)."""
        return _augmented(hist.snapshot(device), augment_with_fx_traces)

    def _dump_snapshot(filename="dump_snapshot.pickle", augment_with_fx_traces=False):
        """Pickles _snapshot() to filename (patched by gpumem.torch)."""
        import pickle
        with open(filename, "wb") as f:
            pickle.dump(_augmented(hist.snapshot(), augment_with_fx_traces), f)

    def memory_snapshot(mempool_id=None, *args, **kwargs):
        """gpumem's segments in PyTorch's format, or those of the pool
        mempool_id (a MemPool's id) alone (patched by gpumem.torch)."""
        segments = hist.snapshot()["segments"]
        if mempool_id is None:
            return segments
        want = tuple(_pool_id(mempool_id))
        return [seg for seg in segments if tuple(seg["segment_pool_id"]) == want]

    def _set_memory_metadata(metadata):
        """Text the history's entries from now on carry as user_metadata
        (patched by gpumem.torch)."""
        hist.set_metadata(metadata)

    def _get_memory_metadata():
        """The text _set_memory_metadata set (patched by gpumem.torch)."""
        return hist.get_metadata()

    news = {}
    if hasattr(torch._C, "_cuda_setMemoryMetadata"):
        news["_cuda_setMemoryMetadata"] = lambda metadata: hist.set_metadata(metadata)
    if hasattr(torch._C, "_cuda_getMemoryMetadata"):
        news["_cuda_getMemoryMetadata"] = lambda: hist.get_metadata()
    _replace_all(torch, news)

    for name, fn in (("_record_memory_history", _record_memory_history), ("_snapshot", _snapshot),
                     ("_dump_snapshot", _dump_snapshot), ("memory_snapshot", memory_snapshot),
                     ("_set_memory_metadata", _set_memory_metadata),
                     ("_get_memory_metadata", _get_memory_metadata)):
        _put((mem, torch.cuda), name, fn)
    if hasattr(torch._C, "_cuda_isHistoryEnabled"):
        _patched[("torch._C", "_cuda_isHistoryEnabled")] = torch._C._cuda_isHistoryEnabled
        torch._C._cuda_isHistoryEnabled = lambda *a, **k: bool(hist.on)


# --- CUDA graphs -------------------------------------------------------------
#
# A CUDA graph's replays write, at the addresses the capture got, the memory
# its capture allocated, for as long as the graph lives. PyTorch's own
# allocator routes the allocations of a capture into the graph's private
# pool (beginAllocateToPool/endAllocateToPool) and keeps that pool from
# every other allocation until the graph is reset or deleted (releasePool);
# CUDAPluggableAllocator drops these calls. So they are made here, at the
# Python entry points that lead to them, against gpumem's private pools.

def _pool_id(pool):
    """(hi, lo) of a pool as PyTorch names it: a MempoolId_t tuple
    (torch.cuda.graph_pool_handle(), CUDAGraph.pool()) or a MemPool (.id)."""
    pid = getattr(pool, "id", pool)
    if callable(pid):
        pid = pid()
    hi, lo = pid
    return int(hi), int(lo)


class _GraphPools:
    """gpumem's side of one CUDA graph: the route its capture opened and the
    pool uses it holds. It holds no reference to the graph, so that the
    weakref.finalize set on the graph fires when the graph is collected."""

    __slots__ = ("lib", "route", "held")

    def __init__(self, lib):
        self.lib = lib
        self.route = None  # (device, pool) while the capture's route is open
        self.held = []     # [(device, pool)]: uses to give back (reset, collection)

    def begin(self, device, pool, stream):
        self.lib.pool_begin(device, pool, stream, _lib.POOL_CAPTURE)
        self.route = (device, pool)
        self.held.append((device, pool))

    def end(self):
        route, self.route = self.route, None
        if route is not None:
            self.lib.pool_end(*route)

    def release(self):
        held, self.held = self.held, []
        failed = None
        for device, pool in held:
            try:
                self.lib.pool_release(device, pool)
            except Exception as e:
                failed = failed or e
        if failed is not None:
            raise failed

    def collected(self):
        """The graph was collected (its C++ destructor resets it without
        calling Python): give its uses back. Runs in the garbage collector,
        so it warns rather than raises."""
        for step in (self.end, self.release):
            try:
                step()
            except Exception as e:
                warnings.warn(f"gpumem: giving back a collected CUDA graph's pool: {e}", RuntimeWarning)


_graph_states = weakref.WeakKeyDictionary()  # for graphs that take no attribute


def _graph_pools(graph, lib=None):
    """graph's _GraphPools; with lib, made (and set to be given back when the
    graph is collected) if it has none yet."""
    st = getattr(graph, "_gpumem_pools", None)
    if st is None:
        st = _graph_states.get(graph)
    if st is None and lib is not None:
        st = _GraphPools(lib)
        try:
            graph._gpumem_pools = st
        except AttributeError:
            _graph_states[graph] = st
        weakref.finalize(graph, st.collected).atexit = False
    return st


def _quietly(fn):
    try:
        fn()
    except Exception:
        pass


def _capture_pool(torch, args, kwargs):
    """capture_begin's arguments with the pool made explicit, and its (hi, lo).
    PyTorch's CUDAGraph.pool() answers only after the capture has ended
    (TORCH_CHECK(capture_ended_)), so when the caller names no pool, a fresh
    torch.cuda.graph_pool_handle() goes in its place: the graph's pool, known
    while the capture runs, serving this graph alone as the one PyTorch would
    have made."""
    args = list(args)
    pool = args[0] if args else kwargs.get("pool")
    if pool is None or _pool_id(pool) == (0, 0):
        pool = torch.cuda.graph_pool_handle()
        if args:
            args[0] = pool
        else:
            kwargs["pool"] = pool
    return tuple(args), kwargs, _pool_id(pool)


def _patch_graphs(torch, lib):
    graphs = getattr(torch.cuda, "graphs", None)
    cls = getattr(graphs, "CUDAGraph", None) or getattr(torch.cuda, "CUDAGraph", None)
    if cls is not None:
        _patch_graph_class(torch, lib, cls)
    _patch_pool_calls(torch, lib)
    _patch_mempool(torch, lib)


def _release_pool(lib, device, pool):
    # PyTorch's ~MemPool empties the pool's cache: its memory goes back now
    # if nothing else holds the pool. At the interpreter's exit (finalizers
    # of objects still alive) the device may be going away: the use only.
    try:
        (lib.pool_release if sys.is_finalizing() else lib.pool_drop)(device, pool)
    except Exception as e:  # in the garbage collector: warn, never raise
        warnings.warn(f"gpumem: giving back a collected MemPool's pool: {e}", RuntimeWarning)


def _patch_mempool(torch, lib):
    """torch.cuda.MemPool, which PyTorch cannot make for a pluggable
    allocator ("createOrIncrefPool"): gpumem's own, over a private pool.
    torch.cuda.use_mem_pool(pool) routes the calling thread's allocations to
    it through the pool calls patched above; the pool holds one use while
    the object lives; when the object is collected its memory goes back at
    once if nothing else holds the pool (PyTorch's ~MemPool empties the
    pool's cache), else once freeable, at the next empty_cache. Options gpumem does not have (another allocator,
    use_on_oom, no_split) are gpumem's too: the pool's segments come from
    that allocator's functions (their addresses kept when the allocator was
    made, _patch_custom_allocator), an allocation outside every pool that
    would run out of memory is served from a use_on_oom pool, and a
    no_split pool gives each buffer a segment of its own. The arguments
    are bound as the installed PyTorch's MemPool binds them (an argument
    it does not take is its TypeError); one it takes that gpumem does not
    have (a later version's symmetric memory, say) fails at once with one
    line."""
    orig = getattr(torch.cuda, "MemPool", None)
    if orig is None:
        return
    _patch_custom_allocator(torch)
    try:
        signature = inspect.signature(orig.__init__)
    except (TypeError, ValueError):
        signature = inspect.signature(lambda self, allocator=None, use_on_oom=False, no_split=False: None)
    known = {"self", "allocator", "use_on_oom", "no_split"}

    class MemPool:
        """A pool of memory of its own: allocations made inside
        torch.cuda.use_mem_pool(pool) come from it and its memory serves
        nothing else (gpumem.torch's, over a gpumem private pool)."""

        def __init__(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)  # PyTorch's TypeError for what it does not take
            given = bound.arguments
            other = [f"{k}={v!r}" for k, v in given.items()
                     if k not in known and v != signature.parameters[k].default]
            if other:
                raise RuntimeError(f"gpumem: torch.cuda.MemPool({', '.join(other)}) is not supported under "
                                   "gpumem.torch.use(); MemPool with an allocator, use_on_oom or no_split is, or "
                                   "use PyTorch's allocator for this program")
            allocator = given.get("allocator")
            use_on_oom, no_split = bool(given.get("use_on_oom")), bool(given.get("no_split"))
            fns = None
            if allocator is not None and allocator is not _state["allocator"].allocator():
                fns = _custom_allocators.get(id(allocator))
                if fns is None or fns[0] is not allocator:
                    raise RuntimeError("gpumem: torch.cuda.MemPool(allocator): gpumem does not know this allocator's "
                                       "functions; make it with torch.cuda.memory.CUDAPluggableAllocator after "
                                       "gpumem.torch.use()")
                if fns[1] == _own_function(lib, "gpumem_alloc"):
                    fns = None  # gpumem's own functions: a pool of gpumem's
            self._device = torch.cuda.current_device()
            self._id = _pool_id(torch.cuda.graph_pool_handle())  # unique among PyTorch's pool ids
            if fns is None and not use_on_oom and not no_split:
                lib.pool_retain(self._device, self._id)
            else:
                lib.pool_create(self._device, self._id, alloc=fns[1] if fns else 0, free=fns[2] if fns else 0,
                                no_split=no_split, use_on_oom=use_on_oom)
            self._allocator = allocator if fns else None
            weakref.finalize(self, _release_pool, lib, self._device, self._id)

        @property
        def id(self):
            """The pool's id, a pair of ints as PyTorch's."""
            return self._id

        @property
        def allocator(self):
            """The allocator given (its allocator() handle), or None: the
            pool is gpumem's."""
            return self._allocator

        def use_count(self):
            """How many uses hold the pool: this object, and each
            use_mem_pool block it is in."""
            return lib.pool_uses(self._device, self._id)

        def snapshot(self, include_traces=True):
            """The pool's segments in PyTorch's snapshot format."""
            segs = _state["history"].snapshot()["segments"]
            return [seg for seg in segs if tuple(seg["segment_pool_id"]) == self._id]

    _put((torch.cuda, getattr(torch.cuda, "memory", None)), "MemPool", MemPool)


def _own_function(lib, name):
    """The address of the library's own C function name (0 if unknown)."""
    import ctypes
    fn = getattr(getattr(lib, "c", None), name, None)
    return ctypes.cast(fn, ctypes.c_void_p).value if fn is not None else 0


# The functions of each CUDAPluggableAllocator made since use(): id of its
# handle -> (handle, alloc address, free address). The handle is kept
# alive here, so that an id is never reused for another.
_custom_allocators = {}


def _patch_custom_allocator(torch):
    """torch._C._cuda_customAllocator, which every CUDAPluggableAllocator
    calls with its functions' addresses, made to remember them: PyTorch's
    handle does not give them back, and a MemPool with that allocator
    needs them."""
    orig = getattr(torch._C, "_cuda_customAllocator", None)
    if orig is None or getattr(orig, "_gpumem", False):
        return

    def _cuda_customAllocator(alloc_fn, free_fn):
        handle = orig(alloc_fn, free_fn)
        _custom_allocators[id(handle)] = (handle, int(alloc_fn), int(free_fn))
        return handle

    _cuda_customAllocator._gpumem = True
    _cuda_customAllocator.__doc__ = orig.__doc__
    _patched[("torch._C", "_cuda_customAllocator")] = orig
    torch._C._cuda_customAllocator = _cuda_customAllocator


def _patch_graph_class(torch, lib, cls):
    """Wraps torch.cuda.CUDAGraph (the Python class; torch.cuda.graphs.CUDAGraph
    is the same): its capture routes to its pool, its reset and collection
    give its pool uses back."""
    where = f"{cls.__module__}.{cls.__qualname__}"
    originals = {}
    for name in ("capture_begin", "capture_end", "capture_end_pre", "reset"):
        fn = getattr(cls, name, None)
        if fn is not None:
            originals[name] = _patched[(where, name)] = fn

    begin, end, reset = originals.get("capture_begin"), originals.get("capture_end"), originals.get("reset")
    if begin is None or end is None:
        return

    def capture_begin(self, *args, **kwargs):
        args, kwargs, pool = _capture_pool(torch, args, kwargs)
        st = _graph_pools(self, lib)
        st.end()
        device = torch.cuda.current_device()
        # Held from before PyTorch begins the capture until its route is
        # open: a free on another thread in between records no event.
        lib.capture_hold(device)
        try:
            begin(self, *args, **kwargs)
            # The capture runs now on the current stream (PyTorch has begun
            # it): send its allocations, on whatever stream joins it, to the
            # pool.
            try:
                st.begin(device, pool, torch.cuda.current_stream(device).cuda_stream)
            except BaseException:
                _quietly(lambda: end(self))  # leave no stream capturing
                raise
        finally:
            lib.capture_release(device)

    def ending(orig):
        def capture_end(self, *args, **kwargs):
            st = _graph_pools(self)
            try:
                result = orig(self, *args, **kwargs)
            except BaseException:
                if st is not None:
                    _quietly(st.end)
                raise
            if st is not None:
                st.end()
            return result
        return capture_end

    def reset_graph(self, *args, **kwargs):
        # PyTorch's order: releasePool, then the graph and its exec are
        # destroyed. The release gives the memory back only once the pool's
        # buffers are all freed.
        st = _graph_pools(self)
        try:
            if st is not None:
                try:
                    st.end()
                finally:
                    st.release()
        finally:
            if reset is not None:
                reset(self, *args, **kwargs)

    capture_begin.__doc__ = getattr(begin, "__doc__", None)
    cls.capture_begin = capture_begin
    for name in ("capture_end", "capture_end_pre"):
        if name in originals:
            fn = ending(originals[name])
            fn.__name__ = fn.__qualname__ = name
            fn.__doc__ = getattr(originals[name], "__doc__", None)
            setattr(cls, name, fn)
    if reset is not None:
        reset_graph.__name__ = reset_graph.__qualname__ = "reset"
        reset_graph.__doc__ = getattr(reset, "__doc__", None)
        cls.reset = reset_graph


def _replace_all(torch, news):
    """Puts news[name] in the place of torch._C.<name> there and in every
    loaded module that holds it (from torch._C import <name>, under any
    name): torch.cuda.memory, for one."""
    olds = {}
    for name, new in news.items():
        orig = getattr(torch._C, name, None)
        if orig is not None:
            new.__name__ = new.__qualname__ = name
            olds[id(orig)] = (orig, new)
    modules = [torch._C, getattr(torch.cuda, "memory", None), getattr(torch.cuda, "graphs", None)]
    modules += [m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)]
    seen = set()
    for module in modules:
        if module is None or id(module) in seen:
            continue
        seen.add(id(module))
        try:
            found = [(k, olds[id(v)]) for k, v in list(vars(module).items()) if id(v) in olds]
        except TypeError:
            continue
        for k, (orig, new) in found:
            if getattr(module, k, None) is orig:
                _patched[(getattr(module, "__name__", "?"), k)] = orig
                setattr(module, k, new)


def _patch_pool_calls(torch, lib):
    """torch._C's private-pool calls, made on gpumem's pools too. PyTorch's
    own (called first) do nothing under a pluggable allocator."""
    C = torch._C

    def dev(device):
        return torch.cuda._utils._get_device_index(device, optional=True)

    begun = {}  # device -> [pool]: routes begun here, for the old end(device)

    def began(device, pool):
        with _lock:
            begun.setdefault(device, []).append(pool)

    def ended(device, pool):
        """The pool of the route end(device, pool) ends: pool, or, for the
        old one-argument end, the latest begun on device."""
        with _lock:
            stack = begun.get(device, [])
            if pool is None:
                return stack.pop() if stack else None
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] == pool:
                    del stack[i]
                    break
            return pool

    news = {}

    def patch(name, make):
        orig = getattr(C, name, None)
        if orig is not None:
            news[name] = make(orig)

    def beginning(route):
        def make(orig):
            def begin(device, mempool_id):
                orig(device, mempool_id)
                d, pool = dev(device), _pool_id(mempool_id)
                lib.pool_begin(d, pool, 0, route)
                began(d, pool)
            return begin
        return make

    # PyTorch's filters: the calling thread; every allocation ([](cudaStream_t) { return true; }).
    patch("_cuda_beginAllocateCurrentThreadToPool", beginning(_lib.POOL_THREAD))
    patch("_cuda_beginAllocateToPool", beginning(_lib.POOL_ALL))

    def stream_begin(orig):
        # Older PyTorch: allocations on the current stream. gpumem routes by
        # capture, which holds the stream, when it captures, else by thread.
        def begin(device, mempool_id):
            orig(device, mempool_id)
            d, pool = dev(device), _pool_id(mempool_id)
            capturing = d == torch.cuda.current_device() and torch.cuda.is_current_stream_capturing()
            if capturing:
                lib.pool_begin(d, pool, torch.cuda.current_stream(d).cuda_stream, _lib.POOL_CAPTURE)
            else:
                lib.pool_begin(d, pool, 0, _lib.POOL_THREAD)
            began(d, pool)
        return begin

    patch("_cuda_beginAllocateCurrentStreamToPool", stream_begin)

    def ending(orig):
        def end(device, mempool_id=None):
            if mempool_id is None:
                orig(device)
            else:
                orig(device, mempool_id)
            d = dev(device)
            pool = ended(d, None if mempool_id is None else _pool_id(mempool_id))
            if pool is not None:
                lib.pool_end(d, pool)
        return end

    patch("_cuda_endAllocateToPool", ending)
    patch("_cuda_endAllocateCurrentStreamToPool", ending)

    def releasing(orig):
        def release(device, mempool_id):
            orig(device, mempool_id)
            lib.pool_release(dev(device), _pool_id(mempool_id))
        return release

    patch("_cuda_releasePool", releasing)

    def checking(orig):
        # PyTorch's answer: whether the pool's allocated blocks are exactly these.
        def check(device, mempool_id, expected_live_allocations):
            live = lib.pool_live(dev(device), _pool_id(mempool_id))
            return live == {int(p) for p in expected_live_allocations}
        return check

    patch("_cuda_checkPoolLiveAllocations", checking)

    # Allocator checkpoints, for torch.compile's CUDA graph trees
    # (_checkpoint.py).
    cps = _checkpoint.Checkpoints(torch, lib, dev, _pool_id)

    def calling(method):
        def make(orig):
            def fn(*args, **kwargs):
                return method(*args, **kwargs)
            return fn
        return make

    patch("_cuda_getCheckpointState", calling(cps.get_state))
    patch("_cuda_setCheckpointPoolState", calling(cps.set_state))
    patch("_cuda_cudaCachingAllocator_raw_delete", calling(cps.raw_delete))
    patch("_free_And_Remove_DeleterFn", calling(cps.free_and_remove_deleter))
    patch("_has_Standard_Deleter", calling(cps.has_standard_deleter))
    _replace_all(torch, news)


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
