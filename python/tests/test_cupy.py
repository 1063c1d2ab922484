"""gpumem as CuPy's allocator, on a real GPU (skipped without CuPy and one)."""

from conftest import needs_cupy, needs_library, run

pytestmark = [needs_library, needs_cupy]


def test_arrays_and_out_of_memory():
    p = run("""
        import cupy, gpumem, gpumem.cupy
        gpumem.cupy.use(limit="1GiB")
        a = cupy.arange(1 << 20, dtype=cupy.int64)
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            b = a * 2                                  # allocated on s
        s.synchronize()
        print("sum", int(b.sum()))
        st = gpumem.stats(0)
        assert st["live_buffers"] >= 2 and st["allocated"] >= 8 << 20, st
        del a, b
        assert gpumem.stats(0)["allocated"] < 1 << 20
        keep = cupy.empty(700 << 20, dtype=cupy.uint8)
        try:
            cupy.empty(600 << 20, dtype=cupy.uint8)
        except cupy.cuda.memory.OutOfMemoryError as e:
            print("OOM", e.verdict.cause, str(e).split(":")[1].strip())
        gpumem.trim()
        print("reserved", gpumem.stats(0)["reserved"])
    """)
    lines = p.stdout.splitlines()
    assert lines[0] == "sum %d" % (sum(range(1 << 20)) * 2)
    assert lines[1].startswith("OOM limit out of memory (allocator limit)")
    assert int(lines[2].split()[1]) <= 702 << 20
