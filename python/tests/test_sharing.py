"""CUDA tensors shared between processes under gpumem (gpumem/_sharing.py).

The GPU tests run a script of their own (spawned children must import it)
with torch.multiprocessing, both ways, with and without gpumem in each
process, and check the data, the writes each side sees of the other, and
that the memory comes back once both have let go. An unsupported form must
fail at once in the sender, never hang: every wait has a timeout. The rest
runs anywhere: the library on the simulated device refuses to share with
its one line, and the counters' states."""

import json
import os
import subprocess
import sys
import textwrap

from conftest import PACKAGE, needs_gpu, needs_library, run

SIM = "device=sim,capacity=1GiB,check=true"


@needs_library
def test_share_refused_on_the_simulated_device():
    p = run("""
        import gpumem._lib as L
        lib = L.load()
        ptr = lib.allocate(1 << 20, 0, 0)
        try:
            lib.share(ptr, 0)
        except L.GpumemError as e:
            print(e.status == L.ERROR_NOT_SHAREABLE, str(e))
        else:
            print("shared")
        try:
            lib.share(ptr + 512, 0)
        except L.GpumemError as e:
            print(e.status == L.ERROR_INVALID_POINTER, str(e))
        lib.deallocate(ptr, 0)
    """, config=SIM)
    first, second = p.stdout.splitlines()
    assert first.startswith("True ") and "cannot share memory between processes" in first, first
    assert second.startswith("True ") and "did not allocate this address" in second, second


def test_slots_say_who_holds():
    """A slot is held in flight (-1) and by a live pid; not when cleared (0)
    or when its pid has exited."""
    p = run("""
        import os, subprocess, sys
        from gpumem import _sharing
        s = _sharing._Slots(8)
        i = s.take()
        out = [s.held(i)]
        s.words[i] = os.getpid(); out.append(s.held(i))
        child = subprocess.Popen([sys.executable, "-c", "pass"]); child.wait()
        s.words[i] = child.pid; out.append(s.held(i))
        s.words[i] = 0; out.append(s.held(i))
        print(out)
    """)
    assert p.stdout.strip() == "[True, True, False, False]", p.stdout


SCRIPT = r'''
import gc, json, os, sys, time
import torch
import torch.multiprocessing as mp

N = 10 << 20  # 40 MiB of float32: several of gpumem's spans


def use_gpumem(on):
    if on:
        import gpumem.torch
        gpumem.torch.use()


def exports():
    try:
        from gpumem import _sharing
    except ImportError:
        return 0
    return len(_sharing._exports)


def settle(base):
    """Collects what the other process has let go, for up to 30 s, until
    nothing is exported and memory_allocated() is back at base."""
    gc.collect()
    torch.cuda.synchronize()
    deadline = time.time() + 30
    while True:
        torch.cuda.ipc_collect()
        if exports() == 0 and torch.cuda.memory_allocated() == base or time.time() > deadline:
            return
        time.sleep(0.05)


def child(q_in, q_out, on):
    use_gpumem(on)
    xs = q_in.get(timeout=120)
    got = {"sums": [float(x.detach().double().sum()) for x in xs], "shapes": [list(x.shape) for x in xs],
           "strides": [list(x.stride()) for x in xs], "dtypes": [str(x.dtype) for x in xs],
           "grad": [x.requires_grad for x in xs]}
    with torch.no_grad():
        xs[0].add_(1)  # the parent must see it
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = torch.arange(N, device="cuda", dtype=torch.float32) * 3
    q_out.put((got, y))
    q_in.get(timeout=120)  # the parent has read y and let it go
    del xs
    gc.collect()
    q_out.put("released")
    del y
    settle(base)
    q_out.put({"child_exports": exports(), "child_back": torch.cuda.memory_allocated() == base})
    q_in.get(timeout=120)


if __name__ == "__main__":
    parent_on, child_on = sys.argv[1] == "1", sys.argv[2] == "1"
    use_gpumem(parent_on)
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q_in, q_out, child_on))
    p.start()
    base = torch.cuda.memory_allocated()
    a = torch.arange(1000, device="cuda", dtype=torch.float32)
    b = torch.arange(N, device="cuda", dtype=torch.float32)
    c = torch.arange(4096, device="cuda", dtype=torch.float64).reshape(64, 64).t()[3:]  # a strided view
    w = torch.nn.Parameter(torch.full((256,), 2.0, device="cuda"))
    d = torch.ones(160 << 20, device="cuda")  # 640 MiB: more chunks than the first call has room for
    xs = [a, b, c, w, d]
    want = [float(x.detach().double().sum()) for x in xs]
    q_in.put(xs)
    got, y = q_out.get(timeout=120)
    torch.cuda.synchronize()
    r = {"sums_ok": got["sums"] == want,
         "shapes_ok": got["shapes"] == [list(x.shape) for x in xs],
         "strides_ok": got["strides"] == [list(x.stride()) for x in xs],
         "dtypes_ok": got["dtypes"] == [str(x.dtype) for x in xs],
         "grad_ok": got["grad"] == [False, False, False, True, False],
         "child_write_seen": float(a.double().sum()) == want[0] + 1000,
         "y_ok": float(y.double().sum()) == 3.0 * (N - 1) * N / 2}
    del y
    gc.collect()
    q_in.put("ack")
    r["child_released"] = q_out.get(timeout=120) == "released"
    del xs, a, b, c, w, d
    settle(base)
    r["parent_exports"] = exports()
    r["parent_back"] = torch.cuda.memory_allocated() == base
    r.update(q_out.get(timeout=120))
    q_in.put("bye")
    p.join(60)
    r["child_exit"] = p.exitcode
    print("RESULT " + json.dumps(r))
'''

