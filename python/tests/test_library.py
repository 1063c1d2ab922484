"""The library through ctypes, on the simulated device: runs anywhere the
library is built, with or without a GPU."""

import gzip
import json
import os

import pytest

from conftest import library_path, needs_library, run

SIM = "device=sim,capacity=4GiB,check=true"


@needs_library
def test_load_and_version():
    p = run("""
        import gpumem
        lib = gpumem.library()
        print(gpumem.version())
        print(lib.c.gpumem_api_version())
    """)
    version, api = p.stdout.split("\n")[:2]
    assert version.startswith("gpumem")
    assert api == "1"


def test_missing_library_is_one_clear_line():
    p = run("""
        import gpumem
        try:
            gpumem.library()
        except gpumem.GpumemError as e:
            print("ERR", e)
    """, env={"GPUMEM_LIBRARY": "/nonexistent/libgpumem.so"})
    assert p.stdout.startswith("ERR gpumem: libgpumem.so not found")
    assert "/nonexistent/libgpumem.so" in p.stdout and "GPUMEM_LIBRARY" in p.stdout
    assert p.stdout.count("\n") == 1


def test_foreign_library_is_refused():
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                            "/lib64/libc.so.6") if os.path.exists(p))
    p = run("""
        import gpumem
        try:
            gpumem.library()
        except gpumem.GpumemError as e:
            print("ERR", e)
    """, env={"GPUMEM_LIBRARY": libc})
    assert p.stdout.startswith("ERR gpumem: ") and "is not a gpumem library" in p.stdout


@needs_library
@needs_library
def test_config_set_in_os_environ_is_read():
    """GPUMEM_CONFIG put in os.environ by the program, before its first
    gpumem call, is the configuration (the Go runtime's own copy of the
    environment is the one the process started with, which does not have
    it: the limit was silently ignored)."""
    p = run("""
        import os
        os.environ["GPUMEM_CONFIG"] = "device=sim,capacity=4GiB,limit=1600MiB"
        import gpumem
        lib = gpumem.library()
        lib.allocate(1 << 20, 0, 0)
        print(gpumem.stats(0)["limit"] >> 20)
    """, env={"GPUMEM_CONFIG": ""})
    assert p.stdout.split() == ["1600"], p.stdout


def test_run_dir_set_in_os_environ_is_read(tmp_path):
    """GPUMEM_RUN_DIR put in os.environ by the program, after the library
    loaded and before its first allocation, is where a served pool
    announces itself for gpumem top and gpumem serve (internal/announce
    reads it with os.Getenv, which sees it: checked, 2026-11-29)."""
    run_dir = tmp_path / "announce"
    p = run(f"""
        import os
        import gpumem
        lib = gpumem.library()
        os.environ["GPUMEM_RUN_DIR"] = {str(run_dir)!r}
        os.environ["GPUMEM_CONFIG"] = "device=sim,capacity=4GiB,serve=127.0.0.1:0"
        lib.allocate(1 << 20, 0, 0)
        print(os.getpid())
    """, env={"GPUMEM_CONFIG": "", "GPUMEM_RUN_DIR": ""})
    pid = p.stdout.split()[-1]
    assert (run_dir / pid).read_text().startswith("127.0.0.1:"), list(run_dir.iterdir()) if run_dir.exists() else p.stderr


