"""ctypes binding of libgpumem (gpumem.h): the one place that knows the C
interface. The rest of the package calls Library's methods, which raise
GpumemError (or OutOfMemoryError) with the library's message."""

import ctypes
import os
import threading

API_VERSION = 1

# Status codes (gpumem.h).
SUCCESS = 0
ERROR_OUT_OF_MEMORY = 1
ERROR_INVALID_VALUE = 2
ERROR_INVALID_POINTER = 3
ERROR_NO_DRIVER = 4
ERROR_DEVICE = 5
ERROR_CONFIG = 6
ERROR_CLOSED = 7
ERROR_BUFFER_TOO_SMALL = 8
ERROR_INTERNAL = 9
ERROR_IO = 10
ERROR_FORMAT = 11
ERROR_NOT_SHAREABLE = 12

OOM_CAUSES = {0: "none", 1: "device", 2: "limit", 3: "fragmentation"}
ANSWERS = {0: "unknown", 1: "no", 2: "yes", 3: "n/a"}  # GPUMEM_ANSWER_*
MODES = {1: "plain", 2: "virtual"}  # GPUMEM_MODE_*

# Routes of a private pool (gpumem.h's GPUMEM_POOL_*): which allocations
# pool_begin sends to the pool.
POOL_CAPTURE = 0  # those on any stream of the capture the given stream is in
POOL_THREAD = 1   # those made by the calling thread
POOL_ALL = 2      # every one on the device


class GpumemError(RuntimeError):
    """A failed gpumem call: status is the code of gpumem.h, the message the
    library's one-line description."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class OutOfMemory:
    """gpumem's verdict on an out-of-memory (gpumem.h's gpumem_oom).

    cause is "limit", "device" or "fragmentation"; the sizes are bytes, read
    after gpumem gave its cache back and retried once. What would have fit:
    would_fit, the largest request that would have succeeded (free_total is
    what is free in all pieces); after_trim, whether it would fit after
    gpumem.trim() / torch.cuda.empty_cache() gave releasable back; and
    with_virtual, whether mode=virtual would have placed it ("n/a" when it
    is the mode already: pinned and pinned_in_chunks say what blocks it).
    The answers are "yes", "no", "n/a" or "unknown" (a library older than
    these fields). others is device memory held by other processes: not
    gpumem's to give back. message is the verdict in one paragraph."""

    __slots__ = ("cause", "device", "requested", "stream", "limit", "device_free",
                 "reserved", "allocated", "cached", "largest_free", "would_fit",
                 "total", "others", "active", "releasable", "pinned", "pinned_in_chunks",
                 "growth", "free_total", "after_trim", "with_virtual", "mode", "message")
    _numbers = __slots__[1:19]

    def __init__(self, raw, message):
        self.cause = OOM_CAUSES.get(raw.cause, str(raw.cause))
        for name in self._numbers:
            setattr(self, name, int(getattr(raw, name)))
        self.after_trim = ANSWERS.get(raw.after_trim, str(raw.after_trim))
        self.with_virtual = ANSWERS.get(raw.with_virtual, str(raw.with_virtual))
        self.mode = MODES.get(raw.mode, str(raw.mode))
        self.message = message

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self):
        return f"OutOfMemory({self.as_dict()!r})"


class OutOfMemoryError(GpumemError, MemoryError):
    """A gpumem allocation that ran out of memory; .verdict is the
    OutOfMemory with the numbers."""

    def __init__(self, status, message, verdict):
        super().__init__(status, message)
        self.verdict = verdict


class _Oom(ctypes.Structure):
    _fields_ = [("cause", ctypes.c_int), ("device", ctypes.c_int)] + [
        (name, ctypes.c_uint64) for name in OutOfMemory._numbers[1:]] + [
        (name, ctypes.c_int) for name in ("after_trim", "with_virtual", "mode", "reserved_0")]


