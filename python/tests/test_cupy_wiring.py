"""gpumem.cupy's bookkeeping of captured graphs, without CuPy or a GPU."""

from conftest import run


def test_graph_pools_go_back_once_the_program_drops_the_graph():
    """CuPy's Graph takes no weak reference: gpumem keeps each and gives its
    pool back only once nothing else refers to it, at the next capture,
    trim, or out-of-memory; never while the program still holds it."""
    p = run("""
        import gc
        import gpumem, gpumem.cupy as gc_

        released = []
        class FakeLib:
            def pool_release(self, device, pool):
                released.append(pool)
        class Graph:  # no __weakref__, as CuPy's
            __slots__ = ()
        lib = FakeLib()
        a, b = Graph(), Graph()
        gc_._graphs.extend([[a, lib, 0, (9, 1)], [b, lib, 0, (9, 2)]])
        holder = {"b": b}
        del b
        assert gc_._release_unused_graphs() is False and released == [], released
        del a
        assert gc_._release_unused_graphs() is True and released == [(9, 1)], released
        del holder["b"]
        assert gc_._release_unused_graphs() is True and released == [(9, 1), (9, 2)], released
        assert gc_._graphs == [] and gc_._release_unused_graphs() is False
        print("ok")
    """)
    assert p.stdout.strip() == "ok", p.stdout


def test_ipc_handle_refusal_says_why():
    """cudaIpcGetMemHandle on gpumem's memory fails at once with gpumem's
    line (chained to the runtime's error); where it succeeds the answer is
    the runtime's; patching twice wraps once."""
    p = run("""
        import types
        import gpumem.cupy as gc_

        class CUDARuntimeError(RuntimeError):
            pass
        def ipcGetMemHandle(ptr):
            if ptr == 0x1000:
                return b"handle"
            raise CUDARuntimeError("cudaErrorInvalidValue: invalid argument")
        rt = types.SimpleNamespace(CUDARuntimeError=CUDARuntimeError, ipcGetMemHandle=ipcGetMemHandle)
        cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt))
        gc_._patch_ipc(cupy)
        gc_._patch_ipc(cupy)
        assert rt.ipcGetMemHandle.__wrapped__ is ipcGetMemHandle
        assert rt.ipcGetMemHandle(0x1000) == b"handle"
        try:
            rt.ipcGetMemHandle(0x2000)
        except RuntimeError as e:
            assert isinstance(e.__cause__, CUDARuntimeError)
            print(str(e))
    """)
    line = p.stdout.strip()
    assert line.startswith("gpumem: cudaIpcGetMemHandle(0x2000) failed (cudaErrorInvalidValue") and \
        "torch.multiprocessing" in line and "\n" not in line, line