def test_allocate_free_stats():
    run("""
        import gpumem
        from gpumem import _lib
        lib = gpumem.library()
        ptrs = [lib.allocate(1 << 20, 0, 0) for _ in range(8)]
        assert all(ptrs) and len(set(ptrs)) == 8
        s = gpumem.stats(0)
        assert s["allocated"] == 8 << 20 and s["live_buffers"] == 8, s
        assert s["reserved"] >= 8 << 20
        # the counts alone (gpumem_get_usage), as the stats give them
        u = lib.usage(0)
        assert {n: getattr(u, n) for n, _ in _lib.Usage._fields_} == {n: s[n] for n, _ in _lib.Usage._fields_}, (s, u)
        assert u.allocated == 8 << 20 and u.active >= u.allocated and u.peak_reserved >= u.reserved > 0
        # the host time of the driver calls that grew it (the simulated device's)
        assert s["device_calls"] > 0 and s["driver_ns"] > 0 and s["wait_ns"] == 0, s
        assert s["misses"] > 0 and s["miss_ns"] >= s["driver_ns"], s
        # which calls that time went to: the creates' and maps' parts of it
        assert 0 < s["create_ns"] + s["map_ns"] + s["set_access_ns"] <= s["driver_ns"], s
        assert s["create_ns"] > 0 and s["unmap_ns"] == 0 and s["release_ns"] == 0, s
        # one stream: no event call yet
        assert s["event_calls"] == 0 and s["event_ns"] == 0, s
        for p in ptrs:
            lib.deallocate(p, 0)
        s = gpumem.stats(0)
        assert s["allocated"] == 0 and s["frees"] == 8 and s["cached"] == s["reserved"] > 0, s
        # a trim fences the stream first: an event recorded (and waited for)
        lib.trim(0)
        s = gpumem.stats(0)
        assert s["event_calls"] > 0 and s["event_ns"] > 0 and s["reserved"] == 0, s
        # one stream: no other stream's epoch, so no marker's write
        assert s["mark_calls"] == 0 and s["mark_ns"] == 0, s
        # free by pointer alone
        p = lib.allocate(4096, 0, 7)
        lib.deallocate(p, -1)
        # double free and foreign pointers: errors that change nothing
        for bad in (p, 0x123400):
            try:
                lib.deallocate(bad, 0)
            except gpumem.GpumemError as e:
                assert e.status == _lib.ERROR_INVALID_POINTER, e.status
                assert hex(bad) in str(e), str(e)
            else:
                raise AssertionError("no error")
        assert gpumem.stats(0)["frees"] == 9
        # size 0 and pointer 0 are no-ops
        assert lib.allocate(0, 0, 0) == 0
        lib.deallocate(0, 0)
        gpumem.trim()
        assert gpumem.stats(0)["reserved"] == 0
        snap = gpumem.snapshot(0)
        assert snap["mode"] == "virtual", snap.keys()
        print("ok")
    """, config=SIM)


@needs_library
def test_out_of_memory_verdict():
    p = run("""
        import gpumem
        gpumem.configure(limit="1GiB")
        lib = gpumem.library()
        keep = lib.allocate(700 << 20, 0, 0)
        try:
            lib.allocate(600 << 20, 0, 0)
        except gpumem.OutOfMemoryError as e:
            v = e.verdict
            print(v.cause, v.requested, v.limit, v.would_fit, v.allocated)
            print(str(e))
            assert gpumem.last_oom().cause == "limit"
        # what would have fit, fits
        q = lib.allocate(v.would_fit, 0, 0)
        lib.deallocate(q, 0)
        lib.deallocate(keep, 0)
        assert gpumem.stats(0)["ooms"] == 1
    """, config=SIM)
    cause, requested, limit, would_fit, allocated = p.stdout.split("\n")[0].split()
    assert cause == "limit" and int(requested) == 600 << 20 and int(limit) == 1 << 30
    assert int(allocated) == 700 << 20
    assert (300 << 20) <= int(would_fit) <= (324 << 20)
    msg = p.stdout.split("\n")[1]
    assert msg.startswith("gpumem: out of memory (allocator limit)") and "would have fit" in msg


@needs_library
def test_request_larger_than_the_device_fails_at_once():
    # A petabyte (the largest size accepted) in a process we are loaded
    # into: the limit's verdict, with no arena reserved for it (its books
    # took 10 s and 6 GB of the host's memory before) and nothing held.
    run("""
        import gpumem
        lib = gpumem.library()
        keep = lib.allocate(1 << 20, 0, 0)
        before = gpumem.stats(0)
        try:
            lib.allocate(1 << 50, 0, 0)
            raise SystemExit("a petabyte was allocated")
        except gpumem.OutOfMemoryError as e:
            assert e.verdict.cause == "limit" and e.verdict.requested == 1 << 50, e.verdict
        after = gpumem.stats(0)
        assert after["segments"] == before["segments"] and after["reserved"] == before["reserved"], (before, after)
        assert after["ooms"] == 1 and after["retries"] == 0, after
        lib.deallocate(keep, 0)
    """, config=SIM)


