"""CUDA tensors shared between processes under gpumem (torch.multiprocessing).

PyTorch's allocator shares a CUDA tensor through cudaIpcGetMemHandle, which
a pluggable allocator cannot answer: under gpumem, PyTorch raises
"CUDAPluggableAllocator does not yet support shareIPcHandle", and where a
queue's feeder thread pickles, nobody sees it and the receiver waits
forever. gpumem shares the way PyTorch's expandable segments do, which are
virtual-memory mappings like gpumem's: the physical chunks under the
tensor's storage go to the other process as POSIX file descriptors
(gpumem_share), passed by multiprocessing's own descriptor passing
(multiprocessing.reduction.DupFd), and the receiver maps them over an
address range of its own (cuMemImportFromShareableHandle, cuMemMap). The
receiver needs this package and the driver, not gpumem as its allocator.

Lifetime, as under PyTorch's allocator: the sender keeps the storage, so
that gpumem never reuses its memory, until every receiver has let its
tensor go. Each send takes a slot in a small file of counters shared with
the receivers (_Slots): -1 while the message is in flight, the receiver's
pid while it maps the memory, 0 once it has unmapped. The sender looks at
its slots at every send and in torch.cuda.ipc_collect(); a storage whose
slots are all 0, or name processes that have exited, is let go
(gpumem_unshare, then the storage). A message never received keeps its
storage, as under PyTorch.

Order: the sender records an interprocess event on its current stream as
it pickles the tensor, and the receiver's current stream waits for it; the
receiver synchronizes its context before it unmaps, so that none of its
work still reads the memory.

Where a tensor cannot be shared (its memory is not gpumem's, the cache was
off when it was made, the device cannot export), the pickling fails with
one line saying why. A multiprocessing.Queue pickles in a feeder thread,
where an error is printed and the receiver would wait forever, so
Queue.put (and JoinableQueue.put) exports the CUDA tensors it is handed (at
the top level or in a tuple, list or dict) at once, in the caller: the
error is raised there.
"""

import contextlib
import ctypes
import mmap
import os
import threading

from . import _lib

_lock = threading.RLock()
_state = {"installed": False, "torch_reduce": None, "torch_rebuild": None, "lib": None}
_exports = {}  # (device, storage data_ptr) -> _Export
_slots = None  # _Slots, made at the first send


class SharingError(RuntimeError):
    """A CUDA tensor that gpumem cannot hand to another process."""


# --- The sender ---------------------------------------------------------------


class _Export:
    """One storage shared: the storage itself (kept alive), its chunks'
    descriptors from gpumem_share (open until unshared), and the slots of
    the sends not yet let go, each with its event."""

    __slots__ = ("storage", "ptr", "device", "base", "chunks", "sends", "sent")

    def __init__(self, storage, ptr, device, base, chunks):
        self.storage, self.ptr, self.device, self.base, self.chunks = storage, ptr, device, base, chunks
        self.sends = []  # (_Slots, slot index, event)
        self.sent = False


class _Slots:
    """A file of int32 counters shared with the receivers (memfd), grown by
    replacing it: a receiver keeps the file it was given."""

    def __init__(self, n=4096):
        self.fd = os.memfd_create("gpumem-shared-tensors")
        os.ftruncate(self.fd, 4 * n)
        self.map = mmap.mmap(self.fd, 4 * n)
        self.words = (ctypes.c_int32 * n).from_buffer(self.map)
        self.free = list(range(n - 1, -1, -1))

    def take(self):
        i = self.free.pop()
        self.words[i] = -1
        return i

    def held(self, i):
        """Whether slot i's receiver may still map its memory."""
        v = self.words[i]
        if v == 0:
            return False
        if v < 0:
            return True  # in flight
        try:
            os.kill(v, 0)
        except ProcessLookupError:
            return False  # the receiver exited without unmapping: its mappings are gone
        except PermissionError:
            pass
        return True


def _library():
    if _state["lib"] is None:
        _state["lib"] = _lib.load()
    return _state["lib"]


