"""gpumem as PyTorch's allocator, on a real GPU (skipped without one). Each
test runs in a process of its own (conftest.run): an allocator can be
installed only before PyTorch's first CUDA allocation."""

import gzip

from conftest import needs_gpu, needs_library, run

pytestmark = [needs_library, needs_gpu]


def test_train_and_give_back():
    """A small model trains on gpumem; the patched torch.cuda functions answer
    from gpumem; after del + gc + empty_cache the driver gets the memory
    back."""
    p = run("""
        import gc, torch, gpumem.torch
        gpumem.torch.use()
        assert gpumem.torch.installed()
        total0 = torch.cuda.mem_get_info()[1]
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
        opt = torch.optim.Adam(model.parameters())
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(model(torch.randn(256, 4096, device="cuda")),
                                                     torch.randint(0, 10, (256,), device="cuda"))
            loss.backward(); opt.step(); opt.zero_grad()
        torch.cuda.synchronize()
        s = gpumem.torch.stats()
        assert s["allocated"] > 4096 * 4096 * 4 * 3, s            # weights, grads, two Adam moments
        assert torch.cuda.memory_allocated() == s["active"]
        assert torch.cuda.max_memory_reserved() == s["peak_reserved"] >= s["reserved"]
        assert torch.cuda.memory_stats()["reserved_bytes.all.current"] == s["reserved"]
        table = torch.cuda.memory_summary()  # PyTorch's table layout, gpumem's figures
        assert table.startswith("|====") and "gpumem CUDA memory summary" in table, table
        free1, total1 = torch.cuda.mem_get_info()
        # The device's free memory, which other processes on the GPU move too
        # (this failed beside other work on an H200): its bounds only.
        assert total1 == total0 and 0 < free1 <= total1
        del model, opt, loss
        gc.collect()
        before = torch.cuda.mem_get_info()
        torch.cuda.empty_cache()
        s = gpumem.torch.stats()
        # What stays is what is live (PyTorch keeps its cuBLAS workspaces) and
        # the free part of the spans under it; nothing releasable.
        assert s["releasable"] == 0 and s["cached"] <= s["live_buffers"] * (32 << 20), s
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_reserved() == gpumem.torch.stats()["reserved"]
        print("ok", s["allocs"], s["frees"])
    """)
    assert p.stdout.startswith("ok")


def test_out_of_memory_is_torchs_error():
    p = run("""
        import torch, gpumem, gpumem.torch
        gpumem.torch.use(limit="1GiB")
        keep = torch.empty(700 << 20, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            print("OOM", str(e).splitlines()[0])
        else:
            raise AssertionError("no OutOfMemoryError")
        v = gpumem.torch.last_oom()
        print("verdict", v.cause, v.requested, v.limit, v.would_fit)
        # Nothing is broken: what would have fit, fits, and work goes on.
        x = torch.empty(v.would_fit - (4 << 20), dtype=torch.uint8, device="cuda")
        x.fill_(1)
        print("after", int(x[:1024].sum()))
        # An absurd size is PyTorch's out-of-memory, not a crash.
        try:
            torch.empty(1 << 55, dtype=torch.uint8, device="cuda")
        except RuntimeError as e:
            print("absurd", type(e).__name__)
        try:
            torch.empty(1 << 61, dtype=torch.uint8, device="cuda")
        except RuntimeError as e:
            print("exa", type(e).__name__, str(e).splitlines()[0][:60])
    """)
    lines = p.stdout.splitlines()
    # PyTorch's words first (what batch-size finders match on), then gpumem's verdict.
    assert lines[0].startswith("OOM CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of "), lines
    assert "gpumem: out of memory (allocator limit): requested 600.00 MiB" in lines[0], lines
    cause, req, limit, would_fit = lines[1].split()[1:]
    assert cause == "limit" and int(req) == 600 << 20 and int(limit) == 1 << 30
    assert lines[2] == "after 1024"
    assert lines[3] == "absurd OutOfMemoryError", lines  # as PyTorch's allocator says of it
    assert lines[4].startswith("exa OutOfMemoryError CUDA out of memory. Tried to allocate more than 1EB memory."), lines


def test_use_after_first_allocation_says_so():
    p = run("""
        import torch, gpumem.torch
        torch.zeros(1, device="cuda")
        try:
            gpumem.torch.use()
        except RuntimeError as e:
            print(e)
    """)
    assert p.stdout.startswith("gpumem.torch.use() must run before PyTorch initializes its CUDA allocator")


def test_record_stream_keeps_memory_until_the_other_stream_is_done():
    """A buffer used on a second stream and freed on the first is not handed
    to the first stream's next allocation while the second still reads it:
    the result written by the second stream is the one computed from the
    buffer's original contents."""
    p = run("""
        import torch, gpumem.torch
        gpumem.torch.use()
        side = torch.cuda.Stream()
        n = 64 << 20
        bad = []
        for trial in range(20):
            x = torch.full((n,), 1.0, device="cuda")
            done = torch.cuda.Event()
            torch.cuda.current_stream().record_event(done)
            with torch.cuda.stream(side):
                side.wait_event(done)
                torch.cuda._sleep(20_000_000)         # keep the side stream busy
                y = (x * 2).sum()                     # reads x late
            x.record_stream(side)
            ptr = x.untyped_storage().data_ptr()
            del x                                     # freed on the main stream
            z = torch.full((n,), 5.0, device="cuda")  # must not take x's memory yet
            # Taking it is a fault only while the side stream still runs (a
            # fence may have waited for it, and then the memory is free).
            if z.untyped_storage().data_ptr() == ptr and not side.query():
                bad.append(f"trial {trial}: x's memory reused while the side stream ran")
            side.synchronize()
            if float(y) != 2.0 * n:
                bad.append(f"trial {trial}: y = {float(y)}, want {2.0 * n}")
        ok = not bad
        print(bad, gpumem.torch.stats(), file=__import__("sys").stderr)
        print("ok" if ok else "reused")
    """)
    assert p.stdout.strip() == "ok", p.stderr


def test_record_under_gpumem(tmp_path):
    path = tmp_path / "small.trace.gz"
    run(f"""
        import torch, gpumem.torch
        gpumem.torch.use()
        def step():
            a = torch.randn(1024, 1024, device="cuda")
            return (a @ a).sum()
        with gpumem.torch.record({str(path)!r}):
            for _ in range(3):
                step()
        torch.cuda.synchronize()
    """)
    lines = gzip.open(path, "rt").read().splitlines()
    sites = [l for l in lines if l.startswith("s ")]
    allocs = [l.split() for l in lines if l.startswith("a ")]
    assert len(allocs) >= 6
    assert any("step" in s and "<string>" in s for s in sites), sites[:3]
    assert all(len(a) == 6 for a in allocs), allocs[:3]


def test_record_under_pytorchs_allocator(tmp_path):
    """Without use(), record() converts PyTorch's memory history."""
    path = tmp_path / "native.trace.gz"
    run(f"""
        import torch, gpumem.torch
        with gpumem.torch.record({str(path)!r}):
            for _ in range(3):
                a = torch.randn(1024, 1024, device="cuda")
                b = (a @ a).sum()
        torch.cuda.synchronize()
    """)
    lines = gzip.open(path, "rt").read().splitlines()
    assert lines[0].startswith("# gpumem-trace v1")
    assert sum(1 for l in lines if l.startswith("a ")) >= 6