@needs_library
def test_out_of_memory_verdict_what_would_have_fit():
    # Fragmentation in mode=plain: five 20 MiB segments under a limit of
    # 100 MiB, each with a live 9 MiB buffer and 11 MiB free. No trim helps;
    # virtual-memory spans would (the same program in mode=virtual gets the
    # request); 11 MiB is the largest request that fits. Then, with 64 MiB
    # preallocated, a request that only a trim makes room for.
    code = """
        import json, gpumem
        lib = gpumem.library()
        gpumem.configure(MODE)
        def oom(size):
            try:
                lib.allocate(size, 0, 0)
            except gpumem.OutOfMemoryError as e:
                assert gpumem.last_oom().as_dict() == e.verdict.as_dict()
                return e.verdict
            raise AssertionError("no OutOfMemoryError")
        second = []
        for _ in range(5):
            lib.allocate(9 << 20, 0, 0)
            second.append(lib.allocate(9 << 20, 0, 0))
        for p in second:
            lib.deallocate(p, 0)
        try:
            lib.deallocate(lib.allocate(30 << 20, 0, 0), 0)
            print("fits")
        except gpumem.OutOfMemoryError as e:
            v = e.verdict
            print(json.dumps(v.as_dict()))
            lib.deallocate(lib.allocate(v.would_fit, 0, 0), 0)
    """
    plain = run(code.replace("MODE", '"mode=plain,limit=100MiB"'), config=SIM).stdout.splitlines()
    v = json.loads(plain[0])
    assert v["cause"] == "fragmentation" and v["mode"] == "plain", v
    assert v["after_trim"] == "no" and v["with_virtual"] == "yes", v
    assert v["pinned"] == 55 << 20 and v["releasable"] == 0 and v["cached"] == v["pinned"] + v["releasable"], v
    assert v["would_fit"] == v["largest_free"] == 11 << 20 and v["free_total"] == 55 << 20, v
    assert v["requested"] == 30 << 20 and v["limit"] == 100 << 20 and v["allocated"] == 45 << 20, v
    assert v["total"] == 4 << 30 and v["others"] == 0 and v["growth"] == 30 << 20, v
    assert v["message"].startswith("gpumem: out of memory (fragmentation): requested 30.00 MiB"), v
    assert "empty_cache): no, the 55.00 MiB cached lies in segments that hold live buffers" in v["message"], v
    assert "With virtual-memory spans: yes" in v["message"], v
    virtual = run(code.replace("MODE", '"mode=virtual,limit=100MiB"'), config=SIM).stdout.splitlines()
    assert virtual == ["fits"], virtual

    p = run("""
        import gpumem
        lib = gpumem.library()
        gpumem.configure("mode=plain,limit=100MiB,preallocate=64MiB")
        try:
            lib.allocate(80 << 20, 0, 0)
        except gpumem.OutOfMemoryError as e:
            v = e.verdict
            print(v.cause, v.after_trim, v.releasable, v.pinned)
        gpumem.trim()
        lib.deallocate(lib.allocate(80 << 20, 0, 0), 0)
        print("fits after trim")
    """, config=SIM)
    assert p.stdout.splitlines() == ["fragmentation yes %d 0" % (64 << 20), "fits after trim"], p.stdout


@needs_library
def test_configuration_errors():
    p = run("""
        import gpumem
        try:
            gpumem.library().allocate(1 << 20, 0, 0)
        except gpumem.GpumemError as e:
            print(e.status, e)
    """, config="limit=plenty")
    assert p.stdout.startswith("6 GPUMEM_CONFIG=\"limit=plenty\": gpumem: bad configuration: limit=plenty")
    run("""
        import gpumem
        lib = gpumem.library()
        p = lib.allocate(1 << 20, 0, 0)
        try:
            gpumem.configure("mode=plain")
        except gpumem.GpumemError as e:
            assert "mode cannot change once a device is in use" in str(e), e
        else:
            raise AssertionError("mode changed after use")
        gpumem.configure(limit=0.5)
        free, total = lib.mem_info(0)
        assert total == 2 << 30, total
        for bad in (0, -1, 1.5, True, [1]):
            try:
                gpumem.configure(limit=bad)
            except (ValueError, TypeError):
                pass
            else:
                raise AssertionError(f"limit={bad!r} accepted")
        lib.deallocate(p, 0)
    """, config=SIM)