def _export(storage, device):
    """The storage's _Export, made at its first share; raises SharingError
    saying why it cannot be shared."""
    ptr = storage.data_ptr()
    key = (device, ptr)
    with _lock:
        e = _exports.get(key)
        if e is not None and e.storage is not None:
            return e
        try:
            base, chunks = _library().share(ptr, device)
        except _lib.GpumemError as err:
            raise SharingError(
                f"gpumem: cannot share this CUDA tensor with another process: {err} "
                "(gpumem shares what it allocated while its cache is on; "
                "torch.cuda.ipc_collect() gives back what receivers have let go)") from None
        e = _Export(storage, ptr, device, base, chunks)
        _exports[key] = e
        return e


def collect(keep_unsent=False):
    """Lets go of every shared storage whose receivers have all let go
    (with keep_unsent, not those never sent yet: Queue.put exports before
    its feeder thread pickles). Returns how many were let go."""
    done = 0
    with _lock:
        for key, e in list(_exports.items()):
            if keep_unsent and not e.sends and not e.sent:
                continue
            keep = []
            for slots, i, ev in e.sends:
                if slots.held(i):
                    keep.append((slots, i, ev))
                else:
                    slots.free.append(i)  # a file replaced when full keeps its own
            e.sends = keep
            if keep:
                continue
            del _exports[key]
            for fd, _ in e.chunks:
                os.close(fd)
            try:
                _library().unshare(e.ptr, e.device)
            except Exception as err:  # the storage goes all the same; say so, fail nothing else
                import warnings
                warnings.warn(f"gpumem: letting go of a shared CUDA tensor at {e.ptr:#x}: {err}",
                              RuntimeWarning, stacklevel=2)
            e.storage = None  # the memory is gpumem's again once PyTorch frees it
            done += 1
    return done


def _is_shared_cuda(tensor):
    import torch
    return (tensor.device.type == "cuda" and tensor.layout == torch.strided and not tensor.is_nested)


def _reduce_tensor(tensor):
    """ForkingPickler's reducer for tensors: CUDA tensors through gpumem,
    the rest through PyTorch's own."""
    if not _is_shared_cuda(tensor):
        return _state["torch_reduce"](tensor)
    import torch
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, "
            "since autograd does not support crossing process boundaries.  "
            "If you just want to transfer the data, call detach() on the tensor "
            "before serializing (e.g., putting it on the queue).")
    from multiprocessing.reduction import DupFd

    global _slots
    device = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    meta = (type(tensor), tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset(),
            tensor.dtype, tensor.requires_grad)
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    if nbytes == 0 or storage.data_ptr() == 0:
        return (_rebuild_tensor, (meta, device, uuid, 0, 0, (), None, -1, None))
    with _lock:
        collect(keep_unsent=True)  # not what Queue.put exported for this very send
        e = _export(storage, device)
        if _slots is None or not _slots.free:
            _slots = _Slots()
        slots = _slots
        ev = torch.cuda.Event(interprocess=True)
        ev.record(torch.cuda.current_stream(device))
        # The descriptors first: a failure here (too many open files)
        # leaves no slot held, so the storage can still be let go.
        chunks = tuple((DupFd(fd), size) for fd, size in e.chunks)
        counter = DupFd(slots.fd)
        i = slots.take()
        e.sends.append((slots, i, ev))
        e.sent = True
    return (_rebuild_tensor, (meta, device, uuid, nbytes, e.ptr - e.base, chunks, counter, i, ev.ipc_handle()))


def _prepare(obj, depth=0):
    """Exports the CUDA tensors of obj (at the top, or one container down)
    now, in the caller: a tensor that cannot be shared fails here."""
    import torch
    if isinstance(obj, torch.Tensor):
        if _is_shared_cuda(obj) and obj.untyped_storage().nbytes() > 0:
            d = obj.device.index if obj.device.index is not None else torch.cuda.current_device()
            _export(obj.untyped_storage(), d)
    elif depth == 0 and isinstance(obj, (tuple, list)):
        for x in obj:
            _prepare(x, 1)
    elif depth == 0 and isinstance(obj, dict):
        for x in obj.values():
            _prepare(x, 1)


# --- The receiver ---------------------------------------------------------------


