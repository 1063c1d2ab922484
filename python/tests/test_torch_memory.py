"""PyTorch's memory statistics, history and snapshots under gpumem: the
keys and table of memory_stats and memory_summary, and
_record_memory_history / _snapshot / _dump_snapshot in PyTorch's format,
which torch.cuda._memory_viz renders and `gpumem import` reads back.

The GPU tests run one script under gpumem and under PyTorch's allocator
(each in its own process) and assert the same properties of both. The
tests at the top need no GPU."""

import os

from conftest import needs_gpu, needs_library, run, under_each

SIM = "device=sim,capacity=4GiB,check=true"


class _Stats:
    def __init__(self, **kw):
        for k in ("allocated", "peak_allocated", "active", "peak_active", "reserved", "peak_reserved",
                  "cached", "releasable", "live_buffers", "allocs", "frees", "device_calls", "ooms", "trims",
                  "limit", "alloc_bytes", "free_bytes", "alloc_requested", "free_requested", "segments",
                  "retries", "device_allocs", "device_frees", "pool_reserved",
                  "peak_live_buffers", "peak_segments", "fences"):
            setattr(self, k, kw.get(k, 0))
        self.fragmentation = kw.get("fragmentation", 0.0)


def test_memory_stats_keys_and_summary():
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
    from gpumem import _torchmem
    s = _Stats(active=3 << 20, peak_active=5 << 20, allocated=3 << 20, alloc_bytes=9 << 20, free_bytes=6 << 20,
               alloc_requested=8 << 20, free_requested=5 << 20, reserved=4 << 20, peak_reserved=6 << 20,
               cached=1 << 20, live_buffers=3, allocs=10, frees=7, segments=2, ooms=1, retries=1)
    st = _torchmem.memory_stats(s)
    # The keys tools read, with gpumem's figures.
    assert st["active_bytes.all.allocated"] == 9 << 20 and st["active_bytes.all.freed"] == 6 << 20
    assert st["allocated_bytes.all.current"] == 3 << 20 and st["allocated_bytes.all.peak"] == 5 << 20
    assert st["requested_bytes.all.allocated"] - st["requested_bytes.all.freed"] == st["requested_bytes.all.current"]
    assert st["reserved_bytes.all.current"] == 4 << 20 and st["allocation.all.current"] == 3
    assert st["num_ooms"] == 1 and st["num_alloc_retries"] == 1 and st["segment.all.current"] == 2
    # No figure gpumem does not keep is made up; PyTorch's small/large
    # pool keys are there (test_pool_keys_in_pytorchs_shape).
    assert st["segment.small_pool.current"] == 0 and st["allocated_bytes.large_pool.current"] == 3 << 20
    assert "segment.all.peak" not in st and "segment.large_pool.peak" not in st
    assert list(st) == sorted(st)
    try:
        st["no_such_key"]
    except KeyError as e:
        assert e.args == ("no_such_key",), e  # any other key: the plain KeyError
    else:
        raise AssertionError("no_such_key answered")
    # memory_stats_as_nested_dict / torch._C._cuda_memoryStats: the same
    # figures nested by the keys' dots, as PyTorch's.
    from gpumem.torch import _nested
    nested = _nested(st)
    assert nested["active_bytes"]["all"]["allocated"] == 9 << 20 and nested["num_ooms"] == 1
    flat = {}
    def walk(prefix, d):
        for k, v in d.items():
            walk(prefix + k + ".", v) if isinstance(v, dict) else flat.__setitem__(prefix + k, v)
    walk("", nested)
    assert flat == st
    assert nested["allocated_bytes"]["large_pool"]["current"] == 3 << 20
    assert nested["segment"]["small_pool"] == {"current": 0, "allocated": 0, "freed": 0}
    table = _torchmem.memory_summary(s, 0)
    lines = table.splitlines()
    assert lines[0].startswith("|====") and "CUDA OOMs: 1" in table
    assert all(len(line) == 77 for line in lines), [len(line) for line in lines]
    row = next(line for line in lines if line.startswith("| Allocated memory"))
    assert row.split("|")[2].strip() == "3072 KiB" and row.split("|")[4].strip() == "9216 KiB", row


# PyTorch's allocator splits these by pool ("all", "small_pool",
# "large_pool"), each with current, peak, allocated and freed
# (torch/csrc/cuda/Module.cpp, memoryStats).
_PYTORCH_POOLED = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
                   "allocation", "segment", "active", "inactive_split")
_FIGURES = ("current", "peak", "allocated", "freed")
# The "all" figures gpumem keeps; the rest (peaks of counts, bytes
# reserved and released over time, the count of split blocks, their
# peaks and totals) it does not keep, under any pool.
_KEPT = {"allocated_bytes": _FIGURES, "active_bytes": _FIGURES, "requested_bytes": _FIGURES,
         "reserved_bytes": ("current", "peak"), "inactive_split_bytes": ("current",),
         "allocation": ("current", "allocated", "freed"), "active": ("current", "allocated", "freed"),
         "segment": ("current", "allocated", "freed")}


def _made_up_stats():
    """gpumem's figures, made up, none of them zero."""
    return _Stats(active=3 << 20, peak_active=5 << 20, allocated=(3 << 20) - 100, peak_allocated=(5 << 20) - 100,
                  alloc_bytes=9 << 20, free_bytes=6 << 20, alloc_requested=(9 << 20) - 300,
                  free_requested=(6 << 20) - 200, reserved=8 << 20, peak_reserved=10 << 20, cached=5 << 20,
                  releasable=2 << 20, live_buffers=3, allocs=10, frees=7, segments=4, device_allocs=6,
                  device_frees=2, ooms=1, retries=2, device_calls=11, trims=1, limit=1 << 30)


