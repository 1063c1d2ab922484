"""The front cache (clib/front.c): requests gpumem_alloc serves from buffers
gpumem_free just parked, without entering Go. Every figure must stay the
program's: the same run with the front off (GPUMEM_FRONT=0) must read the
same numbers at every point, and no buffer may ever be handed out twice.
Runs on the simulated device; no GPU needed."""
import json

from conftest import needs_library, run

SIM = "device=sim,capacity=4GiB,check=true"

# Gauges and counters that depend only on the program's requests (not on
# where the allocator placed them): equal with the front on and off.
FIGURES = ("allocated", "peak_allocated", "active", "peak_active", "live_buffers", "allocs", "frees",
           "alloc_bytes", "free_bytes", "alloc_requested", "free_requested")

# A random program over gpumem_alloc/gpumem_free: sizes that repeat (the
# front's hits), some over its 1 MiB bound, two streams in part of it,
# reads of the stats at random points, a peak reset, record_stream on some
# buffers, and double and foreign frees. Prints the stats at every read and
# the addresses live at the same time (each must be unique).
PROGRAM = r"""
import ctypes, json, os, random, sys
import gpumem
lib = gpumem.library()
c = lib.c
rng = random.Random(int(os.environ["SEED"]))
two = os.environ.get("STREAMS") == "2"
sizes = [512, 1000, 4096, 65536, 300000, 1 << 20, (1 << 20) + 1, 3 << 20]
live = {}
reads = []
seen_live = set()
def read():
    reads.append({k: v for k, v in lib.stats(0).as_dict().items()})
for step in range(6000):
    r = rng.random()
    if (r < 0.52 and len(live) < 150) or not live:
        n = rng.choice(sizes)
        s = rng.choice([0, 7]) if two and step > 2000 else 0
        p = c.gpumem_alloc(n, 0, s)
        assert p, lib.last_error() if hasattr(lib, "last_error") else "alloc failed"
        assert p not in live, f"address {p:#x} handed out twice"
        live[p] = (n, s)
    elif r < 0.993:
        p = rng.choice(list(live))
        n, s = live.pop(p)
        if rng.random() < 0.05:
            lib.record_stream(p, 0, 9)
        c.gpumem_free(p, n, 0, s)
    elif r < 0.999:
        read()
    else:
        lib.reset_peaks(0)
for p, (n, s) in list(live.items()):
    c.gpumem_free(p, n, 0, s)
read()
print(json.dumps(reads))
"""


def program(seed, streams, front, config=SIM):
    env = {"SEED": str(seed), "STREAMS": str(streams), "GPUMEM_FRONT": front}
    p = run(PROGRAM, config=config, env=env)
    assert "invariant" not in p.stderr, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@needs_library
def test_front_keeps_every_figure():
    """Random programs, one stream and two, plain segments and virtual
    memory: every read of the stats with the front on equals the same read
    with it off, and the front served many of the requests."""
    for config in (SIM, SIM + ",mode=plain"):
        for seed, streams in ((1, 1), (2, 2), (3, 1)):
            on, off = program(seed, streams, "check", config), program(seed, streams, "0", config)
            assert len(on) == len(off) > 10
            for i, (a, b) in enumerate(zip(on, off)):
                for k in FIGURES:
                    assert a[k] == b[k], f"{config} seed {seed}, read {i}: {k} {a[k]} with the front, {b[k]} without"
            assert off[-1]["reused"] == 0
            # With two streams in plain mode the allocator has two pools
            # (not Lone) from step 2000 on, and the front parks nothing.
            share = 0.3 if streams == 1 else 0.1
            assert on[-1]["reused"] > share * on[-1]["allocs"], (on[-1]["reused"], on[-1]["allocs"])