class _Driver:
    """The calls of libcuda a receiver makes, through ctypes."""

    _once = None

    @classmethod
    def get(cls):
        if cls._once is None:
            cls._once = cls()
        return cls._once

    def __init__(self):
        try:
            self.c = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise SharingError(f"gpumem: cannot map a shared CUDA tensor: libcuda.so.1: {err}") from None
        names = ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent_v2",
                 "cuCtxPopCurrent_v2", "cuCtxSynchronize", "cuMemAddressReserve", "cuMemAddressFree",
                 "cuMemImportFromShareableHandle", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                 "cuMemRelease", "cuGetErrorName"]
        self.f = {n: getattr(self.c, n) for n in names}
        self.f["cuDevicePrimaryCtxRelease"] = getattr(self.c, "cuDevicePrimaryCtxRelease_v2", None) or \
            getattr(self.c, "cuDevicePrimaryCtxRelease")
        for fn in self.f.values():
            fn.restype = ctypes.c_int
        self.f["cuMemImportFromShareableHandle"].argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p,
                                                             ctypes.c_int]
        self.f["cuMemAddressReserve"].argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_size_t,
                                                  ctypes.c_uint64, ctypes.c_uint64]
        self.f["cuMemAddressFree"].argtypes = [ctypes.c_uint64, ctypes.c_size_t]
        self.f["cuMemMap"].argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64,
                                       ctypes.c_uint64]
        self.f["cuMemSetAccess"].argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
        self.f["cuMemUnmap"].argtypes = [ctypes.c_uint64, ctypes.c_size_t]
        self.f["cuMemRelease"].argtypes = [ctypes.c_uint64]
        self.call("cuInit", 0)

    @contextlib.contextmanager
    def pushed(self, ctx):
        """ctx current on this thread while the block runs."""
        self.call("cuCtxPushCurrent_v2", ctx)
        try:
            yield
        finally:
            self.f["cuCtxPopCurrent_v2"](ctypes.byref(ctypes.c_void_p()))

    def call(self, name, *args):
        r = self.f[name](*args)
        if r != 0:
            self.call_failed(name, r)

    def call_failed(self, name, r):
        s = ctypes.c_char_p()
        self.f["cuGetErrorName"](r, ctypes.byref(s))
        raise SharingError(f"gpumem: cannot map a shared CUDA tensor: {name} failed: "
                           f"{(s.value or b'?').decode()} ({r})")


class _AccessDesc(ctypes.Structure):
    """CUmemAccessDesc: read-write from one device."""
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int), ("flags", ctypes.c_int)]


