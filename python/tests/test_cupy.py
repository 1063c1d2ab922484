"""gpumem as CuPy's allocator, on a real GPU (skipped without CuPy and one)."""

from conftest import needs_cupy, needs_library, run, under_each

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


CAPTURE = """
    import json, os, sys
    import cupy
    if os.environ["ALLOCATOR"] == "gpumem":
        import gpumem, gpumem.cupy
        gpumem.cupy.use()
    x = cupy.arange(1 << 20, dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        tmp = x * 2           # an intermediate, freed within the capture
        y = tmp + 1
        del tmp
        z = y * 3
        g = s.end_capture()
    # Arrays made after the capture, each with its own value.
    keep = [cupy.full(n << 16, float(i + 5), dtype=cupy.float32) for i, n in enumerate((16, 4, 16, 1, 8, 32))]
    cupy.cuda.Device().synchronize()  # what the null stream made (x, keep) is done before s's work reads it
    ok = True
    for k in range(3):
        with s:
            x += 1            # new input each launch, in s's order (the null stream is not: s is non-blocking)
        g.launch(stream=s)
        s.synchronize()
        want = (cupy.arange(1 << 20, dtype=cupy.float32) + k + 1) * 2 + 1
        ok = ok and bool(cupy.allclose(y, want)) and bool(cupy.allclose(z, want * 3))
    changed = [i for i, a in enumerate(keep) if not bool((a == i + 5).all())]
    out = dict(outputs=ok, changed=changed)
    if os.environ["ALLOCATOR"] == "gpumem":
        held = gpumem.stats(0)["pool_reserved"]
        del g, y, z
        import gc; gc.collect()
        gpumem.trim()
        out.update(pool_held=held > 0, pool_after=gpumem.stats(0)["pool_reserved"])
    print("RESULT " + json.dumps(out))
"""


def test_stream_capture_keeps_its_memory():
    """CuPy's stream capture under gpumem: what the capture allocated is the
    graph's (launches write it), so arrays made after the capture keep
    their values through launches, and the outputs are right; once the
    graph is collected its pool goes back at the next trim. CuPy's own pool
    is run for comparison only."""
    res = under_each(CAPTURE, ("gpumem", "cupy"))
    ours = res["gpumem"]
    assert ours["outputs"] and ours["changed"] == [], res
    assert ours["pool_held"] and ours["pool_after"] == 0, res
