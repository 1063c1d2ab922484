"""CUDA graphs under gpumem: what a capture allocates must stay the graph's
while it lives (PyTorch's private pools), or replays overwrite tensors made
after the capture.

Each GPU scenario is a script run twice, each time in a process of its own
(an allocator is per process): under gpumem (gpumem.torch.use()) and under
PyTorch's own allocator. The script checks the data (tensors made after the
capture keep their values through replays; replays give what eager code
gives) and prints its numbers; the test asserts the same properties for both
allocators and that their outputs agree. The tests at the top need no GPU:
the library's pool calls on the simulated device, and the wiring of
gpumem.torch against a stand-in for torch."""

import json
import textwrap

from conftest import needs_gpu, needs_library, run

SIM = "device=sim,capacity=4GiB,check=true"


# --- no GPU ------------------------------------------------------------------

@needs_library
def test_pool_calls_on_the_simulated_device():
    p = run("""
        import gpumem
        from gpumem import _lib
        lib = gpumem.library()
        for name in ("pool_begin", "pool_end", "pool_release", "pool_live"):
            assert callable(getattr(lib, name)), name
        # A bad route is one clear error that changes nothing.
        try:
            lib.pool_begin(0, (7, 0), 0, 9)
        except gpumem.GpumemError as e:
            print("ERR", e.status, e)
        else:
            raise AssertionError("route 9 accepted")
        # So is ending a route that was never begun.
        try:
            lib.pool_end(0, (7, 0))
        except gpumem.GpumemError as e:
            assert e.status == _lib.ERROR_INVALID_VALUE, e.status
        else:
            raise AssertionError("pool_end with no route accepted")
        assert lib.pool_live(0, (7, 0)) == set()        # unknown pool: none live
        lib.pool_release(0, (7, 0))                     # unknown pool: no error

        pool = (1, 0)
        lib.pool_begin(0, pool, None, _lib.POOL_THREAD)
        inside = [lib.allocate(1 << 20, 0, 0) for _ in range(3)]
        lib.pool_end(0, pool)
        outside = lib.allocate(1 << 20, 0, 0)
        assert lib.pool_live(0, pool) == set(inside), (lib.pool_live(0, pool), inside)
        lib.deallocate(inside[0], 0)
        # Freed pool memory serves no allocation outside the pool.
        others = [lib.allocate(1 << 20, 0, 0) for _ in range(4)]
        assert not set(others) & set(inside), "a pool's memory served an outside allocation"
        # Every allocation on the device, more than pool_live's first buffer holds.
        lib.pool_begin(0, pool, None, _lib.POOL_ALL)
        many = [lib.allocate(4096, 0, 0) for _ in range(200)]
        lib.pool_end(0, pool)
        live = lib.pool_live(0, pool)
        assert live == set(inside[1:]) | set(many), len(live)
        # Two uses (two begins): the pool stays until both are given back
        # and its buffers are freed.
        lib.pool_release(0, pool)
        lib.pool_release(0, pool)
        try:
            lib.pool_release(0, pool)
        except gpumem.GpumemError as e:
            assert e.status == _lib.ERROR_INVALID_VALUE
        else:
            raise AssertionError("a third release of a pool with two uses accepted")
        for ptr in inside[1:] + many:
            lib.deallocate(ptr, 0)
        assert lib.pool_live(0, pool) == set()
        for ptr in others + [outside]:
            lib.deallocate(ptr, 0)
        s = gpumem.stats(0)
        assert s["allocated"] == 0 and s["live_buffers"] == 0, s
        print("ok")
    """, config=SIM)
    first, last = p.stdout.splitlines()[0], p.stdout.splitlines()[-1]
    assert first.startswith("ERR 2 gpumem: ") and "route 9" in first, first
    assert last == "ok"


def test_old_library_without_pools_is_one_clear_line():
    """A library older than the pool calls loads; the calls say what is wrong."""
    p = run("""
        import gpumem
        from gpumem import _lib
        class Old:  # a CDLL without the pool symbols
            def __getattr__(self, name):
                raise AttributeError(name)
        lib = _lib.Library.__new__(_lib.Library)
        lib.path, lib._c = "/x/libgpumem.so", Old()
        for call in (lambda: lib.pool_begin(0, (1, 0), 0, 0), lambda: lib.pool_end(0, (1, 0)),
                     lambda: lib.pool_release(0, (1, 0)), lambda: lib.pool_live(0, (1, 0))):
            try:
                call()
            except gpumem.GpumemError as e:
                print(e)
    """)
    lines = p.stdout.splitlines()
    assert len(lines) == 4
    for line in lines:
        assert line.startswith("gpumem: /x/libgpumem.so has no gpumem_pool_"), line
        assert "rebuild it with scripts/lib.sh" in line


