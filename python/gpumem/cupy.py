"""gpumem as CuPy's allocator.

    import gpumem.cupy
    gpumem.cupy.use(limit="20GiB")

Every CuPy allocation then comes from gpumem, on CuPy's current device and
stream; memory is freed when CuPy lets go of it. An allocation that runs
out of memory raises cupy.cuda.memory.OutOfMemoryError (a subclass of it
that carries gpumem's verdict as .verdict and in its message).

Stream capture (cupy.cuda.Stream.begin_capture ... end_capture, CUDA
graphs): what the capture allocates, on its stream or any stream that
joins it, comes from a private pool of its own, as PyTorch's graphs do.
A graph's launches write that memory, so it serves no other allocation
while the graph lives, and goes back (at the next trim, or before an
out-of-memory) once the graph is collected. While a capture is underway,
gpumem makes no call that would break it.

CuPy's Graph takes no weak reference and no attribute, so gpumem cannot
be told when one is collected: it keeps a reference to each graph and,
when the program holds none any more, drops it and gives its pool back.
It looks at the next capture, at gpumem.trim(), and before an allocation
fails for want of memory.

CUDA IPC handles (cupy.cuda.runtime.ipcGetMemHandle) cannot name gpumem's
memory, which is virtual-memory mappings: the call fails at once with
gpumem's line saying so (_patch_ipc).
"""

import itertools
import sys
import threading

from . import _lib, configure

__all__ = ["use", "installed", "OutOfMemoryError"]

_state = {"installed": False, "previous": None}


class _Owner:
    """Frees a gpumem buffer when CuPy drops the memory that refers to it."""

    __slots__ = ("lib", "ptr", "device")

    def __init__(self, lib, ptr, device):
        self.lib, self.ptr, self.device = lib, ptr, device

    def __del__(self):
        try:
            self.lib.deallocate(self.ptr, self.device)
        except Exception as e:  # a finalizer must not raise
            import sys
            print(f"gpumem: freeing {self.ptr:#x} on device {self.device}: {e}", file=sys.stderr)


def _oom_class():
    import cupy

    class OutOfMemoryError(cupy.cuda.memory.OutOfMemoryError):
        """CuPy's OutOfMemoryError with gpumem's verdict."""

        def __init__(self, size, verdict, message):
            limit = verdict.limit if verdict else 0
            super().__init__(size, verdict.allocated if verdict else -1, limit)
            self.verdict = verdict
            self.args = (message,)

        def __str__(self):
            return self.args[0]

    return OutOfMemoryError


OutOfMemoryError = None  # set by use(): a subclass of cupy.cuda.memory.OutOfMemoryError


def installed():
    """Whether gpumem is CuPy's allocator."""
    return _state["installed"]


def use(limit=None, *, config=None):
    """Makes gpumem CuPy's allocator (cupy.cuda.set_allocator). limit and
    config are as in gpumem.torch.use. Memory CuPy allocated before stays
    with CuPy's pool."""
    global OutOfMemoryError
    import cupy

    lib = _lib.load()
    configure(config, limit=limit)
    if OutOfMemoryError is None:
        OutOfMemoryError = _oom_class()
    memory = cupy.cuda.memory

    def malloc(size):
        device = cupy.cuda.runtime.getDevice()
        if size == 0:
            return memory.MemoryPointer(memory.UnownedMemory(0, 0, None, device), 0)
        stream = cupy.cuda.get_current_stream().ptr
        try:
            ptr = lib.allocate(size, device, stream)
        except _lib.OutOfMemoryError as e:
            if not _release_unused_graphs():
                raise OutOfMemoryError(size, e.verdict, str(e)) from None
            try:  # the pools of graphs the program dropped went back: once more
                ptr = lib.allocate(size, device, stream)
            except _lib.OutOfMemoryError as e2:
                raise OutOfMemoryError(size, e2.verdict, str(e2)) from None
        mem = memory.UnownedMemory(ptr, size, _Owner(lib, ptr, device), device)
        return memory.MemoryPointer(mem, 0)

    if not _state["installed"]:
        _state["previous"] = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(malloc)
    _patch_capture(cupy, lib)
    _patch_ipc(cupy)
    _state["installed"] = True