@needs_library
def test_front_double_and_foreign_frees():
    """A double free of a parked buffer is reported (once, on stderr, as
    without the front) and the buffer is not handed out twice; a foreign
    address is reported; record_stream's buffer is never reused by the
    front."""
    code = r"""
    import ctypes
    import gpumem
    lib = gpumem.library()
    c = lib.c
    p = c.gpumem_alloc(4096, 0, 0)
    c.gpumem_free(p, 4096, 0, 0)
    c.gpumem_free(p, 4096, 0, 0)          # double free: parked, so drained and reported by Go
    a, b = c.gpumem_alloc(4096, 0, 0), c.gpumem_alloc(4096, 0, 0)
    assert a != b, "one buffer handed out twice"
    s = lib.stats(0)
    assert s.live_buffers == 2 and s.allocs == 3 and s.frees == 1, s.as_dict()
    c.gpumem_free(a, 4096, 0, 0)
    c.gpumem_free(b, 4096, 0, 0)
    before = lib.stats(0).reused
    q = c.gpumem_alloc(8192, 0, 0)
    lib.record_stream(q, 0, 5)
    c.gpumem_free(q, 8192, 0, 0)
    r = c.gpumem_alloc(8192, 0, 0)
    assert lib.stats(0).reused == before, "record_stream's buffer was reused by the front"
    c.gpumem_free(r, 8192, 0, 0)
    print("ok")
    """
    p = run(code, config=SIM, env={"GPUMEM_FRONT": "check"})
    assert p.stdout.strip() == "ok"
    assert "freed already" in p.stderr, p.stderr
    assert "invariant" not in p.stderr, p.stderr


@needs_library
def test_front_foreign_free_reported():
    code = r"""
    import gpumem
    lib = gpumem.library()
    c = lib.c
    p = c.gpumem_alloc(4096, 0, 0)
    c.gpumem_free(p, 4096, 0, 0)
    c.gpumem_free(p + 512, 4096, 0, 0)  # never handed out
    assert c.gpumem_alloc(4096, 0, 0) == p   # the parked buffer, once
    print(lib.stats(0).reused)
    """
    p = run(code, config=SIM, env={"GPUMEM_FRONT": "check"})
    assert p.stdout.strip() == "1"
    assert "gpumem:" in p.stderr and "invariant" not in p.stderr, p.stderr


@needs_library
def test_front_stands_aside_while_recording(tmp_path):
    """A recording sees every request: with one on, nothing is reused by the
    front, and the trace has every allocation and free."""
    trace = tmp_path / "t.trace"
    code = rf"""
    import gpumem
    lib = gpumem.library()
    c = lib.c
    lib.record_start(0, {str(trace)!r})
    for _ in range(100):
        c.gpumem_free(c.gpumem_alloc(4096, 0, 0), 4096, 0, 0)
    lib.record_stop(0)
    print(lib.stats(0).reused)
    """
    p = run(code, config=SIM, env={"GPUMEM_FRONT": "check"})
    assert p.stdout.strip() == "0", p.stdout + p.stderr
    lines = [l.split()[0] for l in trace.read_text().splitlines() if l and l[0] in "af"]
    assert lines.count("a") == 100 and lines.count("f") == 100


@needs_library
def test_front_drains_before_the_server_reads():
    """The HTTP server (serve=, or gpumem.serve) reads Go's figures with no
    entry point of the library: it drains the front first, so a buffer the
    program freed is not served as live."""
    code = r"""
    import json, urllib.request, gpumem
    lib = gpumem.library()
    c = lib.c
    keep = c.gpumem_alloc(3 << 20, 0, 0)
    for _ in range(10):
        c.gpumem_free(c.gpumem_alloc(4096, 0, 0), 4096, 0, 0)   # the last one stays parked
    addr = gpumem.serve("127.0.0.1:0")
    stats = json.load(urllib.request.urlopen(f"http://{addr}/debug/gpumem/stats"))["0"]["stats"]
    print(stats["Allocated"], stats["Allocs"], stats["Frees"], stats["Reused"])
    for _ in range(2):   # the first is the allocator's (the server's read drained), the second the front's
        c.gpumem_free(c.gpumem_alloc(4096, 0, 0), 4096, 0, 0)
    metrics = urllib.request.urlopen(f"http://{addr}/metrics").read().decode()
    print([l for l in metrics.splitlines() if l.startswith("gpumem_front_reuses_total")][0])
    """
    p = run(code, config=SIM, env={"GPUMEM_FRONT": "check"})
    first, metric = p.stdout.strip().splitlines()
    allocated, allocs, frees, reused = map(int, first.split())
    assert allocated == 3 << 20 and allocs == 11 and frees == 10, p.stdout
    assert reused == 9, p.stdout
    assert metric == 'gpumem_front_reuses_total{device="0",pool="gpumem"} 10', metric