def test_pool_keys_in_pytorchs_shape():
    """Issue 42: gpumem has one pool, reported in PyTorch's shape: every
    "<name>.small_pool.<figure>" is 0 and every "<name>.large_pool.<figure>"
    the "all" figure, for every figure gpumem keeps; reading any of
    PyTorch's per-pool keys whose "all" figure gpumem keeps raises no
    KeyError, flat and nested; a figure gpumem does not keep is absent
    under all three pools alike."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
    from gpumem import _torchmem
    from gpumem.torch import _nested
    st = _torchmem.memory_stats(_made_up_stats())
    nested = _nested(st)
    for name in _PYTORCH_POOLED:
        for figure in _FIGURES:
            every = f"{name}.all.{figure}"
            if figure not in _KEPT.get(name, ()):
                assert not any(f"{name}.{pool}.{figure}" in st for pool in ("all", "large_pool", "small_pool")), every
                continue
            assert st[every] != 0, every  # the made-up figures: a copy of 0 would prove nothing
            assert st[f"{name}.large_pool.{figure}"] == st[every], every
            assert st[f"{name}.small_pool.{figure}"] == 0, every
            assert nested[name]["large_pool"][figure] == st[every] and nested[name]["small_pool"][figure] == 0
    # Each pool key has its "all" key, and nothing else gained pools.
    pooled = [k for k in st if ".small_pool." in k or ".large_pool." in k]
    assert len(pooled) == 2 * sum(len(v) for v in _KEPT.values()), pooled
    assert sorted(k.split(".")[0] for k in st if ".all." in k) == sorted(
        name for name, figures in _KEPT.items() for _ in figures)
    # PyTorch's test_graph_memory_stats_and_use_result_after_destroy_graph
    # reads these for both pools.
    for pool in ("small_pool", "large_pool"):
        for name in ("segment", "reserved_bytes", "active", "active_bytes"):
            st[f"{name}.{pool}.current"]
    assert list(st) == sorted(st)


def test_pool_keys_after_resets():
    """reset_accumulated_memory_stats (memory_stats over a base) counts the
    pools' accumulated figures from the reset as it counts the "all" ones;
    a base from before the pool keys (none in it) gives the same; peaks
    follow the library's (reset_peak_memory_stats resets those)."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
    from gpumem import _torchmem
    before = _made_up_stats()
    base = _torchmem.memory_stats(before)
    after = _made_up_stats()
    after.alloc_bytes, after.free_bytes, after.allocs, after.frees = 20 << 20, 15 << 20, 30, 25
    after.device_allocs, after.device_frees, after.peak_active, after.peak_reserved = 9, 4, 3 << 20, 8 << 20
    old_base = {k: v for k, v in base.items() if ".small_pool." not in k and ".large_pool." not in k}
    for b in (base, old_base):
        st = _torchmem.memory_stats(after, b)
        assert st["active_bytes.all.allocated"] == 11 << 20 and st["allocation.all.freed"] == 18
        assert st["segment.all.allocated"] == 3 and st["num_device_alloc"] == 3
        for key, v in st.items():
            if ".all." in key:
                assert st[key.replace(".all.", ".large_pool.")] == v, key
                assert st[key.replace(".all.", ".small_pool.")] == 0, key
        assert st["allocated_bytes.large_pool.peak"] == 3 << 20 and st["reserved_bytes.large_pool.peak"] == 8 << 20