@needs_library
def test_threads():
    run("""
        import threading, gpumem
        lib = gpumem.library()
        errors = []
        def work(stream):
            try:
                live = []
                for i in range(3000):
                    live.append(lib.allocate((i % 13 + 1) * 8192, stream % 2, stream))
                    if len(live) > 16:
                        lib.deallocate(live.pop(0), -1)
                for p in live:
                    lib.deallocate(p, stream % 2)
            except Exception as e:
                errors.append(e)
        ts = [threading.Thread(target=work, args=(s,)) for s in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        assert not errors, errors
        for d in (0, 1):
            s = gpumem.stats(d)
            assert s["allocated"] == 0 and s["allocs"] == s["frees"] == 12000, s
    """, config=SIM)


@needs_library
def test_record(tmp_path):
    path = tmp_path / "rec.trace.gz"
    run(f"""
        import gpumem
        from gpumem import _lib
        lib = gpumem.library()
        before = lib.allocate(1 << 20, 0, 0)   # not in the trace, nor its free
        lib.record_start(0, {str(path)!r})
        lib.record_site(0, 1, "train train.py:12 < main train.py:40")
        sites = _lib.SITE_CALLBACK(lambda dev: 1)
        lib.set_site_callback(sites)
        a = lib.c.gpumem_alloc(3 << 20, 0, 5)   # the PyTorch entry point asks for sites
        b = lib.allocate(4096, 0, 0)
        lib.deallocate(a, 0)
        lib.deallocate(before, 0)
        lib.record_stop(0)
        lib.deallocate(b, 0)
        try:
            lib.record_stop(0)
        except gpumem.GpumemError as e:
            assert "not being recorded" in str(e)
    """, config=SIM)
    lines = gzip.open(path, "rt").read().splitlines()
    assert lines[0].startswith("# gpumem-trace v1")
    events = [l.split() for l in lines[1:] if not l.startswith("#")]
    assert events[0][:2] == ["s", "1"] and " ".join(events[0][2:]) == "train train.py:12 < main train.py:40"
    assert events[1][:4] == ["a", "0", str(3 << 20), "5"] and events[1][5] == "1"
    assert events[2][:4] == ["a", "1", "4096", "0"] and len(events[2]) == 5
    assert events[3][:2] == ["f", "0"]
    assert len(events) == 4, events


@needs_library
def test_c_header_matches_library(tmp_path):
    """gpumem.h compiles and links against the library (a C user's view)."""
    import shutil
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        import pytest
        pytest.skip("no C compiler")
    src = tmp_path / "t.c"
    src.write_text('''
        #include <stdio.h>
        #include "gpumem.h"
        int main(void) {
            void *p = gpumem_alloc(1 << 20, 0, 0);
            gpumem_stats s;
            if (!p || gpumem_get_stats(0, &s, sizeof s) != GPUMEM_SUCCESS || s.allocated != 1 << 20) return 1;
            gpumem_free(p, 1 << 20, 0, 0);
            if (gpumem_deallocate(p, 0) != GPUMEM_ERROR_INVALID_POINTER) return 2;
            printf("%s\\n", gpumem_status_name(gpumem_last_status()));
            return 0;
        }''')
    lib = library_path()
    inc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.pardir, "clib")
    exe = tmp_path / "t"
    subprocess.run([cc, "-Wall", "-Werror", "-I", inc, str(src), lib, "-o", str(exe),
                    "-Wl,-rpath," + os.path.dirname(lib)], check=True)
    out = subprocess.run([str(exe)], env={**os.environ, "GPUMEM_CONFIG": SIM}, capture_output=True, text=True)
    assert out.returncode == 0, out
    assert out.stdout.strip() == "GPUMEM_ERROR_INVALID_POINTER"


