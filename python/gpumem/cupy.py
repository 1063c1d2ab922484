"""gpumem as CuPy's allocator.

    import gpumem.cupy
    gpumem.cupy.use(limit="20GiB")

Every CuPy allocation then comes from gpumem, on CuPy's current device and
stream; memory is freed when CuPy lets go of it. An allocation that runs
out of memory raises cupy.cuda.memory.OutOfMemoryError (a subclass of it
that carries gpumem's verdict as .verdict and in its message).
"""

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
            raise OutOfMemoryError(size, e.verdict, str(e)) from None
        mem = memory.UnownedMemory(ptr, size, _Owner(lib, ptr, device), device)
        return memory.MemoryPointer(mem, 0)

    if not _state["installed"]:
        _state["previous"] = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(malloc)
    _state["installed"] = True


def restore():
    """Gives CuPy its previous allocator back (gpumem's buffers still in use
    stay valid until CuPy frees them)."""
    import cupy
    if _state["installed"]:
        cupy.cuda.set_allocator(_state["previous"])
        _state["installed"] = False