# A stand-in for the parts of torch that gpumem.torch's graph wiring touches,
# and a library that records the calls it gets.
FAKE_TORCH = """
import gc, sys, types, warnings, weakref
warnings.simplefilter("error")
import gpumem.torch as gt
from gpumem import _lib

calls = []

holds = []  # capture_hold / capture_release, kept apart from calls

class FakeLib:
    def capture_hold(self, device):
        holds.append(("hold", device, len(calls)))
    def capture_release(self, device):
        holds.append(("release", device, len(calls)))
    def pool_begin(self, device, pool, stream, route):
        calls.append(("begin", device, tuple(pool), stream, route))
    def pool_end(self, device, pool):
        calls.append(("end", device, tuple(pool)))
    def pool_release(self, device, pool):
        calls.append(("release", device, tuple(pool)))
    def pool_live(self, device, pool):
        return {0x1000, 0x2000}
    def pool_checkpoint(self, device, pool):
        calls.append(("checkpoint", device, tuple(pool)))
        return ((0x1000, 512, 0),)
    def pool_restore(self, device, pool, buffers):
        calls.append(("restore", device, tuple(pool), buffers))
    def deallocate(self, ptr, device=-1):
        calls.append(("free", ptr, device))

handles = iter(range(100, 1000))

class CUDAGraph:  # PyTorch's Python class over the C++ one
    def __init__(self):
        self._pool, self._ended = None, False
    def capture_begin(self, pool=None, capture_error_mode="global"):
        if getattr(self, "fail_begin", False):
            raise RuntimeError("capture_begin failed")
        self._pool = tuple(getattr(pool, "id", pool) or (next(handles), 0))
        calls.append(("torch.capture_begin", self._pool, capture_error_mode))
    def capture_end(self):
        calls.append(("torch.capture_end",))
        if getattr(self, "fail_end", False):
            raise RuntimeError("capture_end failed")
        self._ended = True
    def reset(self):
        calls.append(("torch.reset",))
    def pool(self):
        if not self._ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self._pool

C = types.ModuleType("faketorch._C")
for name in ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_beginAllocateToPool",
             "_cuda_endAllocateToPool", "_cuda_releasePool"):
    setattr(C, name, (lambda n: lambda *a: calls.append(("torch." + n,) + a))(name))
C._cuda_checkPoolLiveAllocations = lambda *a: (_ for _ in ()).throw(RuntimeError("pluggable: no"))
C._cuda_getCheckpointState = lambda *a: (_ for _ in ()).throw(RuntimeError("pluggable: no"))
C._cuda_setCheckpointPoolState = lambda *a: (_ for _ in ()).throw(RuntimeError("pluggable: no"))
C._cuda_cudaCachingAllocator_raw_delete = lambda *a: (_ for _ in ()).throw(RuntimeError("pluggable: not allocated here"))
originals = dict(vars(C))

graphs = types.ModuleType("faketorch.cuda.graphs")
graphs.CUDAGraph = CUDAGraph
CUDAGraph.__module__ = graphs.__name__
memory = types.ModuleType("faketorch.cuda.memory")
memory._cuda_endAllocateToPool = C._cuda_endAllocateToPool   # from torch._C import ...
user = types.ModuleType("faketorch_user")                    # a third party, under another name
user.release = C._cuda_releasePool
sys.modules["faketorch_user"] = user

cuda = types.SimpleNamespace(
    graphs=graphs, memory=memory, CUDAGraph=CUDAGraph,
    current_device=lambda: 0,
    current_stream=lambda device=None: types.SimpleNamespace(cuda_stream=0xABC),
    graph_pool_handle=lambda: (0, next(handles)),
    is_current_stream_capturing=lambda: False,
    _utils=types.SimpleNamespace(_get_device_index=lambda d, optional=True: 0 if d is None else int(d)))
torch = types.SimpleNamespace(_C=C, cuda=cuda)
gt._patch_graphs(torch, FakeLib())

def take():
    out = list(calls)
    calls.clear()
    return out
"""