@needs_library
def test_import_snapshot(tmp_path):
    """The importer of `gpumem import`, through the library (what
    gpumem.torch.record uses under PyTorch's own allocator)."""
    fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                           "testdata", "fixtures", "resnet18_snapshot.pickle")
    out = tmp_path / "r18.trace.gz"
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(open(fixture, "rb").read()[:5000])
    p = run(f"""
        import gpumem
        from gpumem import _lib
        lib = gpumem.library()
        lib.import_snapshot({fixture!r}, {str(out)!r})
        try:
            lib.import_snapshot({str(bad)!r}, {str(tmp_path / 'x.trace')!r})
        except gpumem.GpumemError as e:
            print(e.status == _lib.ERROR_FORMAT, e)
    """)
    ok, msg = p.stdout.split(" ", 1)
    assert ok == "True" and "bad.pickle" in msg, p.stdout
    lines = gzip.open(out, "rt").read().splitlines()
    assert sum(1 for l in lines if l.startswith("a ")) == 657


@needs_library
def test_serve():
    """gpumem.serve: the process's allocators read over HTTP, the metrics in
    Prometheus's text format."""
    p = run("""
        import json, urllib.request, gpumem
        lib = gpumem.library()
        keep = lib.allocate(3 << 20, 0, 0)
        addr = gpumem.serve("127.0.0.1:0")
        assert gpumem.serve("127.0.0.1:0") == addr   # one server per process
        stats = json.load(urllib.request.urlopen(f"http://{addr}/debug/gpumem/stats"))
        print(stats["0"]["stats"]["Allocated"])
        metrics = urllib.request.urlopen(f"http://{addr}/metrics").read().decode()
        print([l for l in metrics.splitlines() if l.startswith("gpumem_live_buffers")][0])
    """, config=SIM)
    lines = p.stdout.splitlines()
    assert lines[0] == str(3 << 20)
    assert lines[1] == 'gpumem_live_buffers{device="0",pool="gpumem"} 1'


@needs_library
def test_defrag_counters():
    """With defrag=true, spans stranded by one live 2 MiB buffer each are
    split before a large request grows the pool: gpumem_stats carries the
    splits, copies, bytes and time, as the JSON stats do."""
    p = run("""
        import json
        import gpumem
        lib = gpumem.library()
        big = [lib.allocate(16 << 20, 0, 0) for _ in range(8)]
        for q in big:
            lib.deallocate(q, 0)
        small = [lib.allocate(2 << 20, 0, 0) for _ in range(64)]
        live = [q for i, q in enumerate(small) if i % 8 == 3]
        for i, q in enumerate(small):
            if i % 8 != 3:
                lib.deallocate(q, 0)
        live.append(lib.allocate(100 << 20, 0, 0))
        print(json.dumps(gpumem.stats(0)))
        print(lib.stats_json(0))
    """, config=SIM + ",defrag=true")
    s, j = (json.loads(line) for line in p.stdout.splitlines()[:2])
    assert s["splits"] >= 6 and s["copies"] >= s["splits"] and s["split_ns"] > 0, s
    assert s["copied_bytes"] >= s["splits"] * (2 << 20), s
    for key, go in (("splits", "Splits"), ("copies", "Copies"), ("copied_bytes", "CopiedBytes"), ("split_ns", "SplitNanos")):
        assert s[key] == j[go], (key, s[key], j)


@needs_library
def test_gather_config():
    """gather=true in the configuration string: under a limit the stranded
    spans fill, the large request that fails without it (its message
    naming gather and its risk: another thread's writes lost with no
    error) is served, the spans split on the way."""
    script = """
        import json
        import gpumem
        lib = gpumem.library()
        big = [lib.allocate(16 << 20, 0, 0) for _ in range(8)]
        for q in big:
            lib.deallocate(q, 0)
        small = [lib.allocate(2 << 20, 0, 0) for _ in range(64)]
        for i, q in enumerate(small):
            if i % 8 != 3:
                lib.deallocate(q, 0)
        try:
            lib.allocate(100 << 20, 0, 0)
            print(json.dumps({"served": True, "splits": gpumem.stats(0)["splits"]}))
        except gpumem.GpumemError as e:
            print(json.dumps({"served": False, "names_gather": "gather=true" in str(e),
                              "names_risk": "writes to the moved memory are lost with no error" in str(e)}))
    """
    # span_size=16MiB: the default would tighten under this limit (smaller
    # spans, best-fit placement) and strand nothing, splits or not.
    strand = SIM + ",limit=128MiB,span_size=16MiB"
    without = json.loads(run(script, config=strand).stdout.splitlines()[0])
    with_gather = json.loads(run(script, config=strand + ",gather=true").stdout.splitlines()[0])
    tight = json.loads(run(script, config=SIM + ",limit=128MiB").stdout.splitlines()[0])
    assert without == {"served": False, "names_gather": True, "names_risk": True}, without
    assert with_gather["served"] and with_gather["splits"] >= 6, with_gather
    assert tight == {"served": True, "splits": 0}, tight


