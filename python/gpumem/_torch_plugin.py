"""gpumem.torch's plug-in wiring: once use() has made gpumem PyTorch's
allocator through CUDAPluggableAllocator, _patch puts gpumem's answers in
the places of what PyTorch does not pass to a pluggable allocator:
torch.cuda's and torch.accelerator's memory functions (and torch._C's
behind them), Tensor.record_stream, PyTorch's allocator settings and
out-of-memory observers; then the graphs (_torch_graphs.py) and the
history (_torch_history.py)."""

import os
import warnings

from . import _lib, _torchmem
from ._torch_graphs import _patch_graphs
from ._torch_history import _patch_history
from ._torch_state import _device, _lock, _patched, _put, _replace_all, _state


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

    # These four read gpumem's counts (lib.usage), as PyTorch's read its
    # counters: programs ask them at every step or layer.
    def memory_allocated(device=None):
        return lib.usage(_device(device)).active

    def max_memory_allocated(device=None):
        return lib.usage(_device(device)).peak_active

    def memory_reserved(device=None):
        return lib.usage(_device(device)).reserved

    def max_memory_reserved(device=None):
        return lib.usage(_device(device)).peak_reserved

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