class _PoolOptions(ctypes.Structure):
    """gpumem_pool_options."""
    _fields_ = [("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p), ("no_split", ctypes.c_int),
                ("use_on_oom", ctypes.c_int)]


class Stats(ctypes.Structure):
    """gpumem_stats: gauges (bytes now, with peaks) and counters."""
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("allocated", "peak_allocated", "active", "peak_active", "reserved",
                 "peak_reserved", "cached", "releasable", "largest_free")] + [
        ("fragmentation", ctypes.c_double)] + [
        (name, ctypes.c_uint64) for name in
        ("live_buffers", "allocs", "frees", "device_calls", "ooms", "trims", "limit",
         "splits", "copies", "copied_bytes", "split_ns",
         # later versions (an older library leaves them 0)
         "alloc_bytes", "free_bytes", "alloc_requested", "free_requested",
         "segments", "retries", "device_allocs", "device_frees", "pool_reserved",
         "peak_live_buffers", "peak_segments", "fences", "gate_refusals",
         "driver_ns", "wait_ns", "misses", "miss_ns",
         "create_ns", "map_ns", "set_access_ns", "unmap_ns", "release_ns",
         "event_calls", "event_ns", "mark_calls", "mark_ns")]

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_}


class Usage(ctypes.Structure):
    """gpumem_usage: the byte gauges of Stats and their peaks, read from
    counts (gpumem_get_usage), without the walks of segments and free
    blocks that gpumem_get_stats makes for its other fields."""
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("allocated", "peak_allocated", "active", "peak_active", "reserved", "peak_reserved")]


SITE_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_int)
# gpumem_set_oom_callback's fn: device, request, limit (or the device's
# memory), the driver's free memory.
OOM_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64)