@needs_library
def test_pool_options():
    """gpumem_pool_create through the C library on the simulated device: a
    pool with an allocator of its own (C functions, here Python callbacks
    handing out addresses of their own) takes its segments from it alone,
    counted against the limit, and gives each back with its size at the
    trim after its last use; an allocation outside every pool that would
    run out of memory is served by the use_on_oom pool's free memory, at
    its freed buffer's address; a no_split pool gives each buffer a
    segment; a second create of the same pool is refused; a pool whose
    object is gone (pool_drop) gives its memory back at once."""
    run("""
        import ctypes
        import gpumem
        from gpumem import _lib
        lib = gpumem.library()
        ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        given, freed, nxt = {}, [], [0x7e0000000000]
        def alloc(size, device, stream):
            p = nxt[0]
            nxt[0] += (size + (2 << 20) - 1) // (2 << 20) * (2 << 20)
            given[p] = size
            return p
        def free(ptr, size, device, stream):
            freed.append((ptr, size))
        alloc_c, free_c = ALLOC(alloc), FREE(free)
        addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value
        MiB = 1 << 20
        keep, use, whole = (0, 1), (0, 2), (0, 3)
        lib.pool_create(0, keep, alloc=addr(alloc_c), free=addr(free_c))
        lib.pool_create(0, use, alloc=addr(alloc_c), free=addr(free_c), use_on_oom=True)
        lib.pool_create(0, whole, no_split=True)
        try:
            lib.pool_create(0, keep)
        except gpumem.GpumemError as e:
            assert e.status == _lib.ERROR_INVALID_VALUE and "(0, 1)" in str(e), str(e)
        else:
            raise AssertionError("a pool made twice")
        def in_pool(pool, size):
            lib.pool_begin(0, pool, route=_lib.POOL_ALL)
            try:
                return lib.allocate(size, 0, 0)
            finally:
                lib.pool_end(0, pool)
                lib.pool_release(0, pool)  # the use pool_begin counted
        a, b = in_pool(keep, 40 * MiB), in_pool(use, 40 * MiB)
        assert a in given and b in given and given[a] == given[b] == 40 * MiB, (given, a, b)
        def out_of_memory(size, why):
            try:
                lib.allocate(size, 0, 0)
            except gpumem.GpumemError as e:
                assert e.status == _lib.ERROR_OUT_OF_MEMORY, e
            else:
                raise AssertionError(why)
        out_of_memory(40 * MiB, "40 MiB more with 80 of a 96 MiB limit held")
        lib.deallocate(a, 0)
        lib.deallocate(b, 0)
        c = lib.allocate(30 * MiB, 0, 0)  # from the use_on_oom pool
        assert c == b, (hex(c), hex(b))
        out_of_memory(30 * MiB, "the pool without use_on_oom served the device's own")
        lib.deallocate(c, 0)
        assert len(given) == 2, given
        x, y = in_pool(whole, 4 * MiB), in_pool(whole, 4 * MiB)
        import json
        segs = [s for s in json.loads(lib.torch_snapshot_json(0))["segments"] if s["segment_pool_id"] == list(whole)]
        assert len(segs) == 2 and all(len(s["blocks"]) == 1 for s in segs), segs
        assert {s["address"] for s in segs} == {x, y}, (segs, x, y)
        lib.deallocate(x, 0)
        lib.deallocate(y, 0)
        lib.pool_drop(0, keep)  # its object gone (~MemPool): back at once
        assert freed == [(a, given[a])], (freed, a)
        for pool in (use, whole):
            lib.pool_release(0, pool)
        gpumem.trim()
        assert sorted(freed) == sorted(given.items()), (freed, given)
        assert gpumem.stats(0)["reserved"] == 0, gpumem.stats(0)
        print("ok")
    """, config=SIM + ",limit=96MiB")


