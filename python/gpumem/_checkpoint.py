"""Allocator checkpoints for torch.compile(mode="reduce-overhead").

CUDA graph trees (torch/_inductor/cudagraph_trees.py) record graphs into
one private pool and replay them. A replay runs on the device only: the
allocator's books still describe the pool as it was after the recording
(or whatever the program freed since). Before recording a new graph after
a replay, the trees put the books back to a checkpoint taken right after
the recording (torch._C._cuda_getCheckpointState), then hand the live
outputs of the replay their deleters (_cuda_setCheckpointPoolState). Under
a pluggable allocator PyTorch refuses both, so use() puts these in their
place:

- get_state(device, pool): gpumem's checkpoint of the pool (its live
  buffers: address, size, stream);
- set_state(device, state, stale, add_deleters): gpumem frees every live
  buffer of the pool and makes the checkpoint's again at their addresses
  (gpumem_pool_restore); the stale storages lose their deleters (their
  memory was freed), and the storages to add deleters to, which the trees
  built over a replay's outputs with none, get gpumem's
  (gpumem_torch_delete), so that their memory is freed when they die;
- raw_delete, free_and_remove_deleter, has_standard_deleter: PyTorch's
  helpers around these, for storages whose deleter is gpumem's or the
  pluggable allocator's.

A storage's deleter lives in c10::StorageImpl's DataPtr, which Python
cannot reach. _Layout finds it: it builds a storage over a known address
with no deleter and one from the allocator, reads the words of each
StorageImpl, and accepts the layout only if the address, an empty context
and c10's deleteNothing (resp. the allocator's context) sit where
c10/core/StorageImpl.h puts them. Anything else: one RuntimeError, and
nothing is written.
"""

import ctypes
import os

# An address no allocation has: _Layout's storage with no deleter points
# there (PyTorch never touches a storage's memory to build it).
_PROBE = 0x7E57_0000_0000
_WORDS = 8  # how far into StorageImpl to look (vtable, refcounts, DataPtr)

_FAIL = ("gpumem: torch.compile(mode='reduce-overhead') needs the storage layout of this PyTorch "
         "build, which gpumem could not read ({}); use mode='max-autotune-no-cudagraphs' or run "
         "without gpumem.torch.use()")


def _word(addr):
    return ctypes.c_uint64.from_address(addr)


class _Layout:
    """Where c10::StorageImpl keeps its DataPtr: the data pointer, the
    context and the deleter, as byte offsets."""

    def __init__(self, torch, lib, device):
        self.ours = lib.torch_deleter()
        self.nothing = self._delete_nothing(torch)
        try:
            probe = torch._C._construct_storage_from_data_pointer(_PROBE, torch.device("cuda", device), 512)
        except Exception as e:  # an older or newer PyTorch without it
            raise RuntimeError(_FAIL.format(f"_construct_storage_from_data_pointer: {type(e).__name__}: {e}")) from None
        words = [_word(probe._cdata + 8 * i).value for i in range(_WORDS)]
        found = None
        for i in range(1, _WORDS - 2):
            if words[i] != _PROBE:
                continue
            a, b = words[i + 1], words[i + 2]
            # libstdc++'s unique_ptr<void, fn> keeps (deleter, pointer);
            # others may keep (pointer, deleter): accept either, by value.
            if a == 0 and b != 0 and (self.nothing is None or b == self.nothing):
                found = (8 * i, 8 * (i + 1), 8 * (i + 2))
            elif b == 0 and a != 0 and (self.nothing is None or a == self.nothing):
                found = (8 * i, 8 * (i + 2), 8 * (i + 1))
            break
        if found is None:
            raise RuntimeError(_FAIL.format("no DataPtr with the probe's address in StorageImpl"))
        self.data, self.ctx, self.deleter = found
        if self.nothing is None:
            self.nothing = _word(probe._cdata + self.deleter).value
        del probe
        # A storage from the allocator: its deleter is the pluggable
        # allocator's, its context not empty.
        real = torch.empty(1, dtype=torch.uint8, device=torch.device("cuda", device)).untyped_storage()
        c = real._cdata
        if _word(c + self.data).value != real.data_ptr() or _word(c + self.ctx).value == 0:
            raise RuntimeError(_FAIL.format("an allocated storage does not match the layout"))
        self.pluggable = _word(c + self.deleter).value
        del real

    @staticmethod
    def _delete_nothing(torch):
        try:
            c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
            return ctypes.cast(c10._ZN3c106detail13deleteNothingEPv, ctypes.c_void_p).value
        except (OSError, AttributeError):
            return None

    def data_ptr(self, cdata):
        return _word(cdata + self.data).value

    def owner(self, cdata):
        """'gpumem', 'pluggable', 'none' or 'other': whose deleter the
        storage has."""
        d = _word(cdata + self.deleter).value
        if d == self.ours:
            return "gpumem"
        if d == self.pluggable:
            return "pluggable"
        if d == self.nothing and _word(cdata + self.ctx).value == 0:
            return "none"
        return "other"

    def attach(self, cdata, ptr):
        """Gives a storage with no deleter gpumem's, freeing ptr."""
        if self.data_ptr(cdata) != ptr:
            raise RuntimeError(f"gpumem: setCheckpointPoolState: the storage at {cdata:#x} points at "
                               f"{self.data_ptr(cdata):#x}, not at the buffer {ptr:#x}")
        if self.owner(cdata) != "none":
            raise RuntimeError(f"gpumem: setCheckpointPoolState: the storage at {cdata:#x} has a deleter "
                               "already (PyTorch: Not expecting deleter function)")
        _word(cdata + self.ctx).value = ptr
        _word(cdata + self.deleter).value = self.ours

    def detach(self, cdata):
        """Takes a storage's deleter away (its memory is freed elsewhere);
        returns the old (deleter, context). A pluggable allocator's context
        (a small C++ object) is left unfreed: freeing it would free the
        memory too."""
        if self.owner(cdata) not in ("gpumem", "pluggable"):
            raise RuntimeError(f"gpumem: the storage at {cdata:#x} does not have the allocator's deleter "
                               "(PyTorch: Unexpected deleter function on storage, could not swap function)")
        old = (_word(cdata + self.deleter).value, _word(cdata + self.ctx).value)
        _word(cdata + self.ctx).value = 0
        _word(cdata + self.deleter).value = self.nothing
        return old


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class AllocatorState:
    """A checkpoint of a private pool (what torch._C._cuda_getCheckpointState
    returns under gpumem): its live buffers when taken."""

    __slots__ = ("device", "pool", "buffers")

    def __init__(self, device, pool, buffers):
        self.device, self.pool, self.buffers = device, pool, buffers

    def __repr__(self):
        return f"gpumem.AllocatorState(device={self.device}, pool={self.pool}, buffers={len(self.buffers)})"