_u64 = ctypes.c_uint64
_status = ctypes.c_int
_PROTOTYPES = {
    "gpumem_alloc": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "gpumem_free": (None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "gpumem_allocate": (_status, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "gpumem_deallocate": (_status, [ctypes.c_void_p, ctypes.c_int]),
    "gpumem_record_stream": (_status, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
    "gpumem_configure": (_status, [ctypes.c_char_p]),
    "gpumem_set_limit": (_status, [ctypes.c_int, _u64]),
    "gpumem_set_memory_fraction": (_status, [ctypes.c_int, ctypes.c_double]),
    "gpumem_trim": (_status, [ctypes.c_int]),
    "gpumem_reset_peaks": (_status, [ctypes.c_int]),
    "gpumem_get_stats": (_status, [ctypes.c_int, ctypes.POINTER(Stats), ctypes.c_size_t]),
    "gpumem_mem_info": (_status, [ctypes.c_int, ctypes.POINTER(_u64), ctypes.POINTER(_u64)]),
    "gpumem_snapshot_json": (ctypes.c_void_p, [ctypes.c_int]),
    "gpumem_stats_json": (ctypes.c_void_p, [ctypes.c_int]),
    "gpumem_string_free": (None, [ctypes.c_void_p]),
    "gpumem_record_start": (_status, [ctypes.c_int, ctypes.c_char_p]),
    "gpumem_record_stop": (_status, [ctypes.c_int]),
    "gpumem_record_site": (_status, [ctypes.c_int, ctypes.c_uint32, ctypes.c_char_p]),
    "gpumem_set_site_callback": (_status, [SITE_CALLBACK]),
    "gpumem_last_error": (ctypes.c_char_p, []),
    "gpumem_last_status": (_status, []),
    "gpumem_last_oom": (_status, [ctypes.POINTER(_Oom), ctypes.c_size_t]),
    "gpumem_status_name": (ctypes.c_char_p, [_status]),
    "gpumem_torch_errors": (_status, [ctypes.c_char_p, ctypes.c_char_p]),
    "gpumem_version": (ctypes.c_char_p, []),
    "gpumem_api_version": (ctypes.c_int, []),
}
_PROTOTYPES["gpumem_serve"] = (ctypes.c_void_p, [ctypes.c_char_p])
_PROTOTYPES["gpumem_import_snapshot"] = (_status, [ctypes.c_char_p, ctypes.c_char_p])
_OPTIONAL = {  # functions of later versions, bound when present
    "gpumem_get_usage": (_status, [ctypes.c_int, ctypes.POINTER(Usage), ctypes.c_size_t]),
    "gpumem_share": (_status, [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_u64), ctypes.POINTER(ctypes.c_int),
                               ctypes.POINTER(_u64), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "gpumem_unshare": (_status, [ctypes.c_void_p, ctypes.c_int]),
    "gpumem_history": (_status, [ctypes.c_int, ctypes.c_int, ctypes.c_size_t]),
    "gpumem_torch_snapshot_json": (ctypes.c_void_p, [ctypes.c_int]),
    "gpumem_pool_begin": (_status, [ctypes.c_int, _u64, _u64, ctypes.c_void_p, ctypes.c_int]),
    "gpumem_pool_end": (_status, [ctypes.c_int, _u64, _u64]),
    "gpumem_pool_release": (_status, [ctypes.c_int, _u64, _u64]),
    "gpumem_pool_retain": (_status, [ctypes.c_int, _u64, _u64]),
    "gpumem_pool_uses": (_status, [ctypes.c_int, _u64, _u64, ctypes.POINTER(_u64)]),
    "gpumem_pool_create": (_status, [ctypes.c_int, _u64, _u64, ctypes.c_void_p]),
    "gpumem_pool_drop": (_status, [ctypes.c_int, _u64, _u64]),
    "gpumem_set_free_sites": (_status, [ctypes.c_int]),
    "gpumem_set_caching": (_status, [ctypes.c_int]),
    "gpumem_set_capture_reuse": (_status, [ctypes.c_int]),
    "gpumem_pool_live": (_status, [ctypes.c_int, _u64, _u64, ctypes.POINTER(_u64), ctypes.c_size_t,
                                   ctypes.POINTER(ctypes.c_size_t)]),
    "gpumem_pool_checkpoint": (_status, [ctypes.c_int, _u64, _u64, ctypes.c_void_p, ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_size_t)]),
    "gpumem_pool_restore": (_status, [ctypes.c_int, _u64, _u64, ctypes.c_void_p, ctypes.c_size_t]),
    "gpumem_torch_delete": (None, [ctypes.c_void_p]),
    "gpumem_set_oom_callback": (_status, [OOM_CALLBACK]),
    "gpumem_torch_cache_info": (_status, [ctypes.c_char_p]),
    "gpumem_torch_cpp_history": (_status, [ctypes.c_char_p]),
    "gpumem_capture_hold": (_status, [ctypes.c_int]),
    "gpumem_capture_release": (_status, [ctypes.c_int]),
}

LIBRARY_NAME = "libgpumem.so"


def _candidates():
    env = os.environ.get("GPUMEM_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, LIBRARY_NAME),
            # A checkout: python/gpumem/ beside build/.
            os.path.join(here, os.pardir, os.pardir, "build", LIBRARY_NAME)]


class Library:
    """The loaded libgpumem. Methods mirror gpumem.h, raise GpumemError on a
    failed status, and take and return Python ints."""

    def __init__(self, path):
        self.path = path
        try:
            self._c = ctypes.CDLL(path)
        except OSError as e:
            raise GpumemError(ERROR_NO_DRIVER, f"gpumem: cannot load {path}: {e}") from None
        missing = [n for n in _PROTOTYPES if not hasattr(self._c, n)]
        if missing:
            raise GpumemError(ERROR_CONFIG, f"gpumem: {path} is not a gpumem library of this version: "
                                            f"it lacks {', '.join(missing[:3])}")
        for name, (res, args) in list(_PROTOTYPES.items()) + list(_OPTIONAL.items()):
            if hasattr(self._c, name):
                fn = getattr(self._c, name)
                fn.restype, fn.argtypes = res, args
        version = self._c.gpumem_api_version()
        if version != API_VERSION:
            raise GpumemError(ERROR_CONFIG, f"gpumem: {path} implements interface version {version}, "
                                            f"this package needs {API_VERSION}: rebuild the library or reinstall the package")
        self.c = self._c

    # Errors.

    def last_error(self):
        return (self._c.gpumem_last_error() or b"").decode("utf-8", "replace")

    def last_oom(self):
        raw = _Oom()
        self._c.gpumem_last_oom(ctypes.byref(raw), ctypes.sizeof(raw))
        if raw.cause == 0:
            return None
        return OutOfMemory(raw, self.last_error())

    def error(self, status):
        msg = self.last_error()
        if status == ERROR_OUT_OF_MEMORY:
            return OutOfMemoryError(status, msg, self.last_oom())
        return GpumemError(status, msg)

    def check(self, status):
        if status != SUCCESS:
            raise self.error(status)

    def _optional(self, name, what):
        """The C function name of a later version, or one clear GpumemError
        when this library predates it."""
        try:
            return getattr(self._c, name)
        except AttributeError:
            raise GpumemError(ERROR_CONFIG, f"gpumem: {self.path} has no {name} ({what}): it is older "
                                            "than this package; rebuild it with scripts/lib.sh") from None

    # Calls.

    def version(self):
        return self._c.gpumem_version().decode()

    def configure(self, config):
        self.check(self._c.gpumem_configure(config.encode()))

    def allocate(self, size, device=0, stream=0):
        p = ctypes.c_void_p()
        self.check(self._c.gpumem_allocate(ctypes.byref(p), size, device, stream))
        return p.value or 0

    def deallocate(self, ptr, device=-1):
        self.check(self._c.gpumem_deallocate(ptr, device))

    def record_stream(self, ptr, device, stream):
        self.check(self._c.gpumem_record_stream(ptr, device, stream))

    def share(self, ptr, device=-1):
        """Exports the live buffer at ptr for another process (gpumem_share):
        (base, [(fd, size), ...]), the chunks to map back to back from base's
        place; the caller owns the descriptors and calls unshare once no
        other process maps the memory. GpumemError (ERROR_NOT_SHAREABLE)
        saying why where it cannot be shared."""
        fn = self._optional("gpumem_share", "sharing CUDA memory between processes")
        base, n, cap = _u64(), ctypes.c_size_t(), 16
        while True:
            fds, sizes = (ctypes.c_int * cap)(), (_u64 * cap)()
            status = fn(ptr, device, ctypes.byref(base), fds, sizes, cap, ctypes.byref(n))
            if status == ERROR_BUFFER_TOO_SMALL and n.value > cap:
                cap = n.value
                continue
            self.check(status)
            return base.value, [(fds[i], sizes[i]) for i in range(n.value)]

    def unshare(self, ptr, device=-1):
        self.check(self._optional("gpumem_unshare", "sharing CUDA memory between processes")(ptr, device))

    def set_limit(self, device, nbytes):
        self.check(self._c.gpumem_set_limit(device, nbytes))

    def set_memory_fraction(self, device, fraction):
        self.check(self._c.gpumem_set_memory_fraction(device, fraction))

    def trim(self, device=-1):
        self.check(self._c.gpumem_trim(device))

    def reset_peaks(self, device=-1):
        self.check(self._c.gpumem_reset_peaks(device))

    def stats(self, device=0):
        s = Stats()
        self.check(self._c.gpumem_get_stats(device, ctypes.byref(s), ctypes.sizeof(s)))
        return s

    def usage(self, device=0):
        """Stats' byte gauges and peaks alone (a Usage), read from counts:
        for code that asks often (torch.cuda.memory_allocated). From
        gpumem_get_stats where the library is older than
        gpumem_get_usage."""
        u = Usage()
        if not hasattr(self._c, "gpumem_get_usage"):
            s = self.stats(device)
            for name, _ in Usage._fields_:
                setattr(u, name, getattr(s, name))
            return u
        self.check(self._c.gpumem_get_usage(device, ctypes.byref(u), ctypes.sizeof(u)))
        return u

    def mem_info(self, device=0):
        free, total = _u64(), _u64()
        self.check(self._c.gpumem_mem_info(device, ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    def _json(self, fn, device):
        p = fn(device)
        if not p:
            raise self.error(self._c.gpumem_last_status())
        try:
            return ctypes.string_at(p).decode()
        finally:
            self._c.gpumem_string_free(p)

    def snapshot_json(self, device=0):
        return self._json(self._c.gpumem_snapshot_json, device)

    def stats_json(self, device=0):
        return self._json(self._c.gpumem_stats_json, device)

    def serve(self, addr):
        p = self._c.gpumem_serve(addr.encode())
        if not p:
            raise self.error(self._c.gpumem_last_status())
        try:
            return ctypes.string_at(p).decode()
        finally:
            self._c.gpumem_string_free(p)

    def record_start(self, device, path):
        self.check(self._c.gpumem_record_start(device, os.fsencode(path)))

    def record_stop(self, device):
        self.check(self._c.gpumem_record_stop(device))

    def record_site(self, device, site, text):
        self.check(self._c.gpumem_record_site(device, site, text.encode("utf-8", "replace")))

    def set_site_callback(self, callback):
        self.check(self._c.gpumem_set_site_callback(callback))

    def set_caching(self, on):
        """The cache on or off, every device (gpumem_set_caching)."""
        self.check(self._optional("gpumem_set_caching", "caching_allocator_enable")(1 if on else 0))

    def set_capture_reuse(self, on):
        """Reuse within a CUDA graph capture on or off, every device
        (gpumem_set_capture_reuse: PyTorch's graph_capture_record_stream_reuse)."""
        self.check(self._optional("gpumem_set_capture_reuse", "graph_capture_record_stream_reuse")(1 if on else 0))

    def set_free_sites(self, on):
        """Whether frees too ask the site callback for their call site
        (gpumem_set_free_sites); a library without it keeps frees silent."""
        fn = getattr(self._c, "gpumem_set_free_sites", None)
        if fn is not None:
            self.check(fn(1 if on else 0))

    # Private pools (CUDA graphs): pool is PyTorch's MempoolId_t, (hi, lo).

    def history(self, device, enabled, max_entries):
        """Turns device's memory history on (the latest max_entries
        allocations and frees) or off."""
        fn = self._optional("gpumem_history", "memory history")
        self.check(fn(device, 1 if enabled else 0, max_entries))

    def torch_snapshot_json(self, device=0):
        """device's memory in PyTorch's snapshot layout, as JSON."""
        return self._json(self._optional("gpumem_torch_snapshot_json", "snapshots in PyTorch's layout"), device)

    def pool_begin(self, device, pool, stream=0, route=POOL_CAPTURE):
        hi, lo = pool
        fn = self._optional("gpumem_pool_begin", "private pools for CUDA graphs")
        self.check(fn(device, hi, lo, stream or None, route))

    def capture_hold(self, device):
        """A capture is about to begin on device (gpumem_capture_hold)."""
        self.check(self._optional("gpumem_capture_hold", "capture holds")(device))

    def capture_release(self, device):
        self.check(self._optional("gpumem_capture_release", "capture holds")(device))

    def pool_end(self, device, pool):
        hi, lo = pool
        self.check(self._optional("gpumem_pool_end", "private pools for CUDA graphs")(device, hi, lo))

    def pool_release(self, device, pool):
        hi, lo = pool
        self.check(self._optional("gpumem_pool_release", "private pools for CUDA graphs")(device, hi, lo))

    def pool_retain(self, device, pool):
        """Counts one use of pool (a MemPool object's), making it if need be."""
        hi, lo = pool
        self.check(self._optional("gpumem_pool_retain", "torch.cuda.MemPool")(device, hi, lo))

    def pool_create(self, device, pool, alloc=0, free=0, no_split=False, use_on_oom=False):
        """Makes pool with options and counts one use of it (a MemPool with
        an allocator of its own, given as its functions' addresses, or
        no_split or use_on_oom): gpumem_pool_create."""
        hi, lo = pool
        opts = _PoolOptions(alloc or None, free or None, int(bool(no_split)), int(bool(use_on_oom)))
        self.check(self._optional("gpumem_pool_create", "torch.cuda.MemPool with options")(
            device, hi, lo, ctypes.byref(opts)))

    def pool_drop(self, device, pool):
        """Gives up the use of the object that made pool, now gone; its
        memory goes back now if nothing else holds it (gpumem_pool_drop)."""
        hi, lo = pool
        self.check(self._optional("gpumem_pool_drop", "torch.cuda.MemPool")(device, hi, lo))

    def pool_uses(self, device, pool):
        """How many uses pool has (0 for an unknown pool)."""
        hi, lo = pool
        n = _u64()
        self.check(self._optional("gpumem_pool_uses", "torch.cuda.MemPool")(device, hi, lo, ctypes.byref(n)))
        return n.value

    def pool_live(self, device, pool):
        """The addresses of the pool's live buffers, as a set of ints (empty
        for an unknown pool)."""
        hi, lo = pool
        fn = self._optional("gpumem_pool_live", "private pools for CUDA graphs")
        n, cap = ctypes.c_size_t(), 64
        while True:
            ptrs = (_u64 * cap)()
            status = fn(device, hi, lo, ptrs, cap, ctypes.byref(n))
            if status == ERROR_BUFFER_TOO_SMALL and n.value > cap:
                cap = n.value + 64  # room for buffers made meanwhile
                continue
            self.check(status)
            return set(ptrs[:n.value])

    def pool_checkpoint(self, device, pool):
        """The pool's live buffers as a checkpoint: a tuple of (ptr, size,
        stream) in address order."""
        hi, lo = pool
        fn = self._optional("gpumem_pool_checkpoint", "allocator checkpoints (torch.compile's CUDA graph trees)")
        n, cap = ctypes.c_size_t(), 64
        while True:
            words = (_u64 * (3 * cap))()
            status = fn(device, hi, lo, words, cap, ctypes.byref(n))
            if status == ERROR_BUFFER_TOO_SMALL and n.value > cap:
                cap = n.value + 64
                continue
            self.check(status)
            return tuple(tuple(words[3 * i:3 * i + 3]) for i in range(n.value))

    def pool_restore(self, device, pool, buffers):
        """Puts the pool back to a checkpoint (pool_checkpoint): frees its
        live buffers and makes each of buffers at its address."""
        hi, lo = pool
        fn = self._optional("gpumem_pool_restore", "allocator checkpoints (torch.compile's CUDA graph trees)")
        words = (_u64 * (3 * len(buffers)))(*[w for b in buffers for w in b])
        self.check(fn(device, hi, lo, words, len(buffers)))

    def torch_deleter(self):
        """The address of gpumem_torch_delete, a c10::DeleterFnPtr that frees
        the buffer its context points to."""
        fn = self._optional("gpumem_torch_delete", "allocator checkpoints (torch.compile's CUDA graph trees)")
        return ctypes.cast(fn, ctypes.c_void_p).value

    def set_oom_callback(self, callback):
        """Calls callback(device, size, limit, device_free) on each
        out-of-memory of gpumem_alloc, before it fails; OOM_CALLBACK() to
        remove. Keep a reference to callback while it is set."""
        self.check(self._optional("gpumem_set_oom_callback", "out-of-memory observers")(callback))

    def torch_cache_info(self, libtorch_cuda):
        """Answers PyTorch's C++ cacheInfo queries (cuDNN's benchmark) from
        gpumem; returns the status (the reason in last_error())."""
        return self._optional("gpumem_torch_cache_info", "cuDNN benchmark workspace queries")(os.fsencode(libtorch_cuda))

    def torch_cpp_history(self, libtorch_cuda):
        """gpumem's line for C++ memory history calls (gpumem_torch_cpp_history);
        a status, not raised: PyTorch's own message stays where it fails."""
        fn = getattr(self._c, "gpumem_torch_cpp_history", None)
        if fn is None:
            return ERROR_CONFIG
        return fn(os.fsencode(libtorch_cuda))

    def torch_errors(self, c10, c10_cuda):
        return self._c.gpumem_torch_errors(os.fsencode(c10), os.fsencode(c10_cuda))

    def import_snapshot(self, pickle_path, trace_path):
        self.check(self._c.gpumem_import_snapshot(os.fsencode(pickle_path), os.fsencode(trace_path)))


_lock = threading.Lock()
_loaded = None


def load():
    """Returns the process's Library, loading it on first use from
    $GPUMEM_LIBRARY, else beside this package, else a checkout's build/.
    Raises GpumemError with one clear line when none loads."""
    global _loaded
    with _lock:
        if _loaded is None:
            tried = []
            for path in _candidates():
                if os.path.exists(path):
                    _loaded = Library(os.path.abspath(path))
                    break
                tried.append(path)
            else:
                raise GpumemError(ERROR_NO_DRIVER, "gpumem: libgpumem.so not found (looked at "
                                  + ", ".join(os.path.normpath(p) for p in tried)
                                  + "); build it with scripts/lib.sh or set GPUMEM_LIBRARY")
        return _loaded