@needs_library
def test_front_mem_info_counts_parked_as_free():
    """gpumem_mem_info (torch.cuda.mem_get_info) does not drain the front:
    it counts what the front parks as free. The same answer as with the
    front off, buffers parked or not."""
    code = r"""
    import gpumem
    lib = gpumem.library()
    c = lib.c
    keep = [c.gpumem_alloc(n, 0, 0) for n in (3 << 20, 4096, 70000)]
    for n in (4096, 65536, 300000, 1000):
        c.gpumem_free(c.gpumem_alloc(n, 0, 0), n, 0, 0)
    print(*lib.mem_info(0), lib.stats(0).reused)
    """
    on = run(code, config=SIM, env={"GPUMEM_FRONT": "check"}).stdout.split()
    off = run(code, config=SIM, env={"GPUMEM_FRONT": "0"}).stdout.split()
    assert on[:2] == off[:2], (on, off)
    assert off[2] == "0"


@needs_library
def test_front_threads():
    """Four threads allocating and freeing through the front at once (ctypes
    lets go of the GIL in each call), a fifth reading the stats: no address
    is ever live twice, the invariants hold (GPUMEM_FRONT=check), and at the
    end nothing is live and the counts add up."""
    code = r"""
    import random, threading
    import gpumem
    lib = gpumem.library()
    c = lib.c
    live, mu, errors = set(), threading.Lock(), []
    def work(seed):
        rng = random.Random(seed)
        mine = []
        for _ in range(20000):
            if mine and (rng.random() < 0.5 or len(mine) > 40):
                p, n = mine.pop(rng.randrange(len(mine)))
                with mu:
                    live.discard(p)
                c.gpumem_free(p, n, 0, 0)
            else:
                n = rng.choice([512, 4096, 65536, 1 << 20, 3 << 20])
                p = c.gpumem_alloc(n, 0, 0)
                with mu:
                    if not p or p in live:
                        errors.append(p)
                    live.add(p)
                mine.append((p, n))
        for p, n in mine:
            with mu:
                live.discard(p)
            c.gpumem_free(p, n, 0, 0)
    stop = False
    def read():
        while not stop:
            s = lib.stats(0)
            assert s.allocs - s.frees == s.live_buffers
    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    r = threading.Thread(target=read)
    r.start()
    for t in ts: t.start()
    for t in ts: t.join()
    stop = True
    r.join()
    s = lib.stats(0)
    assert not errors, f"{len(errors)} addresses handed out while live"
    assert s.live_buffers == 0 and s.allocated == 0 and s.active == 0, s.as_dict()
    assert s.alloc_bytes == s.free_bytes and s.allocs == s.frees
    print(s.reused, s.allocs)
    """
    p = run(code, config=SIM, env={"GPUMEM_FRONT": "check"})
    assert "invariant" not in p.stderr, p.stderr
    reused, allocs = map(int, p.stdout.split())
    assert reused > 0 and allocs > 40000