@needs_library
def test_cache_off():
    """gpumem_set_caching(0) (PyTorch's caching_allocator_enable(False)):
    each allocation is the driver's own, outside gpumem's statistics and
    its limit, and its free goes straight back; on again, gpumem serves."""
    run("""
        import gpumem
        lib = gpumem.library()
        lib.set_caching(False)
        p = lib.allocate(64 << 20, 0, 0)  # eight times the limit
        s = gpumem.stats(0)
        assert s["allocated"] == 0 and s["live_buffers"] == 0 and s["reserved"] == 0, s
        lib.deallocate(p, 0)
        lib.set_caching(True)
        try:
            lib.allocate(64 << 20, 0, 0)
        except gpumem.GpumemError:
            pass
        else:
            raise AssertionError("the limit did not hold with the cache on")
        q = lib.allocate(1 << 20, 0, 0)
        assert gpumem.stats(0)["allocated"] == 1 << 20
        lib.deallocate(q, 0)
        print("ok")
    """, config=SIM + ",limit=8MiB")


@needs_library
def test_pool_create_refuses_gpumems_own_functions():
    """A pool whose allocator would be gpumem's own gpumem_alloc and
    gpumem_free is refused with one line: its growth would come back into
    the pool."""
    run("""
        import ctypes
        import gpumem
        from gpumem import _lib
        lib = gpumem.library()
        own = lambda name: ctypes.cast(getattr(lib.c, name), ctypes.c_void_p).value
        try:
            lib.pool_create(0, (0, 9), alloc=own("gpumem_alloc"), free=own("gpumem_free"))
        except gpumem.GpumemError as e:
            assert e.status == _lib.ERROR_INVALID_VALUE and "gpumem's own" in str(e) and "\\n" not in str(e), str(e)
        else:
            raise AssertionError("accepted")
        print("ok")
    """, config=SIM)


def test_nccl_registration_hook_is_refused_at_once():
    """TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK on: use() fails at once
    with one line naming the variable (through the pluggable allocator the
    process aborted at its first collective); off or unset: nothing."""
    from gpumem import torch as gt
    for v in ("", "0", "false"):
        assert gt._nccl_hook_refusal({"TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": v}) is None
    assert gt._nccl_hook_refusal({}) is None
    for v in ("1", "true"):
        msg = gt._nccl_hook_refusal({"TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": v})
        assert msg and "\n" not in msg and "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=" + v in msg
        assert "unset it" in msg


def test_nccl_pool_registration_is_refused_for_gpumem_pools():
    """ProcessGroupNCCL.register_mem_pool / deregister_mem_pool with a
    MemPool of gpumem's fail at once with gpumem's one line (PyTorch's
    binding refused it with a TypeError listing C++ signatures); any other
    pool goes to PyTorch's method; patching twice wraps once."""
    from gpumem import _torch_graphs as g
    calls = []

    class ProcessGroup:  # a stand-in for ProcessGroupNCCL
        def register_mem_pool(self, pool):
            calls.append(("register", pool))
            return "registered"

        def deregister_mem_pool(self, pool):
            calls.append(("deregister", pool))
            return "deregistered"

    class Ours:
        _gpumem = True

    g._refuse_nccl_pool_registration(ProcessGroup)
    g._refuse_nccl_pool_registration(ProcessGroup)
    pg = ProcessGroup()
    for name in ("register_mem_pool", "deregister_mem_pool"):
        with pytest.raises(RuntimeError) as e:
            getattr(pg, name)(Ours())
        msg = str(e.value)
        assert msg.startswith("gpumem: ProcessGroupNCCL." + name + "(pool)") and "\n" not in msg, msg
    other = object()
    assert pg.register_mem_pool(other) == "registered" and pg.deregister_mem_pool(other) == "deregistered"
    assert calls == [("register", other), ("deregister", other)]