def test_graph_wiring_without_torch():
    """The order of gpumem's pool calls around PyTorch's, on a stand-in for
    torch: begin after the capture began, end after it ended (also when
    ending raises), one release per capture whether the graph is reset,
    collected, or both."""
    p = run(FAKE_TORCH + textwrap.dedent("""
        CAP = _lib.POOL_CAPTURE

        # A capture naming no pool gets a fresh handle in its place: pool()
        # answers only after capture_end, and the route needs the id now.
        g = CUDAGraph()
        g.capture_begin(capture_error_mode="thread_local")
        # Held from before PyTorch's begin to after gpumem's route.
        assert holds == [("hold", 0, 0), ("release", 0, 2)], holds
        (_, pool, mode), begin = take()
        assert mode == "thread_local" and pool[0] == 0 and pool[1] >= 100, pool
        assert begin == ("begin", 0, pool, 0xABC, CAP), begin
        g.capture_end()
        assert take() == [("torch.capture_end",), ("end", 0, pool)]
        assert g.pool() == pool
        g.reset()
        assert take() == [("release", 0, pool), ("torch.reset",)]
        del g
        gc.collect()
        assert take() == [], "released twice"

        # Collected without reset: released once, by the finalizer.
        g = CUDAGraph()
        g.capture_begin()
        g.capture_end()
        pool = g.pool()
        take()
        del g
        gc.collect()
        assert take() == [("release", 0, pool)]

        # A pool named by the caller (a handle, another graph's pool(), a
        # MemPool) is the one routed; the argument goes through unchanged.
        class MemPool:
            id = (0, 77)
        for given, want in (((0, 55), (0, 55)), ((9, 0), (9, 0)), (MemPool(), (0, 77))):
            g = CUDAGraph()
            g.capture_begin(given)
            assert take() == [("torch.capture_begin", want, "global"), ("begin", 0, want, 0xABC, CAP)]
            g.capture_end()
            g.reset()
            take()

        # capture_begin failing: no route, no release.
        g = CUDAGraph()
        g.fail_begin = True
        try:
            g.capture_begin()
        except RuntimeError:
            pass
        g.reset()
        assert take() == [("torch.reset",)]

        # capture_end raising: the route still ends, and the use is released once.
        g = CUDAGraph()
        g.capture_begin()
        pool = take()[1][2]
        g.fail_end = True
        try:
            g.capture_end()
        except RuntimeError:
            pass
        assert take() == [("torch.capture_end",), ("end", 0, pool)]
        g.reset()
        g.reset()
        assert take() == [("release", 0, pool), ("torch.reset",), ("torch.reset",)]

        # gpumem failing to begin the route ends PyTorch's capture and says why.
        class Refusing(FakeLib):
            def pool_begin(self, *a):
                raise gt._lib.GpumemError(2, "gpumem: no")
        g = CUDAGraph()
        gt._graph_pools(g, Refusing())
        try:
            g.capture_begin()
        except gt._lib.GpumemError as e:
            assert str(e) == "gpumem: no"
        else:
            raise AssertionError("no error")
        assert [c[0] for c in take()] == ["torch.capture_begin", "torch.capture_end"]

        # torch._C's pool calls: PyTorch's first (a no-op under a pluggable
        # allocator), then gpumem's, with PyTorch's filters as routes.
        C._cuda_beginAllocateCurrentThreadToPool(0, (0, 5))
        C._cuda_endAllocateToPool(0, (0, 5))
        C._cuda_beginAllocateToPool(0, (0, 6))
        memory._cuda_endAllocateToPool(0, (0, 6))
        user.release(0, (0, 5))
        assert take() == [
            ("torch._cuda_beginAllocateCurrentThreadToPool", 0, (0, 5)), ("begin", 0, (0, 5), 0, _lib.POOL_THREAD),
            ("torch._cuda_endAllocateToPool", 0, (0, 5)), ("end", 0, (0, 5)),
            ("torch._cuda_beginAllocateToPool", 0, (0, 6)), ("begin", 0, (0, 6), 0, _lib.POOL_ALL),
            ("torch._cuda_endAllocateToPool", 0, (0, 6)), ("end", 0, (0, 6)),
            ("torch._cuda_releasePool", 0, (0, 5)), ("release", 0, (0, 5))]
        assert C._cuda_checkPoolLiveAllocations(0, (0, 5), {0x2000, 0x1000}) is True
        assert C._cuda_checkPoolLiveAllocations(0, (0, 5), {0x1000}) is False
        assert C._cuda_checkPoolLiveAllocations(0, (0, 5), {0x1000, 0x2000, 0x3000}) is False
        # Checkpoints: gpumem's, whatever PyTorch's would say.
        state = C._cuda_getCheckpointState(0, (0, 5))
        assert take() == [("checkpoint", 0, (0, 5))]
        assert (state.device, state.pool, state.buffers) == (0, (0, 5), ((0x1000, 512, 0),)), state
        for bad, want in ((object(), TypeError), (state, RuntimeError)):
            # 0x2000 is live and not in the checkpoint: with no stale
            # storage named, PyTorch's check refuses, before any change.
            try:
                C._cuda_setCheckpointPoolState(0, bad, [], [])
            except want as e:
                print(e)
            else:
                raise AssertionError("no error")
        assert take() == []
        C._cuda_cudaCachingAllocator_raw_delete(0x1000)
        assert take() == [("free", 0x1000, -1)]
        assert gt._patched[("faketorch_user", "release")] is originals["_cuda_releasePool"]
        assert gt._patched[("faketorch.cuda.memory", "_cuda_endAllocateToPool")] is originals["_cuda_endAllocateToPool"]
        assert gt._patched[("faketorch.cuda.graphs.CUDAGraph", "reset")] is not CUDAGraph.reset
        assert ("faketorch.cuda.graphs.CUDAGraph", "capture_begin") in gt._patched
        # Every hold released, also where beginning failed.
        assert [h[0] for h in holds] == ["hold", "release"] * (len(holds) // 2), holds
        print("ok")
    """))
    lines = p.stdout.splitlines()
    assert lines[-1] == "ok", p.stdout
    assert lines[0].startswith("gpumem: setCheckpointPoolState: object is not a checkpoint of gpumem's"), lines
    assert lines[1] == ("gpumem: setCheckpointPoolState: Any stale tensors which are being manually freed "
                        "must be passed to set checkpoint"), lines


