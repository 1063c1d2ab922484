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