class _Mapping:
    """A sender's chunks mapped here; unmapped, and the sender's slot
    cleared, when the last tensor on them is freed (the storage's deleter
    drops the last reference)."""

    def __init__(self, device, fds, sizes, counter_fd, slot):
        self.device, self.total, self.slot = device, sum(sizes), slot
        self.handles, self.va, self.ctx = [], 0, None
        self.words = self.map = None
        try:
            self.map = mmap.mmap(counter_fd, 0)
            self.words = (ctypes.c_int32 * (len(self.map) // 4)).from_buffer(self.map)
            self.drv = drv = _Driver.get()
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            drv.call("cuDeviceGet", ctypes.byref(dev), device)
            drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
            self.dev, self.ctx = dev, ctx
            with self.drv.pushed(self.ctx):
                va = ctypes.c_uint64()
                drv.call("cuMemAddressReserve", ctypes.byref(va), self.total, 0, 0, 0)
                self.va = va.value
                at = self.va
                for fd, size in zip(fds, sizes):
                    h = ctypes.c_uint64()
                    drv.call("cuMemImportFromShareableHandle", ctypes.byref(h), ctypes.c_void_p(fd), 1)
                    self.handles.append([h.value, 0, size])
                    drv.call("cuMemMap", at, size, 0, h.value, 0)
                    self.handles[-1][1] = at
                    at += size
                desc = _AccessDesc(1, device, 3)  # CU_MEM_LOCATION_TYPE_DEVICE, PROT_READWRITE
                drv.call("cuMemSetAccess", self.va, self.total, ctypes.byref(desc), 1)
            self.words[slot] = os.getpid()
        except BaseException:
            self.close(sync=False)
            raise
        finally:
            for fd in list(fds) + [counter_fd]:
                os.close(fd)

    def close(self, sync=True):
        drv = getattr(self, "drv", None)
        try:
            if self.ctx is not None:
                with self.drv.pushed(self.ctx):
                    if sync and self.handles:
                        drv.f["cuCtxSynchronize"]()
                    for h, at, size in self.handles:
                        if at:
                            drv.f["cuMemUnmap"](at, size)
                        drv.f["cuMemRelease"](h)
                    if self.va:
                        drv.f["cuMemAddressFree"](self.va, self.total)
                drv.f["cuDevicePrimaryCtxRelease"](self.dev)
        finally:
            self.handles, self.va, self.ctx = [], 0, None
            if self.words is not None:
                self.words[self.slot] = 0
                self.words = None
            if self.map is not None:
                self.map.close()
                self.map = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _bytes_at(ptr, nbytes):
    """The CUDA array interface of nbytes bytes at ptr (version 2: no
    stream, so torch.as_tensor waits for nothing; the callers order the
    work with the sender's event)."""
    return {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}


class _Memory:
    """What torch.as_tensor wraps: the mapped bytes, as a CUDA array; the
    tensor's storage holds it, and with it the mapping."""

    def __init__(self, mapping, ptr, nbytes):
        self.mapping = mapping
        self.__cuda_array_interface__ = _bytes_at(ptr, nbytes)


def _local_device(index, uuid):
    import torch
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    return index


def _as_sent(t, cls, requires_grad):
    """t as the sender's tensor was: a Parameter if it was one, with its
    requires_grad (as PyTorch's rebuild_cuda_tensor)."""
    import torch
    if cls is torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _rebuild_tensor(meta, device, uuid, nbytes, offset, chunks, counter, slot, event):
    import torch
    cls, size, stride, storage_offset, dtype, requires_grad = meta
    device = _local_device(device, uuid)
    t = torch.empty((0,), dtype=dtype, device=f"cuda:{device}")
    if nbytes > 0:
        fds = []
        try:
            for d, _ in chunks:
                fds.append(d.detach())
            counter_fd = counter.detach()
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        mapping = _Mapping(device, fds, [s for _, s in chunks], counter_fd, slot)
        torch.cuda.Event.from_ipc_handle(device, event).wait(torch.cuda.current_stream(device))
        raw = torch.as_tensor(_Memory(mapping, mapping.va + offset, nbytes), device=f"cuda:{device}")
        t.set_(raw.untyped_storage(), storage_offset, size, stride)
    else:
        t.set_(t.untyped_storage(), storage_offset, size, stride)
    return _as_sent(t, cls, requires_grad)


# --- A receiver under gpumem of PyTorch's own IPC handles ---------------------


class _IpcHandle(ctypes.Structure):
    """CUipcMemHandle, passed by value."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


_opened = {}  # (device, handle bytes) -> weakref to _Opened: a handle opens once a process


class _Opened:
    """A cudaMalloc allocation of another process, opened here
    (cuIpcOpenMemHandle); closed when the last storage on it is freed."""

    def __init__(self, device, raw):
        drv = _Driver.get()
        self.drv, self.device, self.ptr, self.ctx = drv, device, 0, None
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        drv.call("cuDeviceGet", ctypes.byref(dev), device)
        drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.dev, self.ctx = dev, ctx
        fn = drv.c.cuIpcOpenMemHandle_v2
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        h = _IpcHandle.from_buffer_copy(raw)
        p = ctypes.c_uint64()
        try:
            with drv.pushed(ctx):
                r = fn(ctypes.byref(p), h, 1)  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
            if r != 0:
                drv.call_failed("cuIpcOpenMemHandle", r)
        except BaseException:
            drv.f["cuDevicePrimaryCtxRelease"](dev)
            self.ctx = None
            raise
        self.ptr = p.value

    def __del__(self):
        drv = self.drv
        if self.ctx is None:
            return
        try:
            with drv.pushed(self.ctx):
                drv.f["cuCtxSynchronize"]()
                drv.c.cuIpcCloseMemHandle(ctypes.c_uint64(self.ptr))
            drv.f["cuDevicePrimaryCtxRelease"](self.dev)
        except Exception:
            pass
        self.ctx = None


class _Received:
    """One storage of another process's allocation; tells the sender when it
    is freed (PyTorch's counter of the sent block)."""

    def __init__(self, opened, ptr, nbytes, counter, offset):
        self.opened, self.counter, self.offset = opened, counter, offset
        self.__cuda_array_interface__ = _bytes_at(ptr, nbytes)

    def __del__(self):
        try:
            import torch
            # As PyTorch's own deleter: this process's work on the memory
            # done before the sender may reuse it.
            torch.cuda.current_stream(self.opened.device).synchronize()
            if self.counter:
                torch.UntypedStorage._release_ipc_counter_cuda(self.counter, self.offset)
        except Exception:
            pass  # the sender has exited: nothing to tell


def _rebuild_torch_ipc(tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype, storage_device,
                       storage_handle, storage_size_bytes, storage_offset_bytes, requires_grad, ref_counter_handle,
                       ref_counter_offset, event_handle, event_sync_required):
    """torch.multiprocessing's rebuild_cuda_tensor in a process whose
    allocator is gpumem: PyTorch's own would ask the plug-in to open the
    handle, which it cannot (getIpcDevPtr)."""
    import weakref
    import torch
    if storage_handle is None or storage_size_bytes == 0:
        return _state["torch_rebuild"](tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype,
                                       storage_device, storage_handle, storage_size_bytes, storage_offset_bytes,
                                       requires_grad, ref_counter_handle, ref_counter_offset, event_handle,
                                       event_sync_required)
    raw = bytes(storage_handle)
    if len(raw) == 64:
        mem = raw
    elif len(raw) == 66 and raw[1:2] == b"c":
        mem = raw[2:]
    else:
        kind = "expandable segments" if raw[1:2] == b"e" else f"an unknown handle ({len(raw)} bytes)"
        raise SharingError("gpumem: cannot map a CUDA tensor shared by a process under PyTorch's " + kind +
                           "; share it from a process whose allocator is gpumem or PyTorch's default")
    with _lock:
        key = (storage_device, mem)
        ref = _opened.get(key)
        opened = ref() if ref is not None else None
        if opened is None:
            opened = _Opened(storage_device, mem)
            _opened[key] = weakref.ref(opened)
    if event_sync_required:
        torch.cuda.Event.from_ipc_handle(storage_device, event_handle).wait(torch.cuda.current_stream(storage_device))
    held = _Received(opened, opened.ptr + storage_offset_bytes, storage_size_bytes, ref_counter_handle,
                     ref_counter_offset)
    raw_t = torch.as_tensor(held, device=f"cuda:{storage_device}")
    t = torch.empty((0,), dtype=dtype, device=f"cuda:{storage_device}")
    t.set_(raw_t.untyped_storage(), tensor_offset, tensor_size, tensor_stride)
    return _as_sent(t, tensor_cls, requires_grad)


# --- Installing -----------------------------------------------------------------


def _exporting(put):
    """A queue's put that exports the CUDA tensors it is handed first, in
    the caller (_prepare)."""
    def put_exporting(self, obj, block=True, timeout=None):
        _prepare(obj)
        return put(self, obj, block, timeout)

    put_exporting.__wrapped__ = put
    return put_exporting


def install(torch, lib=None):
    """Makes torch.multiprocessing share CUDA tensors through gpumem (in a
    process where gpumem is PyTorch's allocator)."""
    import multiprocessing.queues
    from multiprocessing.reduction import ForkingPickler
    import torch.multiprocessing.reductions as reductions

    with _lock:
        if _state["installed"]:
            return
        if lib is not None:
            _state["lib"] = lib
        # A shared tensor holds a descriptor a chunk (16 MiB, 4 MiB near the
        # limit) while it is shared: the soft limit goes as far as the hard.
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            want = hard if hard != resource.RLIM_INFINITY else 1 << 20
            if soft != resource.RLIM_INFINITY and soft < want:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ImportError, ValueError, OSError):
            pass
        _state["torch_reduce"] = reductions.reduce_tensor
        for cls in (torch.Tensor, torch.nn.parameter.Parameter):
            ForkingPickler.register(cls, _reduce_tensor)
        # What PyTorch's allocator sends, opened here without asking the
        # plug-in (pickles name the function, so the module's is the one).
        _state["torch_rebuild"] = reductions.rebuild_cuda_tensor
        reductions.rebuild_cuda_tensor = _rebuild_torch_ipc

        # JoinableQueue has a put of its own, which does not call Queue's.
        for cls in (multiprocessing.queues.Queue, multiprocessing.queues.JoinableQueue):
            cls.put = _exporting(cls.__dict__["put"])

        ipc_collect = torch.cuda.ipc_collect

        def ipc_collect_gpumem():
            collect()
            return ipc_collect()

        torch.cuda.ipc_collect = ipc_collect_gpumem
        _state["installed"] = True