# --- on a GPU ----------------------------------------------------------------

ALLOCATORS = ("gpumem", "torch")

# Every scenario starts with this: the allocator, fixed numerics, helpers.
PRELUDE = """
import gc, json, os, sys
import torch
ALLOCATOR = os.environ["GPUMEM_TEST_ALLOCATOR"]
if ALLOCATOR == "gpumem":
    import gpumem.torch
    gpumem.torch.use()
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
RESULT = {}


def keepers(shapes, start=1.0):
    # Tensors made after a capture, each filled with its own value.
    return [torch.full(s, start + i, device=dev) for i, s in enumerate(shapes)]


def changed(tensors, start=1.0):
    # Indices of keepers that no longer hold their value.
    return [i for i, t in enumerate(tensors) if not bool((t == start + i).all())]


def err(a, b):
    # Largest difference, relative to the largest magnitude.
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def summary(t):
    t = t.detach().float().flatten()
    return {"sum": float(t.sum()), "head": t[:8].tolist()}


def replays(g, static_x, static_y, want, keep, n=3):
    # n replays of g on new inputs: the largest difference from want(x),
    # and the keepers found changed.
    errs, bad = [], set()
    for _ in range(n):
        x = torch.randn(static_x.shape, device=dev)
        static_x.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        errs.append(err(static_y, want(x)))
        bad |= set(changed(keep))
    return max(errs), sorted(bad)
"""

TOL = 1e-4