def test_summary_pool_rows():
    """memory_summary prints PyTorch's "from large pool" and "from small
    pool" rows under each metric (the large pool's the metric's figures,
    the small pool's zeros, blank where gpumem keeps no figure), and not
    when abbreviated."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
    from gpumem import _torchmem
    s = _made_up_stats()
    lines = _torchmem.memory_summary(s, 0).splitlines()
    assert all(len(line) == 77 for line in lines), [len(line) for line in lines]
    rows = [line for line in lines if line.count("|") == 6]  # the table's rows, its header first
    metrics = ["Allocated memory", "Active memory", "Requested memory", "GPU reserved memory",
               "Non-releasable memory", "Allocations", "Active allocs", "GPU reserved segments"]
    titles = [row.split("|")[1].strip() for row in rows]
    assert titles == ["Metric"] + [t for m in metrics for t in (m, "from large pool", "from small pool")], titles
    for i, line in enumerate(lines):
        if line.startswith("|       from large pool"):
            assert line.split("|")[2:] == lines[i - 1].split("|")[2:], (lines[i - 1], line)
        if line.startswith("|       from small pool"):
            metric = lines[i - 2].split("|")[2:-1]
            cells = [c.strip() for c in line.split("|")[2:-1]]
            assert cells == ["" if not m.strip() else ("0 B" if m.strip().endswith("B") else "0")
                             for m in metric], (lines[i - 2], line)
    assert lines[lines.index(next(l for l in lines if l.startswith("| Allocations"))) + 3].startswith("|---")
    short = _torchmem.memory_summary(s, 0, abbreviated=True)
    assert "from large pool" not in short and "from small pool" not in short
    assert [row.split("|")[1].strip() for row in short.splitlines() if row.count("|") == 6] == ["Metric"] + metrics


@needs_library
def test_history_and_snapshot_on_the_simulated_device():
    """The library's history and PyTorch-layout snapshot, without torch:
    live buffers are active_allocated blocks, the trace lists allocations
    and frees in order, with the sites the callback gave."""
    p = run("""
        import json, gpumem
        from gpumem import _lib
        lib = gpumem.library()
        lib.history(0, True, 100)
        sites = iter(range(1, 100))
        cb = _lib.SITE_CALLBACK(lambda device: next(sites))
        lib.set_site_callback(cb)
        lib._c.gpumem_record_start  # present
        a = [lib.allocate(n << 20) for n in (1, 2, 3)]
        lib.deallocate(a[1])
        snap = json.loads(lib.torch_snapshot_json(0))
        blocks = {b["address"]: b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"}
        print("live", sorted(blocks) == sorted([a[0], a[2]]))
        print("trace", [(e["action"], e["size"]) for e in snap["device_traces"][0]])
        lib.history(0, False, 0)
    """, config=SIM)
    lines = p.stdout.splitlines()
    assert lines[0] == "live True", p.stdout
    # gpumem_alloc asks for a site only when called through the C entry
    # point with a recording or history on; gpumem_allocate does not.
    assert lines[1] == "trace " + str([("alloc", 1 << 20), ("alloc", 2 << 20), ("alloc", 3 << 20),
                                       ("free_requested", 2 << 20), ("free_completed", 2 << 20)]), p.stdout


# --- the history's context, without torch ----------------------------------
#
# PyTorch's test_cuda.py checks which function names a snapshot holds after
# _record_memory_history(context=...) (test_memory_plots_free_stack,
# test_memory_plots_history_context, test_memory_compile_regions). The
# History below runs over a stand-in for the library that keeps a ring and
# live blocks as internal/host/history.go does (a free's entries carry the
# allocation's site), and a stand-in for torch's two calls History makes.

class _FakeLib:
    def __init__(self):
        self.callback, self.ring, self.live, self.next = None, None, {}, 1 << 20
        self.free_sites = False

    def history(self, device, enabled, max_entries):
        self.ring = [] if enabled else None

    def set_site_callback(self, callback):
        self.callback = callback if callback else None

    def set_free_sites(self, on):
        self.free_sites = on

    def _add(self, action, addr, size, site, freed=0):
        import time
        if self.ring is not None:
            e = {"action": action, "addr": addr, "size": size, "stream": 0,
                 "time_us": time.time_ns() // 1000, "site": site}
            if freed:
                e["free_site"] = freed
            self.ring.append(e)

    def alloc(self, size):
        """What gpumem_alloc does: the site callback first, then the entry."""
        site = self.callback(0) if self.callback is not None else 0
        addr, self.next = self.next, self.next + (1 << 20)
        self.live[addr] = (size, site)
        self._add("alloc", addr, size, site)
        return addr

    def free(self, addr):
        """What gpumem_free does: the site callback first if free sites
        are on (gpumem_set_free_sites), then the entries."""
        freed = self.callback(0) if getattr(self, "free_sites", False) and self.callback is not None else 0
        size, site = self.live.pop(addr)
        self._add("free_requested", addr, size, site, freed)
        self._add("free_completed", addr, size, site, freed)

    def torch_snapshot_json(self, device=0):
        import json
        blocks = [{"address": a, "size": n, "requested_size": n, "state": "active_allocated", "site": s}
                  for a, (n, s) in sorted(self.live.items())]
        seg = {"device": 0, "address": 0, "total_size": 1 << 40, "allocated_size": 0, "active_size": 0,
               "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
               "is_expandable": True, "blocks": blocks}
        return json.dumps({"segments": [seg], "device_traces": [list(self.ring or [])]})


def _caller(frames):
    """The function that called _FakeLib.alloc (frames[0] is alloc itself,
    where the library's callback has the caller innermost)."""
    return frames[1]["name"] if frames else None


def _fake_module(name, **attrs):
    import types
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def _history(monkeypatch, regions=None):
    """A _torchmem.History over _FakeLib, torch stood in for; regions:
    {code made by dynamo: its trace annotation}, as dynamo's tables
    (torch._dynamo.utils.orig_code_map, the cache entries) would give."""
    import sys
    import types
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
    from gpumem import _torchmem
    cuda = _fake_module("torch.cuda", device_count=lambda: 1,
                        _utils=types.SimpleNamespace(_get_device_index=lambda device, optional=False: 0))
    torch = _fake_module("torch", cuda=cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", cuda)
    if regions is not None:
        made = {id(code): code for code in regions}  # dynamo's map: compares by identity, as here

        class OrigCodeMap:
            def get(self, code, default=None):
                return ("user code of " + code.co_name) if made.get(id(code)) is code else default

        def entries(source):
            return [types.SimpleNamespace(code=code, trace_annotation=annotation)
                    for code, annotation in regions.items() if source == "user code of " + code.co_name]
        utils = _fake_module("torch._dynamo.utils", orig_code_map=OrigCodeMap())
        eval_frame = _fake_module("torch._C._dynamo.eval_frame", _debug_get_cache_entry_list=entries)
        for name, m in (("torch._dynamo", _fake_module("torch._dynamo", utils=utils)), ("torch._dynamo.utils", utils),
                        ("torch._C", _fake_module("torch._C")), ("torch._C._dynamo", _fake_module("torch._C._dynamo")),
                        ("torch._C._dynamo.eval_frame", eval_frame)):
            monkeypatch.setitem(sys.modules, name, m)
    lib = _FakeLib()
    return lib, _torchmem.History(lib)


def test_history_free_stack_by_context(monkeypatch):
    """test_memory_plots_free_stack: context "alloc" and "all" put the
    allocating function in the trace, "state" puts it nowhere once the
    buffer is freed (trace entries carry no frames under "state"); a
    free's entries show the freeing function under "all" (the library
    asks for a free's site then: gpumem_set_free_sites) and the
    allocating one under "alloc", as PyTorch's."""
    import json
    lib, hist = _history(monkeypatch)
    for context in ("alloc", "all", "state"):
        hist.record(context=context)
        held = []

        def thealloc():
            held.append(lib.alloc(48))

        def thefree():
            lib.free(held.pop())

        thealloc()
        thefree()
        snap = hist.snapshot()
        ss = json.dumps(snap)
        assert ("thealloc" in ss) == (context != "state"), (context, ss)
        assert ("thefree" in ss) == (context == "all"), (context, ss)
        assert lib.free_sites == (context == "all"), context
        trace = snap["device_traces"][0]
        assert [e["action"] for e in trace] == ["alloc", "free_requested", "free_completed"], trace
        if context != "state":
            want = ["thealloc"] + 2 * ["thefree" if context == "all" else "thealloc"]
            assert [_caller(e["frames"]) for e in trace] == want, trace
        hist.record(None)
        assert lib.callback is None and hist.sites is None and not lib.free_sites


def test_history_context_changes_keep_earlier_frames(monkeypatch):
    """test_memory_plots_history_context: frames recorded under context
    "all" stay in the snapshot after the context goes to None and back
    (the site table is kept; a new one numbered the same would give the
    first allocation the later one's frames); what is allocated under
    None has no frames anywhere, nor has a free made under None."""
    import json
    lib, hist = _history(monkeypatch)
    held = []

    def should_capture1():
        held.append(lib.alloc(64))

    def should_not_capture():
        lib.free(held.pop())
        held.append(lib.alloc(48))

    def should_capture2():
        lib.free(held.pop())
        held.append(lib.alloc(64))

    hist.record(context="all", stacks="python")
    should_capture1()
    hist.record(context=None)
    assert lib.callback is None and hist.sites is None  # no frames asked for: no callback
    should_not_capture()
    hist.record(context="all", stacks="python")
    should_capture2()
    snap = hist.snapshot()
    ss = json.dumps(snap)
    assert "should_capture1" in ss and "should_capture2" in ss and "should_not_capture" not in ss, ss
    trace = snap["device_traces"][0]
    named = [(e["action"], _caller(e["frames"])) for e in trace]
    # The free made in should_capture2, under "all", shows its own stack.
    assert named == [("alloc", "should_capture1"), ("free_requested", None), ("free_completed", None),
                     ("alloc", None), ("free_requested", "should_capture2"), ("free_completed", "should_capture2"),
                     ("alloc", "should_capture2")], named
    # The live block has its allocation's frames; history off and on again
    # keeps them, as PyTorch's blocks keep theirs.
    hist.record(None)
    hist.record(context="state")
    blocks = [b for seg in hist.snapshot()["segments"] for b in seg["blocks"]]
    assert [_caller(b["frames"]) for b in blocks] == ["should_capture2"], blocks
    hist.record(None)


def test_history_sites_are_not_a_recordings(monkeypatch):
    """gpumem.torch.record() numbers its sites from 1 through the same
    library; a buffer it allocated keeps that id, which the history must
    not read as one of its own sites."""
    lib, hist = _history(monkeypatch)
    hist.record(context="all")
    lib.alloc(16)  # the history's first site
    lib.set_site_callback(None)
    lib.live[1] = (512, 1)  # as from a recording: site 1
    blocks = {b["address"]: b for seg in hist.snapshot()["segments"] for b in seg["blocks"]}
    assert blocks[1]["frames"] == [], blocks[1]
    assert all(b["frames"] for a, b in blocks.items() if a != 1), blocks
    hist.record(None)


def test_history_compile_context(monkeypatch):
    """compile_context=True (test_memory_compile_regions): an allocation
    made while code dynamo made runs carries that code's region, the
    innermost one where regions nest; outside compiled code, and on
    frees, "N/A". Under context None the region is still named, without
    frames."""
    def inner(lib, out):
        out.append(lib.alloc(32))

    def compiled_outer(lib, out):  # stands for dynamo's code of frame 0
        inner(lib, out)
        compiled_resume(lib, out)

    def compiled_resume(lib, out):  # stands for the resume function's, frame 1
        inner(lib, out)

    lib, hist = _history(monkeypatch, regions={compiled_outer.__code__: "Torch-Compiled Region: 0/0",
                                               compiled_resume.__code__: "Torch-Compiled Region: 1/0"})
    out = []
    hist.record(context="all", compile_context=True)
    inner(lib, out)
    compiled_outer(lib, out)
    lib.free(out.pop())
    trace = hist.snapshot()["device_traces"][0]
    assert [(e["action"], e["compile_context"]) for e in trace] == [
        ("alloc", "N/A"), ("alloc", "Torch-Compiled Region: 0/0"), ("alloc", "Torch-Compiled Region: 1/0"),
        ("free_requested", "N/A"), ("free_completed", "N/A")], trace
    hist.record(None)
    hist.record(context=None, compile_context=True)
    assert lib.callback is not None  # the regions need the callback
    compiled_outer(lib, out)
    snap = hist.snapshot()
    assert [e["compile_context"] for e in snap["device_traces"][0]] == [
        "Torch-Compiled Region: 0/0", "Torch-Compiled Region: 1/0"], snap["device_traces"]
    assert all(not e["frames"] for e in snap["device_traces"][0])
    live = {b["address"]: b for seg in snap["segments"] for b in seg["blocks"]}
    assert not live[out[-1]]["frames"] and live[out[0]]["frames"], live
    hist.record(None)
    # Without compile_context, no region is looked for.
    hist.record(context="all")
    compiled_outer(lib, out)
    assert {e["compile_context"] for e in hist.snapshot()["device_traces"][0]} == {"N/A"}
    hist.record(None)


def test_history_refuses_unknown_context(monkeypatch):
    import pytest
    lib, hist = _history(monkeypatch)
    for kw in ({"context": "alloc_and_free"}, {"stacks": "cpp"}, {"enabled": "trace"}):
        with pytest.raises(ValueError):
            hist.record(**kw)
    assert lib.ring is None and lib.callback is None


@needs_library
def test_history_context_through_the_library():
    """The same on the simulated device, through gpumem_alloc and
    gpumem_free (which asks for the free's site under "all") and the
    library's ring (internal/host/history.go): its
    time stamps and History's changes of context are on one clock, so an
    entry made right after a change is judged by the new context."""
    p = run("""
        import json, sys, types
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(device_count=lambda: 1,
                                           _utils=types.SimpleNamespace(_get_device_index=lambda d, optional=False: 0))
        sys.modules["torch"] = torch
        import gpumem
        from gpumem import _torchmem
        lib = gpumem.library()
        hist = _torchmem.History(lib)
        held = []
        def thealloc():
            held.append(lib._c.gpumem_alloc(3 << 20, 0, None))
        def thefree():
            lib._c.gpumem_free(held.pop(), 0, 0, None)
        for context in ("alloc", "all", "state", None):
            hist.record(context=context)
            thealloc()
            thefree()
            snap = hist.snapshot()
            trace = snap["device_traces"][0]
            ss = json.dumps(snap)
            print(context, ss.count("thealloc"), ss.count("thefree"), [e["action"] for e in trace])
            hist.record(None)
        hist.record(context="all")
        thealloc()
        hist.record(context=None)
        thefree()
        trace = hist.snapshot()["device_traces"][0]
        print("change", [(e["action"], bool(e["frames"])) for e in trace])
        hist.record(None)
    """, config=SIM)
    lines = p.stdout.splitlines()
    actions = "['alloc', 'free_requested', 'free_completed']"
    # Under "all" the free's two entries show the freeing function (the
    # library asked for the free's site: gpumem_set_free_sites).
    assert lines[:4] == [f"alloc 3 0 {actions}", f"all 1 2 {actions}", f"state 0 0 {actions}",
                         f"None 0 0 {actions}"], p.stdout
    assert lines[4] == "change [('alloc', True), ('free_requested', False), ('free_completed', False)]", p.stdout


def under_both(script):
    """Runs script under gpumem and under PyTorch's allocator, each in a
    process of its own; returns {allocator: its RESULT line's dict}."""
    return under_each(script, ("gpumem", "torch"))


SCRIPT = r"""
import json, os, pickle, sys, tempfile
import torch
if os.environ["ALLOCATOR"] == "gpumem":
    import gpumem.torch
    gpumem.torch.use()
import time
dev = torch.device("cuda")
began = time.time_ns() // 1000
torch.cuda.memory._record_memory_history(max_entries=100000)

def make(n):
    return torch.empty(n, dtype=torch.uint8, device=dev)

keep = [make(n << 20) for n in (1, 3, 5)]
gone = make(7 << 20)
del gone
torch.cuda.memory._set_memory_metadata("phase two")
keep.append(make(2 << 20))
torch.cuda.memory._set_memory_metadata("")
snap = torch.cuda.memory._snapshot()
out = {}
entries = snap["device_traces"][torch.cuda.current_device()]
meta = {e["size"]: e.get("user_metadata") for e in entries if e["action"] == "alloc"}
out["metadata"] = meta.get(2 << 20) == "phase two" and meta.get(1 << 20) == ""
out["time_us_epoch"] = all(began <= e["time_us"] <= time.time_ns() // 1000 for e in entries)
blocks = {}
for seg in snap["segments"]:
    for b in seg["blocks"]:
        blocks[b["address"]] = b
        assert seg["address"] <= b["address"] and b["address"] + b["size"] <= seg["address"] + seg["total_size"]
out["live_found"] = all(blocks.get(t.data_ptr(), {}).get("state") == "active_allocated" for t in keep)
frames = blocks.get(keep[1].data_ptr(), {}).get("frames", [])
out["frames_name_make"] = any(f.get("name") == "make" for f in frames)
trace = snap["device_traces"][torch.cuda.current_device()]
sizes = [e["size"] for e in trace if e["action"] == "alloc"]
out["allocs_traced"] = all(n << 20 in sizes for n in (1, 3, 5, 7))
out["free_traced"] = any(e["action"] == "free_requested" and e["size"] == 7 << 20 for e in trace)
out["trace_frames"] = any(f.get("name") == "make" for e in trace if e["action"] == "alloc" for f in e["frames"])
path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
torch.cuda.memory._dump_snapshot(path)
with open(path, "rb") as f:
    again = pickle.load(f)
out["dump_loads"] = len(again["segments"]) == len(snap["segments"])
from torch.cuda import _memory_viz
out["viz_trace"] = len(_memory_viz.trace_plot(again)) > 1000
out["viz_segments"] = len(_memory_viz.segment_plot(again)) > 1000
out["history_enabled"] = bool(torch._C._cuda_isHistoryEnabled()) if hasattr(torch._C, "_cuda_isHistoryEnabled") else True
torch.cuda.memory._record_memory_history(enabled=None)
st = torch.cuda.memory_stats()
out["stats_keys"] = all(k in st for k in ("active_bytes.all.allocated", "active_bytes.all.freed", "allocated_bytes.all.current",
                                          "reserved_bytes.all.current", "requested_bytes.all.current", "num_ooms"))
out["stats_active"] = st["allocated_bytes.all.current"] == torch.cuda.memory_allocated()
out["summary"] = torch.cuda.memory_summary().startswith("|====")
out["pickle"] = path
print("RESULT " + json.dumps(out))
"""


@needs_library
@needs_gpu
def test_history_snapshot_viz_and_import():
    results = under_both(SCRIPT)
    for allocator, r in results.items():
        bad = [k for k, v in r.items() if v is False]
        assert not bad, (allocator, bad, r)
    # gpumem import reads gpumem's snapshot back: a trace with the four
    # allocations and the free.
    trace = results["gpumem"]["pickle"] + ".trace"
    run(f"""
        import gpumem
        gpumem.library().import_snapshot({results["gpumem"]["pickle"]!r}, {trace!r})
    """, config=SIM)
    with open(trace) as f:
        lines = f.read().splitlines()
    sizes = [int(l.split()[2]) for l in lines if l.startswith("a ")]
    assert all(n << 20 in sizes for n in (1, 3, 5, 7)), lines[:20]
    assert any(l.startswith("f ") for l in lines), lines[:20]


@needs_library
def test_sites_name_each_stack_once_in_a_recording(tmp_path):
    """_torchmem.Sites as gpumem.torch.record() uses it, through the
    library's gpumem_alloc on the simulated device: each allocating stack is
    named once, with its frames, and the allocations carry its id."""
    path = tmp_path / "sites.trace"
    run(f"""
        import gpumem
        from gpumem import _lib, _torchmem
        lib = gpumem.library()
        lib.record_start(0, {str(path)!r})
        interned = _torchmem.Sites(lambda site, frames: lib.record_site(0, site, _torchmem.site_text(frames)))
        cb = _lib.SITE_CALLBACK(lambda device: interned.site() if device == 0 else 0)
        lib.set_site_callback(cb)
        def make(n):
            return lib._c.gpumem_alloc(n, 0, None)
        ptrs = [make(1 << 20) for _ in range(3)] + [lib._c.gpumem_alloc(2 << 20, 0, None)]
        lib.set_site_callback(_lib.SITE_CALLBACK())
        lib.record_stop(0)
    """, config=SIM)
    lines = open(path).read().splitlines()
    sites = [l for l in lines if l.startswith("s ")]
    allocs = [l.split() for l in lines if l.startswith("a ")]
    assert len(sites) == 2, sites
    assert any("make <string>" in s for s in sites), sites
    assert len(allocs) == 4 and len({a[5] for a in allocs[:3]}) == 1 and allocs[3][5] != allocs[0][5], allocs


MEMPOOL = r"""
import json, os
import torch
if os.environ["ALLOCATOR"] == "gpumem":
    import gpumem.torch
    gpumem.torch.use()
pool = torch.cuda.MemPool()
out = {"count_outside": pool.use_count()}
with torch.cuda.use_mem_pool(pool):
    out["count_inside"] = pool.use_count()
    x = torch.full((1 << 20,), 3.0, device="cuda")
y = torch.full((1 << 20,), 4.0, device="cuda")
blocks = [b for seg in pool.snapshot() for b in seg["blocks"] if b["state"] == "active_allocated"]
out["x_in_pool"] = any(b["address"] == x.data_ptr() for b in blocks)
out["y_not_in_pool"] = all(b["address"] != y.data_ptr() for b in blocks)
out["data"] = float(x.sum()) == 3.0 * (1 << 20) and float(y.sum()) == 4.0 * (1 << 20)
try:
    torch.cuda.MemPool(no_such_option=True)
    out["option"] = "accepted"
except Exception as e:
    out["option"] = type(e).__name__
print("RESULT " + json.dumps(out))
"""


@needs_library
@needs_gpu
def test_mempool_routes_like_pytorchs():
    """torch.cuda.MemPool and use_mem_pool: what is allocated inside comes
    from the pool, what is allocated after does not, and use_count counts
    the object and the open block: the same under both allocators.
    An argument MemPool does not take is the same TypeError under both."""
    results = under_both(MEMPOOL)
    assert results["torch"]["option"] == "TypeError", results
    assert results["gpumem"] == results["torch"], results
    assert results["gpumem"]["x_in_pool"] and results["gpumem"]["y_not_in_pool"] and results["gpumem"]["data"], results


MEMPOOL_OPTIONS = r"""
import ctypes, json, os, subprocess, tempfile
import torch
if os.environ["ALLOCATOR"] == "gpumem":
    import gpumem.torch
    gpumem.torch.use()
SOURCE = '''
#include <dlfcn.h>
#include <stddef.h>
typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*free_t)(unsigned long long);
int allocs, frees;
size_t alloc_bytes, free_bytes;
static alloc_t a;
static free_t f;
static void init(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    a = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    f = (free_t)dlsym(h, "cuMemFree_v2");
}
void *test_alloc(size_t size, int device, void *stream) {
    unsigned long long p = 0;
    if (!a) init();
    if (a(&p, size)) return NULL;
    allocs++;
    alloc_bytes += size;
    return (void *)p;
}
void test_free(void *ptr, size_t size, int device, void *stream) {
    if (!f) init();
    f((unsigned long long)ptr);
    frees++;
    free_bytes += size;
}
'''
d = tempfile.mkdtemp()
with open(os.path.join(d, "a.c"), "w") as fh:
    fh.write(SOURCE)
so = os.path.join(d, "liba.so")
subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", so, os.path.join(d, "a.c"), "-ldl"], check=True)
lib = ctypes.CDLL(so)
count = lambda name: ctypes.c_int.in_dll(lib, name).value
size = lambda name: ctypes.c_size_t.in_dll(lib, name).value
allocator = torch.cuda.memory.CUDAPluggableAllocator(so, "test_alloc", "test_free")
pool = torch.cuda.MemPool(allocator.allocator())
out = {}
with torch.cuda.use_mem_pool(pool):
    x = torch.full((1 << 20,), 3.0, device="cuda")
out["allocs_in_pool"] = count("allocs")
y = torch.full((1 << 20,), 4.0, device="cuda")
out["allocs_outside"] = count("allocs") - out["allocs_in_pool"]
out["data"] = float(x.sum()) == 3.0 * (1 << 20) and float(y.sum()) == 4.0 * (1 << 20)
out["frees_while_live"] = count("frees")
del x, pool
torch.cuda.synchronize()
torch.cuda.empty_cache()
out["frees_after"] = count("frees")
out["bytes_back"] = size("free_bytes") == size("alloc_bytes") > 0
whole = torch.cuda.MemPool(no_split=True)
with torch.cuda.use_mem_pool(whole):
    a = torch.empty(1 << 20, device="cuda")
    b = torch.empty(1 << 20, device="cuda")
segs = whole.snapshot()
out["no_split_segments"] = len(segs)
out["no_split_blocks"] = sorted(len(s["blocks"]) for s in segs)
print("RESULT " + json.dumps(out))
"""


@needs_library
@needs_gpu
def test_mempool_options_like_pytorchs():
    """MemPool(allocator): the pool's segments come from that allocator (a
    CUDAPluggableAllocator compiled here over cuMemAlloc), nothing outside
    the pool does, the data is right, and its memory goes back through it
    at the empty_cache after the pool and its tensors are gone; a
    no_split pool gives each buffer a segment of one block: the same
    figures under both allocators."""
    results = under_both(MEMPOOL_OPTIONS)
    assert results["gpumem"] == results["torch"], results
    r = results["gpumem"]
    assert r["allocs_in_pool"] == 1 and r["allocs_outside"] == 0 and r["data"], r
    assert r["frees_while_live"] == 0 and r["frees_after"] == 1 and r["bytes_back"], r
    assert r["no_split_segments"] == 2 and r["no_split_blocks"] == [1, 1], r


OOM_OBSERVER = r"""
import json, os
import torch
if os.environ["ALLOCATOR"] == "gpumem":
    import gpumem.torch
    gpumem.torch.use()
dev = torch.device("cuda")
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(0.05)
seen = []
torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(a))
keep = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
raised = None
try:
    torch.empty(int(total * 0.2), dtype=torch.uint8, device=dev)
except torch.cuda.OutOfMemoryError as e:
    raised = str(e).splitlines()[0][:40]
after = torch.empty(1 << 20, dtype=torch.uint8, device=dev)  # the process goes on
(device, size, limit, free), = seen
print("RESULT " + json.dumps(dict(
    calls=len(seen), device=device, size=size, raised=raised,
    limit_fraction=round(limit / total, 3), free_ok=0 < free <= total)))
"""


@needs_library
@needs_gpu
def test_oom_observer_like_pytorchs():
    """torch._C._cuda_attach_out_of_memory_observer: the observer is
    called once per out-of-memory, before PyTorch's error is raised, with
    PyTorch's arguments (device, request, the fraction's limit, the
    driver's free memory), the same under both allocators."""
    results = under_both(OOM_OBSERVER)
    ours, native = results["gpumem"], results["torch"]
    assert ours["calls"] == 1 and ours["raised"].startswith("CUDA out of memory. Tried to allocate"), ours
    # The request as each allocator rounds it: PyTorch's to 2 MiB.
    assert 0 <= native["size"] - ours["size"] < 2 << 20, results
    del ours["size"], native["size"]
    assert ours == native, results


CUDNN_BENCHMARK = r"""
import json, os
import torch
if os.environ["ALLOCATOR"] == "gpumem":
    import gpumem.torch
    gpumem.torch.use()
torch.manual_seed(0)
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda()
x = torch.randn(8, 16, 64, 64, device="cuda")
y = conv(x)
y.sum().backward()
ref = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double(), padding=1)
print("RESULT " + json.dumps(dict(err=float((y.double() - ref).abs().max()), grad=conv.weight.grad is not None)))
"""


@needs_library
@needs_gpu
def test_cudnn_benchmark():
    """torch.backends.cudnn.benchmark = True: cuDNN asks the allocator for
    its workspace size from C++ (cacheInfo), which a pluggable allocator
    refuses; under gpumem the convolution runs, forward and backward, with
    PyTorch's allocator's result."""
    results = under_both(CUDNN_BENCHMARK)
    for allocator, r in results.items():
        assert r["grad"] and r["err"] < 1e-3, (allocator, r)


ACCELERATOR_STATS = r"""
import gc, json, os
import torch
if os.environ["ALLOCATOR"] == "gpumem":
    import gpumem.torch
    gpumem.torch.use()
acc = torch.accelerator
x = torch.empty(1, device="cuda")
gc.collect()
acc.empty_cache()
acc.reset_peak_memory_stats()
acc.reset_accumulated_memory_stats()
before = acc.memory_stats()["active_bytes.all.current"]
tmp = torch.randn(256, device="cuda")
grew = acc.memory_stats()["active_bytes.all.current"] - before
nested = torch.cuda.memory_stats_as_nested_dict()["active_bytes"]["all"]["current"] - before
del tmp
gc.collect()
acc.empty_cache()
print("RESULT " + json.dumps(dict(
    grew=grew, nested=nested, back=acc.memory_stats()["active_bytes.all.current"] == before,
    freed=acc.memory_stats()["active_bytes.all.freed"],
    allocated_is_stats=acc.memory_allocated() == acc.memory_stats()["allocated_bytes.all.current"])))
"""


@needs_library
@needs_gpu
def test_accelerator_memory_functions():
    """torch.accelerator's memory functions (PyTorch's test_memory_stats
    reads them) and memory_stats_as_nested_dict answer under gpumem as
    under PyTorch's allocator: 1 KiB more active for a 256-float tensor,
    back after its free, the free counted."""
    results = under_both(ACCELERATOR_STATS)
    assert results["gpumem"] == results["torch"], results
    assert results["gpumem"]["grew"] == 1024 and results["gpumem"]["back"], results


def test_mempool_arguments_bound_as_pytorchs(monkeypatch):
    """gpumem's MemPool takes the arguments the installed PyTorch's MemPool
    takes, bound the same way: one it does not take is its TypeError; one
    it takes that gpumem lacks (symmetric, in a PyTorch that has it) is a
    one-line RuntimeError naming gpumem; no_split and use_on_oom make the
    pool with those options; an allocator gpumem was not shown is refused
    with one line. No torch needed: a stand-in with PyTorch's signature."""
    import sys
    import types
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
    from gpumem import torch as gtorch

    class PyTorchsMemPool:  # the later signature, with symmetric
        def __init__(self, allocator=None, use_on_oom=False, symmetric=False, no_split=False):
            pass

    ids = iter(range(1, 100))
    cuda = _fake_module("torch.cuda", MemPool=PyTorchsMemPool, current_device=lambda: 0,
                        graph_pool_handle=lambda: (0, next(ids)))
    fake = _fake_module("torch", cuda=cuda, _C=_fake_module("torch._C"))
    made = []

    class Lib:
        def pool_retain(self, device, pool):
            made.append(("retain", pool))

        def pool_create(self, device, pool, alloc=0, free=0, no_split=False, use_on_oom=False):
            made.append(("create", pool, alloc, free, no_split, use_on_oom))

        def pool_drop(self, device, pool):
            made.append(("drop", pool))

    monkeypatch.setitem(gtorch._state, "allocator", types.SimpleNamespace(allocator=lambda: "gpumem's"))
    gtorch._patch_mempool(fake, Lib())
    MemPool = cuda.MemPool
    assert MemPool is not PyTorchsMemPool
    p = MemPool()
    q = MemPool(None, True)  # positional, as PyTorch's binds them
    r = MemPool(no_split=True)
    assert made == [("retain", p.id), ("create", q.id, 0, 0, False, True), ("create", r.id, 0, 0, True, False)], made
    assert p.allocator is None
    try:
        MemPool(no_such_option=1)
    except TypeError:
        pass
    else:
        raise AssertionError("an argument PyTorch's MemPool does not take was accepted")
    for bad, words in ((lambda: MemPool(symmetric=True), "symmetric=True"),
                       (lambda: MemPool(allocator=object()), "does not know this allocator")):
        try:
            bad()
        except RuntimeError as e:
            msg = str(e)
            assert msg.startswith("gpumem:") and "\n" not in msg and words in msg, msg
        else:
            raise AssertionError(f"{words}: accepted")
    assert len(made) == 3, made  # the refused ones made nothing


PROFILE_MEMORY = r"""
import json, os
import torch
if os.environ["ALLOCATOR"] == "gpumem":
    import gpumem.torch
    gpumem.torch.use()
torch.zeros(1, device="cuda")
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
    x = torch.empty(1 << 20, device="cuda")
    y = x * 2
    del x, y
usage = lambda e: getattr(e, "device_memory_usage", None) or getattr(e, "cuda_memory_usage", 0) or 0
events = [e for e in prof.events() if usage(e) != 0]
print("RESULT " + json.dumps({"memory_events": len(events) > 0,
                              "allocated": sum(usage(e) for e in events if usage(e) > 0) >= 4 << 20}))
"""


@needs_library
@needs_gpu
def test_profiler_sees_memory_like_pytorchs():
    """torch.profiler with profile_memory sees the device memory allocated
    and freed under gpumem (the library reports each to PyTorch's
    profiler, as PyTorch's allocator does): the same answers under both."""
    results = under_both(PROFILE_MEMORY)
    assert results["torch"] == {"memory_events": True, "allocated": True}, results
    assert results["gpumem"] == results["torch"], results


CPP_HISTORY = r"""
import json, os
import torch
if os.environ["ALLOCATOR"] == "gpumem":
    import gpumem.torch
    gpumem.torch.use()
x = torch.empty(1 << 20, device="cuda")
out = {}
def first_line(fn):
    try:
        fn()
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return None
# The C++ calls (as a C++ extension's torch::cuda::_record_memory_history
# and _memory_snapshot_pickled make them), through PyTorch's own bindings.
out["record"] = first_line(lambda: torch.cuda.memory._record_memory_history_impl("all"))
out["snapshot"] = first_line(lambda: torch._C._cuda_memorySnapshot(None))
first_line(lambda: torch.cuda.memory._record_memory_history_impl(None))
# The Python calls still work, and the process goes on.
torch.cuda.memory._record_memory_history()
y = torch.empty(1 << 20, device="cuda")
out["python_snapshot"] = any(b.get("state") == "active_allocated" for s in torch.cuda.memory._snapshot()["segments"]
                             for b in s["blocks"])
torch.cuda.memory._record_memory_history(enabled=None)
print("RESULT " + json.dumps(out))
"""


@needs_library
@needs_gpu
def test_cpp_history_fails_with_gpumems_line():
    """C++ memory history (the allocator's recordHistory and snapshot,
    which PyTorch's test_cpp_memory_snapshot_pickle reaches from a C++
    extension) cannot be answered from C: under gpumem each fails at once
    with gpumem's one line naming the Python calls that work, and those
    work; under PyTorch's allocator both succeed."""
    results = under_both(CPP_HISTORY)
    native, ours = results["torch"], results["gpumem"]
    assert native == {"record": None, "snapshot": None, "python_snapshot": True}, native
    assert ours["record"].startswith("gpumem: C++ memory history (torch::cuda::_record_memory_history"), ours
    assert "torch.cuda.memory._record_memory_history from Python is" in ours["record"], ours
    assert ours["snapshot"].startswith("gpumem: a C++ memory snapshot (torch::cuda::_memory_snapshot_pickled"), ours
    assert ours["python_snapshot"] is True, ours


def test_snapshot_augmented_with_fx_traces(monkeypatch, tmp_path):
    """_snapshot(augment_with_fx_traces=True) and _dump_snapshot(...,
    augment_with_fx_traces=True) hand gpumem's snapshot to PyTorch's own
    pass (torch.cuda.memory._augment_memory_snapshot_stack_traces), as
    PyTorch's do, and without the flag do not; a PyTorch without that pass
    is a TypeError, as its _snapshot would be. No torch needed: stand-ins."""
    import pickle
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
    from gpumem import torch as gtorch
    seen = []

    def augment(snap):
        seen.append(snap)
        return dict(snap, augmented=True)

    memory = _fake_module("torch.cuda.memory", _snapshot=None, _dump_snapshot=None, memory_snapshot=None,
                          _record_memory_history=None, _set_memory_metadata=None, _get_memory_metadata=None,
                          _augment_memory_snapshot_stack_traces=augment)
    cuda = _fake_module("torch.cuda", memory=memory, device_count=lambda: 1)
    fake = _fake_module("torch", cuda=cuda, _C=_fake_module("torch._C"))
    monkeypatch.setitem(sys.modules, "torch", fake)
    lib = _FakeLib()
    monkeypatch.setitem(gtorch._state, "history", None)
    gtorch._patch_history(fake, lib)
    hist = gtorch._state["history"]
    monkeypatch.setattr(hist, "snapshot", lambda device=None: {"segments": [], "device_traces": [[]]})
    assert "augmented" not in memory._snapshot() and not seen
    assert memory._snapshot(augment_with_fx_traces=True)["augmented"] and len(seen) == 1
    path = tmp_path / "s.pickle"
    memory._dump_snapshot(str(path), augment_with_fx_traces=True)
    assert pickle.loads(path.read_bytes())["augmented"] and len(seen) == 2
    memory._dump_snapshot(str(path))
    assert "augmented" not in pickle.loads(path.read_bytes()) and len(seen) == 2
    del memory._augment_memory_snapshot_stack_traces
    try:
        memory._snapshot(augment_with_fx_traces=True)
    except TypeError as e:
        assert str(e).startswith("gpumem:"), e
    else:
        raise AssertionError("augmented without PyTorch's pass")


# torch.cuda.memory_stats()'s keys as PyTorch 2.11's caching allocator
# names them (c10/cuda/CUDACachingAllocator.h, DeviceStats;
# torch/cuda/memory.py, memory_stats).
def _pytorch_keys():
    keys = set()
    for name in ("allocated_bytes", "active_bytes", "inactive_split_bytes", "reserved_bytes", "requested_bytes",
                 "allocation", "active", "inactive_split", "segment"):
        for pool in ("all", "large_pool", "small_pool"):
            for fig in ("current", "peak", "allocated", "freed"):
                keys.add(f"{name}.{pool}.{fig}")
    for name in ("oversize_allocations", "oversize_segments"):
        for fig in ("current", "peak", "allocated", "freed"):
            keys.add(f"{name}.{fig}")
    keys.update(("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
                 "max_split_size"))
    return keys


def test_memory_stats_has_pytorchs_keys_but_what_gpumem_keeps_no_figure_for():
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
    from gpumem import _torchmem
    s = _Stats(live_buffers=3, peak_live_buffers=7, allocs=10, frees=7, segments=2, peak_segments=4, fences=5)
    st = _torchmem.memory_stats(s)
    assert st["allocation.all.peak"] == 7 and st["active.large_pool.peak"] == 7 and st["allocation.small_pool.peak"] == 0
    assert st["segment.all.peak"] == 4 and st["num_sync_all_streams"] == 5
    assert st["oversize_allocations.current"] == 0 and st["oversize_segments.peak"] == 0 and st["max_split_size"] == -1
    missing = _pytorch_keys() - set(st)
    # No figure kept: inactive split blocks (count and the peaks and totals
    # of their bytes), and the bytes reserved and released over time.
    want = {f"inactive_split.{p}.{f}" for p in ("all", "large_pool", "small_pool")
            for f in ("current", "peak", "allocated", "freed")}
    want |= {f"inactive_split_bytes.{p}.{f}" for p in ("all", "large_pool", "small_pool")
             for f in ("peak", "allocated", "freed")}
    want |= {f"reserved_bytes.{p}.{f}" for p in ("all", "large_pool", "small_pool") for f in ("allocated", "freed")}
    assert missing == want, sorted(missing ^ want)
    # An older library reports no peak counts: the keys are left out, not 0.
    old = _torchmem.memory_stats(_Stats(live_buffers=3, segments=2))
    assert "allocation.all.peak" not in old and "segment.all.peak" not in old