@needs_library
def test_replay_front_models_the_library(tmp_path):
    """`gpumem replay --front` models the library's front (internal/front):
    on a single-stream trace, the trace replayed through the library's own
    entry points (bench/torchalloc/front_replay.py) and through the model
    hold the same peak reserved, and the front serves the same requests."""
    import os
    import shutil
    import subprocess
    import sys
    root = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
    # build/gpumem (the README's build) or build/gpu/gpumem (scripts/gpu.sh
    # build, what the GPU machine gets), else built here.
    cli = next((c for c in (os.path.join(root, "build", "gpumem"), os.path.join(root, "build", "gpu", "gpumem"))
                if os.path.exists(c)), "")
    if not cli:
        if shutil.which("go") is None:
            import pytest
            pytest.skip("no build/gpumem or build/gpu/gpumem, and no Go to build one")
        cli = str(tmp_path / "gpumem")
        subprocess.run(["go", "build", "-o", cli, "./cmd/gpumem"], cwd=root, check=True,
                       env=dict(os.environ, CGO_ENABLED="0"))
    import gzip
    import random
    traces = [os.path.join(root, "testdata", "traces", "resnet50_train.trace.gz")]
    # Random single-stream programs: sizes that repeat (hits), large ones,
    # a plateau of live buffers, and empty_cache calls ("t" lines).
    for seed in range(3):
        rng = random.Random(seed)
        path = tmp_path / f"random{seed}.trace.gz"
        live, n, t = [], 0, 0
        with gzip.open(path, "wt") as f:
            f.write("# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US\n")
            for _ in range(20000):
                t += 1
                r = rng.random()
                if r < 0.001:
                    f.write(f"t {t}\n")
                elif (r < 0.5 and len(live) < 300) or not live:
                    size = rng.choice([512, 3000, 4096, 65536, 300000, 1 << 20, 5 << 20, rng.randint(1, 64 << 20)])
                    f.write(f"a {n} {size} 0 {t}\n")
                    live.append(n)
                    n += 1
                else:
                    f.write(f"f {live.pop(rng.randrange(len(live)))} {t}\n")
        traces.append(str(path))
    env = dict(os.environ, GPUMEM_CONFIG="device=sim,capacity=80GiB", PYTHONPATH=os.path.join(root, "python"))
    for trace in traces:
        lib = subprocess.run([sys.executable, os.path.join(root, "bench", "torchalloc", "front_replay.py"), "--one", trace],
                             env=env, capture_output=True, text=True, check=True)
        c = json.loads(lib.stdout)
        go = subprocess.run([cli, "replay", "--json", "--front", "--device", "sim", "--capacity", "80GiB", trace],
                            capture_output=True, text=True, check=True)
        model = json.loads([l for l in go.stdout.splitlines() if l.startswith("{")][-1])
        assert c["reused"] > 1000, (trace, c["reused"])
        assert (model["peak_reserved_bytes"], model["peak_active_bytes"], model["front_reused"]) == \
            (c["peak_reserved"], c["peak_active"], c["reused"]), trace


@needs_library
def test_front_stands_aside_under_a_limit():
    """Under a limit below the device (GPUMEM_CONFIG limit=, or
    set_memory_fraction), nothing is parked: a program fitted to the limit
    is placed as without the front."""
    code = r"""
    import gpumem
    lib = gpumem.library()
    c = lib.c
    for _ in range(100):
        c.gpumem_free(c.gpumem_alloc(4096, 0, 0), 4096, 0, 0)
    print(lib.stats(0).reused)
    lib.set_memory_fraction(0, 1.0)
    """
    assert run(code, config=SIM + ",limit=1GiB", env={"GPUMEM_FRONT": "check"}).stdout.strip() == "0"
    assert int(run(code, config=SIM, env={"GPUMEM_FRONT": "check"}).stdout.strip()) >= 98


@needs_library
def test_front_fork():
    """A fork (DataLoader workers) with buffers parked: the lock is taken
    across it, the parent goes on with its front, and the child, which
    never touches the GPU, exits cleanly."""
    code = r"""
    import os, threading
    import gpumem
    lib = gpumem.library()
    c = lib.c
    stop = False
    def churn():   # another thread in the front while the fork happens
        while not stop:
            c.gpumem_free(c.gpumem_alloc(8192, 0, 0), 8192, 0, 0)
    t = threading.Thread(target=churn)
    t.start()
    for _ in range(20):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
    stop = True
    t.join()
    for _ in range(10):
        c.gpumem_free(c.gpumem_alloc(4096, 0, 0), 4096, 0, 0)
    s = lib.stats(0)
    print(s.live_buffers, s.reused > 0)
    """
    p = run(code, config=SIM, env={"GPUMEM_FRONT": "check"}, timeout=120)
    assert p.stdout.split() == ["0", "True"], p.stdout + p.stderr