def both(code, timeout=600):
    """Runs PRELUDE + code under each allocator; returns {allocator: RESULT}."""
    out = {}
    for allocator in ALLOCATORS:
        script = textwrap.dedent(PRELUDE) + textwrap.dedent(code) + "\nprint('RESULT ' + json.dumps(RESULT))\n"
        p = run(script, env={"GPUMEM_TEST_ALLOCATOR": allocator}, check=False, timeout=timeout)
        lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise AssertionError(f"under {allocator}: exit {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
        assert "gpumem: giving back" not in p.stderr, p.stderr
        assert "(reported once)" not in p.stderr, f"under {allocator}, a free failed:\n{p.stderr}"
        out[allocator] = json.loads(lines[-1][len("RESULT "):])
    return out


def agree(results, *keys, tol=TOL):
    """The outputs named by keys agree between the allocators."""
    a, b = (results[x] for x in ALLOCATORS)
    for key in keys:
        x, y = a[key], b[key]
        scale = max(abs(y["sum"]), 1.0)
        assert abs(x["sum"] - y["sum"]) <= tol * scale * 10, (key, x, y)
        assert all(abs(u - v) <= tol * max(abs(v), 1.0) for u, v in zip(x["head"], y["head"])), (key, x, y)


@needs_library
@needs_gpu
def test_replay_leaves_tensors_made_after_capture_alone():
    """The reported bug: a model captured with torch.cuda.graph, then 8
    tensors made after the capture, then replays with new inputs. Under the
    bug the intermediates the capture freed were handed to those tensors, and
    every replay overwrote them."""
    r = both("""
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                    torch.nn.ReLU(), torch.nn.Linear(1024, 512)).cuda()
        static_x = torch.randn(64, 512, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad():
            with torch.cuda.stream(s):
                for _ in range(3):
                    model(static_x)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_y = model(static_x)
            keep = keepers([(64, 1024)] * 4 + [(64, 512)] * 4)
            worst, bad = replays(g, static_x, static_y, model, keep)
        RESULT.update(changed=bad, err=worst, out=summary(static_y))
    """)
    for allocator, res in r.items():
        assert res["changed"] == [], f"under {allocator}, replays overwrote tensors made after the capture: {res}"
        assert res["err"] <= TOL, f"under {allocator}, the graph's output differs from eager: {res}"
    agree(r, "out")


@needs_library
@needs_gpu
def test_capture_intermediates_and_many_later_tensors():
    """Intermediates of many sizes, allocated and freed during the capture;
    after it, tensors of sizes from 512 B to 14 MiB: replays touch none."""
    r = both("""
        def f(x):
            a = x.relu()
            b = torch.cat([a, a * 2], 0)                  # 512 x 256
            c = b @ b.t()                                  # 512 x 512
            d = c.sin()[:, :128].contiguous()              # 512 x 128
            e = torch.nn.functional.pad(d, (0, 1000))      # 512 x 1128
            h = (e.unsqueeze(0) * torch.arange(1.0, 9.0, device=dev).view(8, 1, 1)).mean(0)
            return h.sum(1) + d.mean() + x[:, :1].t().sum()
        static_x = torch.randn(256, 256, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            f(static_x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = f(static_x)
        sizes = [max(1, int(512 * 1.3 ** i) // 4) for i in range(40)]
        keep = keepers([(n,) for n in sizes])
        worst, bad = replays(g, static_x, static_y, f, keep)
        RESULT.update(changed=bad, err=worst, out=summary(static_y), n=len(keep))
    """)
    for allocator, res in r.items():
        assert res["changed"] == [], f"under {allocator}: tensors {res['changed']} of {res['n']} overwritten"
        assert res["err"] <= TOL, (allocator, res)
    agree(r, "out")


@needs_library
@needs_gpu
def test_two_graphs_share_a_pool():
    """Two graphs captured into one pool (torch.cuda.graph_pool_handle(), the
    second through the first's pool()), the second reading the first's
    output, replayed in capture order."""
    r = both("""
        w1 = torch.randn(512, 512, device=dev) / 20
        w2 = torch.randn(512, 256, device=dev) / 20
        def f1(x):
            return (x @ w1).relu() + 1
        def f2(y):
            return (y @ w2).tanh() * y[:, :256]
        static_x = torch.randn(128, 512, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            f2(f1(static_x))
        torch.cuda.current_stream().wait_stream(s)
        pool = torch.cuda.graph_pool_handle()
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1, pool=pool):
            y1 = f1(static_x)
        with torch.cuda.graph(g2, pool=g1.pool()):
            y2 = f2(y1)
        keep = keepers([(128, 512)] * 4 + [(128, 256)] * 4)
        errs, bad = [], set()
        for k in range(3):
            x = torch.randn(128, 512, device=dev)
            static_x.copy_(x)
            g1.replay()
            g2.replay()
            torch.cuda.synchronize()
            want1 = f1(x)
            errs += [err(y1, want1), err(y2, f2(want1))]
            bad |= set(changed(keep))
        RESULT.update(changed=sorted(bad), err=max(errs), out=summary(y2),
                      same_pool=tuple(g1.pool()) == tuple(g2.pool()) == tuple(pool))
    """)
    for allocator, res in r.items():
        assert res["changed"] == [], (allocator, res)
        assert res["err"] <= TOL, (allocator, res)
        assert res["same_pool"], (allocator, res)
    agree(r, "out")


@needs_library
@needs_gpu
def test_reset_and_delete_give_the_memory_back():
    """Capture, replay, then reset and/or delete the graph and its outputs:
    memory_allocated is back where it was, memory_reserved (after
    empty_cache) does not grow over five cycles, and new allocations work.
    Under gpumem the graph's pool is gone once the graph and its outputs are."""
    r = both("""
        def f(x):
            return ((x * 2).sin() + x.cos()) * 3 - x
        s = torch.cuda.Stream()
        static_x = torch.randn(1 << 22, device=dev)    # 16 MiB
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            f(static_x)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()

        def cycle(i):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                y = f(static_x)
            pool = g.pool()
            g.replay()
            torch.cuda.synchronize()
            e = err(y, f(static_x))
            if i % 2 == 0:
                g.reset()     # reset, then deleted: one release
            del g, y
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            live = len(gpumem.library().pool_live(0, pool)) if ALLOCATOR == "gpumem" else 0
            return e, live

        cycle(-1)   # first use: whatever PyTorch keeps for good (RNG state, workspaces)
        base = torch.cuda.memory_allocated()
        allocated, reserved, errs, lives = [], [], [], []
        for i in range(5):
            e, live = cycle(i)
            errs.append(e)
            lives.append(live)
            allocated.append(torch.cuda.memory_allocated())
            reserved.append(torch.cuda.memory_reserved())
        big = torch.full((1 << 24,), 3.0, device=dev)
        RESULT.update(base=base, allocated=allocated, reserved=reserved, err=max(errs), lives=lives,
                      big_ok=bool((big == 3.0).all()))
        if ALLOCATOR == "gpumem":
            RESULT["stats"] = gpumem.torch.stats()
    """)
    for allocator, res in r.items():
        assert res["err"] <= TOL, (allocator, res)
        assert res["allocated"] == [res["base"]] * 5, f"under {allocator}, memory_allocated did not come back: {res}"
        assert max(res["reserved"]) <= res["reserved"][0], f"under {allocator}, memory_reserved grew: {res}"
        assert res["big_ok"], (allocator, res)
        assert res["lives"] == [0] * 5, (allocator, res)


@needs_library
@needs_gpu
def test_make_graphed_callables_gradients():
    """torch.cuda.make_graphed_callables on a small module (forward and
    backward graphs in one pool): outputs and gradients equal eager's, and
    tensors made afterwards keep their values."""
    r = both("""
        import copy
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)).cuda()
        ref = copy.deepcopy(model)
        sample = torch.randn(32, 256, device=dev, requires_grad=True)
        graphed = torch.cuda.make_graphed_callables(model, (sample,))
        keep = keepers([(32, 512)] * 4 + [(512, 256)] * 2 + [(32, 256)] * 2)
        errs, bad = [], set()
        for k in range(3):
            x = torch.randn(32, 256, device=dev, requires_grad=True)
            xr = x.detach().clone().requires_grad_(True)
            for p in list(model.parameters()) + list(ref.parameters()):
                p.grad = None
            out = graphed(x)
            (out ** 2).mean().backward()
            outr = ref(xr)
            (outr ** 2).mean().backward()
            torch.cuda.synchronize()
            errs.append(err(out, outr))
            errs.append(err(x.grad, xr.grad))
            errs += [err(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters())]
            bad |= set(changed(keep))
        RESULT.update(changed=sorted(bad), err=max(errs), out=summary(out),
                      grad=summary(next(model.parameters()).grad))
    """)
    for allocator, res in r.items():
        assert res["changed"] == [], (allocator, res)
        assert res["err"] <= TOL, f"under {allocator}, graphed outputs or gradients differ from eager: {res}"
    agree(r, "out", "grad")


@needs_library
@needs_gpu
def test_compile_reduce_overhead():
    """torch.compile(mode="reduce-overhead"): CUDA graph trees over two
    functions, a path f -> g replayed, then new shapes for g after f's
    replay (a new recording under a replayed node: the allocator's
    checkpoint is put back), with outputs kept alive across steps and
    others dropped. The trees' own checks of the allocator's books against
    the live tensors are on (slow_path_cudagraph_asserts). Outputs equal
    eager's under both allocators; the checkpoint path runs under both;
    what stays allocated once the trees are gone is no more than under
    PyTorch's allocator."""
    r = both("""
        import torch._inductor.config as icfg
        from torch._inductor import cudagraph_trees
        icfg.triton.slow_path_cudagraph_asserts = True
        icfg.triton.fast_path_cudagraph_asserts = True
        restores = [0]
        orig_set = torch._C._cuda_setCheckpointPoolState
        def counting(*a):
            restores[0] += 1
            return orig_set(*a)
        torch._C._cuda_setCheckpointPoolState = counting

        def f(x, w):
            return torch.relu(x @ w).sin() * 3
        def g(y, w):
            return (y * 2 + 1) @ w + y.mean()
        w = torch.randn(256, 256, device=dev) / 16
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        cf = torch.compile(f, mode="reduce-overhead")
        cg = torch.compile(g, mode="reduce-overhead")
        errs, kept = [], []
        for k in range(14):
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.randn(128, 256, device=dev)
            y = cf(x, w)
            rows = 128 if k < 6 else (64 if k % 2 else 32)   # new shapes for g after f's replays
            z = cg(y[:rows], w)
            ey = f(x, w)
            errs += [err(y, ey), err(z, g(ey[:rows], w))]
            if k in (7, 10):
                kept.append(z)   # outputs kept alive into later steps (never read again)
            last = summary(z)
        del x, y, z, kept
        cudagraph_trees.reset_cudagraph_trees()
        del cf, cg
        gc.collect()
        torch.cuda.synchronize()
        RESULT.update(err=max(errs), out=last, restores=restores[0],
                      left=torch.cuda.memory_allocated() - base)
    """)
    for allocator, res in r.items():
        assert res["err"] <= TOL, f"under {allocator}, torch.compile's outputs differ from eager: {res}"
        assert res["restores"] > 0, f"under {allocator} no checkpoint was put back: the test misses its path ({res})"
    assert r["gpumem"]["left"] <= r["torch"]["left"] + (1 << 20), r
    agree(r, "out")


@needs_library
@needs_gpu
def test_capture_forked_onto_a_second_stream():
    """A capture that forks work to a second stream (which joins the capture
    by waiting on the first), allocates there, and joins back: replays are
    right and tensors made afterwards keep their values."""
    r = both("""
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        static_x = torch.randn(1024, 1024, device=dev)
        def body(x):
            a = x * 2
            s2.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s2):
                b = a.sin()                 # allocated on s2, freed there
                c = b * 3 + 1               # allocated on s2, read on s1
                del b
            torch.cuda.current_stream().wait_stream(s2)
            return c + a, a, c
        s1.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s1):
            body(static_x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s1):
            static_y, _, _ = body(static_x)
        keep = keepers([(1024, 1024)] * 6 + [(512, 1024)] * 2)
        worst, bad = replays(g, static_x, static_y, lambda x: (x * 2).sin() * 3 + 1 + x * 2, keep)
        RESULT.update(changed=bad, err=worst, out=summary(static_y))
    """)
    for allocator, res in r.items():
        assert res["changed"] == [], (allocator, res)
        assert res["err"] <= TOL, (allocator, res)
    agree(r, "out")


def test_allocator_settings_said_to_have_no_effect():
    """PyTorch's CUDA allocator settings under gpumem: a warning once per
    setting that tunes the allocator gpumem replaces, from the environment
    at use() and from _set_allocator_settings (still passed on); none for
    PyTorch's host allocator's settings, nor for
    graph_capture_record_stream_reuse, which gpumem follows (from
    PYTORCH_ALLOC_CONF before PYTORCH_CUDA_ALLOC_CONF, as PyTorch reads
    them, and from each call, after PyTorch's own). caching_allocator_enable
    turns gpumem's cache off and on too (passed on to PyTorch as well), with
    no warning; so does PYTORCH_NO_CUDA_MEMORY_CACHING=1 at use()."""
    p = run("""
        import os, types, warnings
        import gpumem.torch as gt
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ("expandable_segments:True,pinned_use_cuda_host_register:True,"
                                                 "graph_capture_record_stream_reuse:False")
        os.environ["PYTORCH_ALLOC_CONF"] = "graph_capture_record_stream_reuse:True"
        passed = []
        memory = types.ModuleType("faketorch.cuda.memory")
        memory._set_allocator_settings = lambda env: passed.append(env)
        memory.caching_allocator_enable = lambda value=True: passed.append(value)
        cuda = types.ModuleType("faketorch.cuda")
        cuda.memory, cuda.caching_allocator_enable = memory, memory.caching_allocator_enable
        torch = types.SimpleNamespace(cuda=cuda)
        caching, reuse = [], []
        lib = types.SimpleNamespace(set_caching=caching.append, set_capture_reuse=reuse.append)
        os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            gt._patch_allocator_settings(torch, lib)
            memory._set_allocator_settings("graph_capture_record_stream_reuse:False")
            memory._set_allocator_settings("graph_capture_record_stream_reuse:True,max_split_size_mb:64")
            memory._set_allocator_settings("graph_capture_record_stream_reuse:maybe")
            memory._set_allocator_settings("pinned_num_register_threads:8")
            cuda.caching_allocator_enable(True)
            cuda.caching_allocator_enable(False)
            memory.caching_allocator_enable(False)
        for x in w:
            print(str(x.message))
        print("passed", [x for x in passed if isinstance(x, str)])
        print("caching", caching)
        print("reuse", reuse)
    """)
    lines = p.stdout.splitlines()
    assert len(lines) == 5, lines
    assert lines[0].startswith("gpumem: PYTORCH_CUDA_ALLOC_CONF sets expandable_segments for PyTorch's own CUDA allocator"), lines
    assert "no effect under gpumem.torch.use()" in lines[0] and "pinned" not in lines[0]
    assert "graph_capture_record_stream_reuse" not in lines[0], lines
    assert lines[1].startswith("gpumem: torch.cuda.memory._set_allocator_settings sets max_split_size_mb"), lines
    assert "graph_capture_record_stream_reuse" not in lines[1], lines
    assert lines[2] == ("passed ['graph_capture_record_stream_reuse:False', "
                        "'graph_capture_record_stream_reuse:True,max_split_size_mb:64', "
                        "'graph_capture_record_stream_reuse:maybe', 'pinned_num_register_threads:8']"), lines
    assert lines[3] == "caching [False, True, False, False]", lines  # the environment's, then each call
    # PYTORCH_ALLOC_CONF's True (PyTorch reads it first), then each call's;
    # "maybe" is left to PyTorch.
    assert lines[4] == "reuse [True, False, True]", lines


def test_capture_reuse_refused_is_a_warning():
    """A library that cannot follow graph_capture_record_stream_reuse (a
    driver that cannot show capture graphs) leaves the program running: a
    warning with gpumem's reason, after PyTorch's own setter ran."""
    p = run("""
        import types, warnings
        import gpumem.torch as gt
        from gpumem import _lib
        passed = []
        memory = types.ModuleType("faketorch.cuda.memory")
        memory._set_allocator_settings = passed.append
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=memory))
        def refuse(on):
            raise _lib.GpumemError(_lib.ERROR_DEVICE, "gpumem: the driver cannot show a capture's graph")
        lib = types.SimpleNamespace(set_caching=lambda on: None, set_capture_reuse=refuse)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            gt._patch_allocator_settings(torch, lib)
            memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
        print("passed", passed)
        for x in w:
            print("warning", x.message)
    """)
    lines = p.stdout.splitlines()
    assert lines[0] == "passed ['graph_capture_record_stream_reuse:True']", lines
    assert len(lines) == 2 and lines[1].startswith("warning gpumem: the driver cannot show a capture's graph"), lines
    assert "(graph_capture_record_stream_reuse)" in lines[1], lines


@needs_library
def test_capture_reuse_switch_on_the_simulated_device():
    """gpumem_set_capture_reuse through the library, on the simulated
    device (which shows capture graphs): on and off succeed."""
    p = run("""
        import gpumem
        lib = gpumem.library()
        lib.allocate(1 << 20, 0, 0)
        lib.set_capture_reuse(True)
        lib.set_capture_reuse(False)
        print("ok")
    """, env={"GPUMEM_CONFIG": SIM})
    assert p.stdout.strip().endswith("ok"), p.stdout


@needs_library
@needs_gpu
def test_capture_reuses_after_streams_join():
    """PyTorch's graph_capture_record_stream_reuse, as its own
    test_graph_capture_reclaim_4_streams uses it: a tensor of s1, read on
    s2, s3 and s4 (record_stream) and freed during the capture, is not
    reused before all three streams' work is joined into s1, and is once it
    is (the same address, under both allocators); replays compute what
    eager code does."""
    r = both("""
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
        s1, s2, s3, s4 = (torch.cuda.Stream() for _ in range(4))
        g = torch.cuda.CUDAGraph(keep_graph=True)
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            g.capture_begin()
            data1 = torch.ones(8, device=dev)
            data1_ptr = data1.data_ptr()
            sink1 = torch.empty_like(data1)
            sink3 = torch.empty_like(data1)
            bufs = []
            for k, s in ((2, s2), (3, s3), (4, s4)):
                s.wait_stream(s1)
                with torch.cuda.stream(s):
                    b = torch.empty_like(data1)
                    torch.add(data1, float(k), out=b)
                    data1.record_stream(s)
                bufs.append(b)
            del data1
            s1.wait_stream(s2)
            sink1.fill_(1.0)
            s3.wait_stream(s4)
            with torch.cuda.stream(s3):
                sink3.fill_(3.0)
            data2 = torch.empty(8, device=dev)
            s1.wait_stream(s3)
            sink1.add_(sink3)
            data3 = torch.empty(8, device=dev)
            data3.copy_(sink1)
            g.capture_end()
        torch.cuda.synchronize()
        g.instantiate()
        g.replay()
        torch.cuda.synchronize()
        RESULT.update(before=data2.data_ptr() == data1_ptr, after=data3.data_ptr() == data1_ptr,
                      bufs=[b.tolist() for b in bufs], data3=data3.tolist())
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:False")
    """)
    for allocator, res in r.items():
        assert res["before"] is False, f"under {allocator}, reused before the join: {res}"
        assert res["after"] is True, f"under {allocator}, not reused after the join: {res}"
        assert res["bufs"] == [[3.0] * 8, [4.0] * 8, [5.0] * 8], (allocator, res)
        assert res["data3"] == [4.0] * 8, (allocator, res)