UNSUPPORTED = r'''
import sys, time
import torch
import torch.multiprocessing as mp
import gpumem.torch

def child(q):
    q.get(timeout=30)

if __name__ == "__main__":
    gpumem.torch.use()
    torch.cuda.caching_allocator_enable(False)  # each buffer the driver's own: not in gpumem's chunks
    x = torch.ones(1000, device="cuda")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    t0 = time.time()
    try:
        q.put(x)
    except RuntimeError as e:
        print("QUEUE", round(time.time() - t0, 3), str(e).splitlines()[0])
    else:
        print("QUEUE accepted")
    jq = ctx.JoinableQueue()
    try:
        jq.put(x)
    except RuntimeError as e:
        print("JOINABLE", str(e).splitlines()[0])
    else:
        print("JOINABLE accepted")
    a, b = ctx.Pipe()
    try:
        a.send(x)
    except RuntimeError as e:
        print("PIPE", str(e).splitlines()[0])
    else:
        print("PIPE accepted")
'''


def _script(tmp_path, text, *args, timeout=300):
    f = tmp_path / "script.py"
    f.write_text(textwrap.dedent(text))
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("GPUMEM_CONFIG", None)
    return subprocess.run([sys.executable, str(f), *args], env=env, capture_output=True, text=True, timeout=timeout)


@needs_library
@needs_gpu
def test_torch_multiprocessing_both_ways(tmp_path):
    for parent_on, child_on in (("1", "1"), ("1", "0"), ("0", "1")):
        p = _script(tmp_path, SCRIPT, parent_on, child_on)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        where = f"parent gpumem {parent_on}, child gpumem {child_on}"
        assert p.returncode == 0 and line, f"{where}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
        r = json.loads(line[-1][len("RESULT "):])
        bad = {k: v for k, v in r.items() if v not in (True, 0)}
        assert not bad, f"{where}: {r}"


@needs_library
@needs_gpu
def test_unsupported_fails_at_once_in_the_sender(tmp_path):
    p = _script(tmp_path, UNSUPPORTED, timeout=120)
    out = p.stdout.splitlines()
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    q = [l for l in out if l.startswith("QUEUE")][0]
    assert "gpumem: cannot share this CUDA tensor" in q and float(q.split()[1]) < 5, out
    pipe = [l for l in out if l.startswith("PIPE")][0]
    assert "gpumem: cannot share this CUDA tensor" in pipe, out
    joinable = [l for l in out if l.startswith("JOINABLE")][0]
    assert "gpumem: cannot share this CUDA tensor" in joinable, out