class Checkpoints:
    """The replacements use() installs (see the module's comment)."""

    def __init__(self, torch, lib, device_index, pool_id):
        self.torch, self.lib = torch, lib
        self.dev, self.pool_id = device_index, pool_id
        self._layout = None

    def layout(self, device):
        if self._layout is None:
            self._layout = _Layout(self.torch, self.lib, device)
        return self._layout

    def get_state(self, device, mempool_id):
        d, pool = self.dev(device), self.pool_id(mempool_id)
        return AllocatorState(d, pool, self.lib.pool_checkpoint(d, pool))

    def set_state(self, device, state, stale_storages_ptr, storages_to_add_deleters_to_ptr=()):
        if not isinstance(state, AllocatorState):
            raise TypeError(f"gpumem: setCheckpointPoolState: {type(state).__name__} is not a checkpoint "
                            "of gpumem's (torch._C._cuda_getCheckpointState under gpumem.torch.use())")
        d = self.dev(device)
        if d != state.device:
            raise RuntimeError(f"gpumem: setCheckpointPoolState: a checkpoint of device {state.device} given for {d}")
        stale = list(dict.fromkeys(int(p) for p in stale_storages_ptr))
        live = self.lib.pool_live(d, state.pool)
        allocd = {b[0] for b in state.buffers}
        # PyTorch's checks: a buffer freed and not made again must belong
        # to one of the stale storages, whose deleters go (else a storage
        # would free memory the pool has handed out again).
        if len(stale) < len(live - allocd):
            raise RuntimeError("gpumem: setCheckpointPoolState: Any stale tensors which are being manually "
                               "freed must be passed to set checkpoint")
        layout = self.layout(d)
        for c in stale:
            if layout.data_ptr(c) not in live:
                raise RuntimeError(f"gpumem: setCheckpointPoolState: stale storage {c:#x} is not a live "
                                   "buffer of the pool")
        self.lib.pool_restore(d, state.pool, state.buffers)
        for c in stale:
            layout.detach(c)
        add = {}
        for c in storages_to_add_deleters_to_ptr:
            add[layout.data_ptr(int(c))] = int(c)
        for ptr in allocd:
            c = add.get(ptr)
            if c is not None:
                layout.attach(c, ptr)

    def raw_delete(self, ptr):
        # Buffers a restore made were not handed out through the pluggable
        # allocator, whose raw_delete would refuse them: gpumem frees them,
        # as any of its buffers, by address.
        self.lib.deallocate(int(ptr), -1)

    def free_and_remove_deleter(self, storage_ptr):
        layout = self.layout(self.torch.cuda.current_device())
        deleter, ctx = layout.detach(int(storage_ptr))
        if ctx:
            _DELETER(deleter)(ctx)  # the deleter's own free: memory and context

    def has_standard_deleter(self, storage_ptr):
        return self.layout(self.torch.cuda.current_device()).owner(int(storage_ptr)) in ("gpumem", "pluggable")
