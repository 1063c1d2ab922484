"""gpumem.torch's reading of c10::StorageImpl (python/gpumem/_checkpoint.py),
on stand-in storages built with ctypes: no PyTorch, no GPU."""

import ctypes
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
from gpumem import _checkpoint  # noqa: E402

NOTHING, PLUGGABLE, OURS = 0x1111, 0x2222, 0x3333


class Storage:
    """A stand-in StorageImpl: vtable, refcount, then DataPtr's data pointer
    and its context pair, in the given order, then the device."""

    def __init__(self, data, ctx, deleter, order):
        self.words = (ctypes.c_uint64 * 12)()
        pair = (deleter, ctx) if order == "deleter first" else (ctx, deleter)
        for i, w in enumerate((0xAAAA, 1, data) + pair + (0,)):
            self.words[i] = w
        self._cdata = ctypes.addressof(self.words)

    def data_ptr(self):
        return self.words[2]

    def untyped_storage(self):
        return self


class FakeTorch:
    __file__ = "/nonexistent/torch/__init__.py"  # no libc10.so: deleteNothing read from the probe

    def __init__(self, order, real_ctx=0x5555):
        self.order, self.real_ctx, self.made = order, real_ctx, []
        torch = self

        class C:
            @staticmethod
            def _construct_storage_from_data_pointer(ptr, device, n):
                s = Storage(ptr, 0, NOTHING, torch.order)
                torch.made.append(s)
                return s
        self._C = C
        self.uint8 = "uint8"

    def device(self, *a):
        return a

    def empty(self, n, dtype=None, device=None):
        s = Storage(0x7000_0000, self.real_ctx, PLUGGABLE, self.order)
        self.made.append(s)
        return s


class FakeLib:
    def torch_deleter(self):
        return OURS


@pytest.mark.parametrize("order", ["deleter first", "context first"])
def test_layout_found_and_storages_rewired(order):
    torch = FakeTorch(order)
    lay = _checkpoint._Layout(torch, FakeLib(), 0)
    assert (lay.data, lay.nothing, lay.pluggable) == (16, NOTHING, PLUGGABLE)
    assert {lay.ctx, lay.deleter} == {24, 32}
    # A replay's output: no deleter; attach gives it gpumem's, freeing its pointer.
    out = Storage(0x9000, 0, NOTHING, order)
    assert lay.owner(out._cdata) == "none"
    lay.attach(out._cdata, 0x9000)
    assert lay.owner(out._cdata) == "gpumem"
    assert ctypes.c_uint64.from_address(out._cdata + lay.ctx).value == 0x9000
    with pytest.raises(RuntimeError, match="has a deleter already"):
        lay.attach(out._cdata, 0x9000)
    with pytest.raises(RuntimeError, match="not at the buffer 0x9999"):
        lay.attach(out._cdata, 0x9999)
    # Detach takes it away again and says what it was.
    assert lay.detach(out._cdata) == (OURS, 0x9000)
    assert lay.owner(out._cdata) == "none"
    with pytest.raises(RuntimeError, match="does not have the allocator's deleter"):
        lay.detach(out._cdata)
    # A storage of the pluggable allocator is the allocator's too.
    real = Storage(0x9100, 0x77, PLUGGABLE, order)
    assert lay.owner(real._cdata) == "pluggable"
    # Another deleter is nobody's to touch.
    other = Storage(0x9200, 0x88, 0x4444, order)
    assert lay.owner(other._cdata) == "other"
    with pytest.raises(RuntimeError):
        lay.attach(other._cdata, 0x9200)


def test_layout_refused_when_nothing_matches():
    class Shuffled(FakeTorch):
        def __init__(self):
            super().__init__("deleter first")
            torch = self

            class C:
                @staticmethod
                def _construct_storage_from_data_pointer(ptr, device, n):
                    s = Storage(0, 0, NOTHING, "deleter first")  # the address is nowhere
                    torch.made.append(s)
                    return s
            self._C = C

    with pytest.raises(RuntimeError, match="could not read"):
        _checkpoint._Layout(Shuffled(), FakeLib(), 0)
    # An allocated storage without a context: refused too.
    with pytest.raises(RuntimeError, match="an allocated storage does not match"):
        _checkpoint._Layout(FakeTorch("deleter first", real_ctx=0), FakeLib(), 0)
    # No way to build the probe: one line, no AttributeError.
    torch = FakeTorch("deleter first")
    torch._C = object()
    with pytest.raises(RuntimeError, match="_construct_storage_from_data_pointer"):
        _checkpoint._Layout(torch, FakeLib(), 0)