def test_queue_put_exports_in_the_caller():
    """Queue.put and JoinableQueue.put, as _sharing installs them, run the
    export before the object reaches the feeder thread: its error is the
    caller's, and nothing is queued."""
    p = run("""
        import multiprocessing as mp
        from gpumem import _sharing
        def refuse(obj, depth=0):
            raise _sharing.SharingError("gpumem: cannot share this CUDA tensor (test)")
        _sharing._prepare = refuse
        ctx = mp.get_context("spawn")
        for cls in (type(ctx.Queue()), type(ctx.JoinableQueue())):
            q = cls(ctx=ctx)
            put = _sharing._exporting(cls.__dict__["put"])
            try:
                put(q, object())
            except _sharing.SharingError as e:
                print(cls.__name__, q.empty(), str(e))
    """)
    lines = p.stdout.splitlines()
    assert lines == ["Queue True gpumem: cannot share this CUDA tensor (test)",
                     "JoinableQueue True gpumem: cannot share this CUDA tensor (test)"], p.stdout


def test_collect_reads_each_send_in_its_own_file():
    """Sends made before the counters' file was replaced (full) are read in
    the file they were given: a storage is let go (gpumem_unshare, its
    descriptors closed) only once all of its sends, in either file, are
    released, and each slot goes back to its own file."""
    p = run("""
        import os
        from gpumem import _sharing as S
        unshared = []
        class Lib:
            def unshare(self, ptr, device):
                unshared.append(ptr)
        S._state["lib"] = Lib()
        old, new = S._Slots(2), S._Slots(2)
        e = S._Export(object(), 0x1000, 0, 0x1000, [(os.open(os.devnull, os.O_RDONLY), 2 << 20)])
        S._exports[(0, 0x1000)] = e
        i, j = old.take(), new.take()
        e.sends = [(old, i, None), (new, j, None)]
        new.words[j] = 0                      # released in the new file
        first = S.collect()                   # the old file's send is still in flight
        old.words[i] = 0
        second = S.collect()
        print(first, second, unshared == [0x1000], i in old.free, j in new.free, S._exports == {}, e.storage is None)
    """)
    assert p.stdout.split() == ["0", "1", "True", "True", "True", "True", "True"], p.stdout


def test_collect_keeps_what_queue_put_exported():
    """What Queue.put exported for a send not yet pickled stays when the
    feeder thread's pickling collects (keep_unsent); an explicit collect
    (torch.cuda.ipc_collect) lets it go. A failing unshare warns and
    fails nothing."""
    p = run("""
        import os, warnings
        from gpumem import _sharing as S
        class Lib:
            def unshare(self, ptr, device):
                raise RuntimeError("gpumem: test refusal")
        S._state["lib"] = Lib()
        e = S._Export(object(), 0x2000, 0, 0x2000, [(os.open(os.devnull, os.O_RDONLY), 2 << 20)])
        S._exports[(0, 0x2000)] = e
        kept = S.collect(keep_unsent=True)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            dropped = S.collect()
        print(kept, dropped, S._exports == {}, len(w) == 1 and "test refusal" in str(w[0].message))
    """)
    assert p.stdout.split() == ["0", "1", "True", "True"], p.stdout


def test_driver_pushed_pops_whatever_happens():
    """_Driver.pushed makes a context current for its block and pops it
    after, when the block raises too (every receiver's driver call runs in
    one)."""
    p = run("""
        from gpumem import _sharing as S
        seen = []
        drv = object.__new__(S._Driver)
        drv.f = {"cuCtxPushCurrent_v2": lambda ctx: seen.append(("push", ctx)) or 0,
                 "cuCtxPopCurrent_v2": lambda out: seen.append(("pop",)) or 0}
        with drv.pushed(7):
            seen.append(("work",))
        try:
            with drv.pushed(8):
                raise KeyError("x")
        except KeyError:
            pass
        print(seen)
    """)
    assert p.stdout.strip() == "[('push', 7), ('work',), ('pop',), ('push', 8), ('pop',)]", p.stdout