def _patch_ipc(cupy):
    """CUDA IPC handles (cudaIpcGetMemHandle) name cudaMalloc allocations
    only; gpumem's memory is virtual-memory mappings, which the runtime
    refuses with a bare "invalid argument". The refusal becomes one line
    saying why and what works instead. Where the call succeeds (memory not
    from gpumem) nothing changes."""
    rt = cupy.cuda.runtime
    get = getattr(rt, "ipcGetMemHandle", None)
    if get is None or getattr(get, "_gpumem", False):
        return

    def ipcGetMemHandle(devPtr):
        try:
            return get(devPtr)
        except rt.CUDARuntimeError as e:
            raise RuntimeError(
                f"gpumem: cudaIpcGetMemHandle({devPtr:#x}) failed ({e}): CUDA IPC handles cannot name "
                "memory that gpumem allocated (virtual-memory mappings, as PyTorch's expandable segments); "
                "share CUDA memory between processes through torch.multiprocessing under gpumem.torch, "
                "or allocate what you share with IPC handles before gpumem.cupy.use()") from e

    ipcGetMemHandle._gpumem = True
    ipcGetMemHandle.__wrapped__ = get
    try:
        rt.ipcGetMemHandle = ipcGetMemHandle
    except (AttributeError, TypeError):
        pass  # a module that refuses: CuPy's own error stays, nothing else changes


# Pool ids for CuPy's captures: a space of their own (PyTorch's are
# (0, n) and (n, 0)).
_CUPY_POOLS = 0xC0B1 << 48
_pool_ids = itertools.count(1)
_capturing = {}  # stream pointer -> (device, pool): routes open
_graphs = []     # [graph, lib, device, pool]: graphs whose pools are held
_capture_lock = threading.Lock()


def _refs_alone():
    """What sys.getrefcount says, read as _release_unused_graphs reads it,
    of an object only a list entry refers to (the interpreter's own count
    of the argument included or not)."""
    entry = [object()]
    return sys.getrefcount(entry[0])


_ALONE = _refs_alone()


def _release_unused_graphs():
    """Drops the graphs only _graphs refers to and gives their pools back
    (gpumem frees a pool's memory at the next trim, or before an
    out-of-memory). Reports whether any went."""
    with _capture_lock:
        done = [g for g in _graphs if sys.getrefcount(g[0]) <= _ALONE]
        for g in done:
            _graphs.remove(g)
    for graph, lib, device, pool in done:
        del graph
        try:
            lib.pool_release(device, pool)
        except Exception as e:
            print(f"gpumem: giving back a CuPy graph's pool: {e}", file=sys.stderr)
    return bool(done)


def _patch_capture(cupy, lib):
    """Wraps cupy.cuda.Stream's begin_capture and end_capture (once)."""
    cls = cupy.cuda.Stream
    if getattr(cls, "_gpumem_capture", False):
        return
    begin, end = cls.begin_capture, cls.end_capture

    def begin_capture(self, *args, **kwargs):
        _release_unused_graphs()
        device = cupy.cuda.runtime.getDevice()
        pool = (_CUPY_POOLS, next(_pool_ids))
        # Held from before the capture begins until its route is open: a
        # free on another thread in between records no event.
        lib.capture_hold(device)
        try:
            begin(self, *args, **kwargs)
            try:
                lib.pool_begin(device, pool, self.ptr, _lib.POOL_CAPTURE)
            except BaseException:
                try:
                    end(self)  # leave no stream capturing
                finally:
                    raise
        finally:
            lib.capture_release(device)
        with _capture_lock:
            _capturing[self.ptr] = (device, pool)

    def end_capture(self, *args, **kwargs):
        with _capture_lock:
            device, pool = _capturing.pop(self.ptr, (None, None))
        try:
            graph = end(self, *args, **kwargs)
        finally:
            if pool is not None:
                lib.pool_end(device, pool)
        if pool is not None:
            with _capture_lock:
                _graphs.append([graph, lib, device, pool])
        return graph

    begin_capture.__doc__ = getattr(begin, "__doc__", None)
    end_capture.__doc__ = getattr(end, "__doc__", None)
    cls.begin_capture, cls.end_capture = begin_capture, end_capture
    cls._gpumem_capture = True
    from . import _before_trim
    _before_trim.append(_release_unused_graphs)


def restore():
    """Gives CuPy its previous allocator back (gpumem's buffers still in use
    stay valid until CuPy frees them)."""
    import cupy
    if _state["installed"]:
        cupy.cuda.set_allocator(_state["previous"])
        _state["installed"] = False
