"""Where CUDA's stream-ordered pool places a request: small scripted scenarios.

    python3 bench/peers/async_micro.py OUTDIR [SCENARIO...] [--jobs N]
    python3 bench/peers/async_micro.py --list

Each scenario isolates one question about the placement rule of the device's
default memory pool (holes of different sizes and ages, a hole against the
heap's end, where in a hole, mapped against unmapped 32 MiB granules, small
against large requests, merging, trimming). The pool is set up as
async_probe.py sets it up (its Driver class: release threshold UINT64_MAX,
reuse flags at their defaults); every request is cuMemAllocAsync on the legacy
default stream and every free cuMemFreeAsync on it, with no synchronize unless
the scenario says "sync", as in the trace probe.

Every scenario runs in a fresh process (the pool's state cannot leak from one
scenario into the next), twice: run 0 on the process's new pool, then
everything is freed, the context synchronized, the pool trimmed to 0
(cuMemPoolTrimTo) and run 1 repeats the script on the trimmed pool. Equal runs
say the scenario is deterministic and that a trim restores a fresh pool;
different runs say which is not so.

Output: OUTDIR/NAME.jsonl per scenario and OUTDIR/all.jsonl, one JSON line per
operation:
    {"scenario", "run", "i", "op": "alloc"|"free"|"sync"|"trim",
     "name", "size", "off", "end", "reserved", "used"}
off is the address minus the address of the run's first allocation (so runs
and processes compare), end = off + size; reserved and used are the pool's
RESERVED_MEM_CURRENT and USED_MEM_CURRENT after the operation. The first line
of each run (op "base") gives the base address in hex and base % 32 MiB. Each
scenario also prints one line with its question ("op": "question").

Names: h* are the holes under study (allocated, then freed), s* separators
that stay live so that holes do not merge, q* the requests whose placement
is the answer. Needs libcuda.so.1 only (no numpy, no PyTorch). The whole
run takes well under a minute on an H100.
"""

import ctypes
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from async_probe import Driver, ATTR_RESERVED_MEM_CURRENT, ATTR_USED_MEM_CURRENT  # noqa: E402

K = 1 << 10
M = 1 << 20

SCENARIOS = {}


def scenario(question):
    def reg(fn):
        SCENARIOS[fn.__name__] = (question, fn)
        return fn
    return reg


def layout(parts, sep):
    """Allocates each (name, size) of parts with a live separator of sep bytes
    after each, so that freeing any of them leaves a hole of its own."""
    ops = []
    for j, (name, size) in enumerate(parts):
        ops.append(("alloc", name, size))
        ops.append(("alloc", "s%d" % j, sep))
    return ops


def frees(names):
    return [("free", n) for n in names]


# --- which hole a request takes -------------------------------------------

def fit_order(unit, sizes, order, req, sep):
    parts = [("h%d" % s, s * unit) for s in sizes]
    ops = layout(parts, sep)
    ops += frees("h%d" % s for s in order)
    ops += [("alloc", "q1", req * unit), ("alloc", "q2", req * unit), ("alloc", "q3", unit)]
    return ops


_FIT_Q = ("holes h6 h4 h16 h8 (MiB, this address order) between 2 MiB separators, freed in "
          "the order given; then 5, 5, 1 MiB: best fit is h6, largest h16, latest freed that fits %s")


@scenario(_FIT_Q % "h8")
def fit_latest_is_h8():
    return fit_order(M, [6, 4, 16, 8], [6, 16, 4, 8], 5, 2 * M)


@scenario(_FIT_Q % "h6 (control: best = lowest = latest)")
def fit_latest_is_h6():
    return fit_order(M, [6, 4, 16, 8], [8, 16, 4, 6], 5, 2 * M)


@scenario(_FIT_Q % "h16 (= largest)")
def fit_latest_is_h16():
    return fit_order(M, [6, 4, 16, 8], [6, 8, 4, 16], 5, 2 * M)


@scenario(_FIT_Q % "h6, but h4 (no fit) freed last")
def fit_latest_nofit():
    return fit_order(M, [6, 4, 16, 8], [16, 8, 6, 4], 5, 2 * M)


@scenario("holes h8 h4 h16 h6 (MiB, this address order), freed h6 h16 h4 h8; then 5, 5, 1 MiB: "
          "lowest fitting and latest fitting are h8, best fit h6")
def fit_lowest_vs_best():
    return fit_order(M, [8, 4, 16, 6], [6, 16, 4, 8], 5, 2 * M)


@scenario("the fit_latest_is_h8 question at KiB scale: holes 6,4,16,8 KiB, 2 KiB separators, request 5 KiB")
def fit_kib():
    return fit_order(K, [6, 4, 16, 8], [6, 16, 4, 8], 5, 2 * K)


@scenario("the fit_latest_is_h8 question at 8 MiB units: holes 48,32,128,64 MiB, 2 MiB separators, request 40 MiB")
def fit_big():
    return fit_order(8 * M, [6, 4, 16, 8], [6, 16, 4, 8], 5, 2 * M)


@scenario("four equal 4 MiB holes e1..e4 (address order) freed e3 e1 e4 e2; then four 4 MiB requests: "
          "the order they are taken in (LIFO, FIFO, address)")
def equal_holes():
    ops = layout([("e%d" % j, 4 * M) for j in range(1, 5)], 2 * M)
    ops += frees(["e3", "e1", "e4", "e2"])
    ops += [("alloc", "q%d" % j, 4 * M) for j in range(1, 5)]
    return ops


@scenario("equal_holes with a context synchronize after the frees: does a completed free change the order?")
def equal_holes_sync():
    ops = layout([("e%d" % j, 4 * M) for j in range(1, 5)], 2 * M)
    ops += frees(["e3", "e1", "e4", "e2"]) + [("sync",)]
    ops += [("alloc", "q%d" % j, 4 * M) for j in range(1, 5)]
    return ops


@scenario("four equal 4 MiB holes freed e3 e1 e4 e2; then eight 2 MiB requests: is the rest of a split hole "
          "taken next, or another hole?")
def equal_holes_split():
    ops = layout([("e%d" % j, 4 * M) for j in range(1, 5)], 2 * M)
    ops += frees(["e3", "e1", "e4", "e2"])
    ops += [("alloc", "q%d" % j, 2 * M) for j in range(1, 9)]
    return ops


@scenario("holes of 4 MiB (freed first) and 8 MiB (freed last); requests 4 MiB then 4 MiB: exact fit or latest?")
def exact_vs_latest():
    ops = layout([("h4", 4 * M), ("h8", 8 * M)], 2 * M)
    ops += frees(["h4", "h8"])
    ops += [("alloc", "q1", 4 * M), ("alloc", "q2", 4 * M)]
    return ops


# --- where in a hole, hole against the end ----------------------------------

@scenario("a 16 MiB hole between separators; three 4 MiB requests: start or end of the hole, in which order")
def where_in_hole():
    ops = [("alloc", "s0", 2 * M), ("alloc", "h", 16 * M), ("alloc", "s1", 2 * M), ("free", "h")]
    ops += [("alloc", "q%d" % j, 4 * M) for j in range(1, 4)]
    return ops


@scenario("where_in_hole at KiB scale: a 16 KiB hole, three 4 KiB requests")
def where_in_hole_kib():
    ops = [("alloc", "s0", 2 * K), ("alloc", "h", 16 * K), ("alloc", "s1", 2 * K), ("free", "h")]
    ops += [("alloc", "q%d" % j, 4 * K) for j in range(1, 4)]
    return ops


@scenario("h 8 MiB at offset 0, s 2 MiB after it (all in mapped granule 0); free h; 4 MiB request: the hole or "
          "the heap's end (offset 10 MiB)?")
def hole_vs_end_mapped():
    return [("alloc", "h", 8 * M), ("alloc", "s", 2 * M), ("free", "h"), ("alloc", "q1", 4 * M),
            ("alloc", "q2", 4 * M)]


@scenario("h 64 MiB (granules 0-1) then s 2 MiB (granule 2); free h, so granules 0-1 unmap; 4 MiB request: the "
          "hole (a new granule) or the end at 66 MiB (granule 2, mapped)?")
def hole_vs_end_unmapped():
    return [("alloc", "h", 64 * M), ("alloc", "s", 2 * M), ("free", "h"), ("alloc", "q1", 4 * M),
            ("alloc", "q2", 4 * M)]


@scenario("s0 2 MiB, h 62 MiB (2-64 MiB: granule 0 stays mapped by s0, granule 1 unmaps), s1 2 MiB; free h; "
          "4 MiB then 40 MiB requests: hole start, hole end, or heap end?")
def hole_vs_end_partial():
    return [("alloc", "s0", 2 * M), ("alloc", "h", 62 * M), ("alloc", "s1", 2 * M), ("free", "h"),
            ("alloc", "q1", 4 * M), ("alloc", "q2", 40 * M)]


@scenario("a 8 MiB, b 8 MiB, free b (the last block is free); a 12 MiB request: on b's start (growing the heap "
          "by 4 MiB) or after it; then a 4 MiB request")
def hole_at_end():
    return [("alloc", "a", 8 * M), ("alloc", "b", 8 * M), ("free", "b"), ("alloc", "q1", 12 * M),
            ("alloc", "q2", 4 * M)]


@scenario("a 8 MiB, b 8 MiB, free a then b (the whole heap free, merged); 4 MiB, 20 MiB requests")
def all_free():
    return [("alloc", "a", 8 * M), ("alloc", "b", 8 * M), ("free", "a"), ("free", "b"),
            ("alloc", "q1", 4 * M), ("alloc", "q2", 20 * M)]


# --- granule state ------------------------------------------------------------

def granule_pref(order):
    # p0 [0,4) h1 [4,44) p1 [44,64) h2 [64,96) = granule 2 exactly, p3 [96,98) MiB.
    ops = [("alloc", "p0", 4 * M), ("alloc", "h1", 40 * M), ("alloc", "p1", 20 * M),
           ("alloc", "h2", 32 * M), ("alloc", "p3", 2 * M)]
    ops += frees(order)
    ops += [("alloc", "q1", 4 * M), ("alloc", "q2", 4 * M), ("alloc", "q3", 28 * M)]
    return ops


_GRAN_Q = ("h1 40 MiB hole at 4-44 MiB (its granules 0-1 stay mapped) and h2 32 MiB hole = granule 2 exactly "
           "(unmapped once free), freed %s; requests 4, 4, 28 MiB: mapped hole or best fit in an unmapped granule?")


@scenario(_GRAN_Q % "h1 then h2")
def granule_h2_latest():
    return granule_pref(["h1", "h2"])


@scenario(_GRAN_Q % "h2 then h1")
def granule_h1_latest():
    return granule_pref(["h2", "h1"])


@scenario("a 40 MiB block ending 8 MiB into granule 1, free; then a 20 MiB live block to 60 MiB; 4 MiB request: "
          "the heap end (room in mapped granule 1) or the hole (granule 0 unmapped)?")
def end_room_vs_unmapped_hole():
    return [("alloc", "h", 40 * M), ("alloc", "s", 20 * M), ("free", "h"), ("alloc", "q1", 4 * M),
            ("alloc", "q2", 4 * M)]


# --- sizes, segregation, merging, trimming -------------------------------------------

@scenario("requests of 512 B to 256 MiB in a row, some twice: rounding, alignment, and whether small and "
          "large requests share one range")
def sizes_in_a_row():
    sizes = [512, 1000, 1 * K, 4 * K, 64 * K, M - 512, M, M + 1, 2 * M, 2 * M + 512, 3 * M, 512, 4 * K,
             32 * M, 33 * M, 512, 64 * M, 4 * K, 256 * M, 512, 1 * M + 512, 100]
    return [("alloc", "q%d" % j, s) for j, s in enumerate(sizes)]


@scenario("large, small, large, small, free the smalls, then small and large requests: do small ones go to "
          "the small holes, and large ones past them?")
def small_holes_large_request():
    ops = [("alloc", "L1", 8 * M), ("alloc", "x1", 4 * K), ("alloc", "L2", 8 * M), ("alloc", "x2", 64 * K),
           ("alloc", "L3", 8 * M), ("free", "x1"), ("free", "x2")]
    ops += [("alloc", "q1", 2 * K), ("alloc", "q2", 8 * M), ("alloc", "q3", 32 * K), ("alloc", "q4", 64 * K)]
    return ops


@scenario("a b c d 4 MiB each and a separator; free b then c; an 8 MiB request: does it land on b "
          "(merged at once)? Then free a and d; a 12 MiB request")
def merge_now():
    ops = [("alloc", n, 4 * M) for n in "abcd"] + [("alloc", "s", 2 * M)]
    ops += frees(["b", "c"]) + [("alloc", "q1", 8 * M)]
    ops += frees(["a", "d"]) + [("alloc", "q2", 4 * M), ("alloc", "q3", 4 * M)]
    return ops


@scenario("a b c 4 MiB and a separator; free a, c, then b (b merges both); 12 MiB request")
def merge_three():
    ops = [("alloc", n, 4 * M) for n in "abc"] + [("alloc", "s", 2 * M)]
    ops += frees(["a", "c", "b"]) + [("alloc", "q1", 12 * M), ("alloc", "q2", 4 * M)]
    return ops


@scenario("100 MiB and 4 MiB, free both, synchronize, no trim; 4 MiB, 100 MiB: where does the heap restart?")
def refill_no_trim():
    return [("alloc", "a", 100 * M), ("alloc", "b", 4 * M), ("free", "a"), ("free", "b"), ("sync",),
            ("alloc", "q1", 4 * M), ("alloc", "q2", 100 * M)]


@scenario("100 MiB and 4 MiB, free both, trim to 0; 4 MiB, 100 MiB: where, and what is reserved?")
def refill_after_trim():
    return [("alloc", "a", 100 * M), ("alloc", "b", 4 * M), ("free", "a"), ("free", "b"), ("trim",),
            ("alloc", "q1", 4 * M), ("alloc", "q2", 100 * M)]


@scenario("a 40 MiB, b 4 MiB; free a; trim to 0 with b live; 4 MiB, 40 MiB: does the trim change placement?")
def trim_with_live():
    return [("alloc", "a", 40 * M), ("alloc", "b", 4 * M), ("free", "a"), ("trim",),
            ("alloc", "q1", 4 * M), ("alloc", "q2", 40 * M)]


@scenario("300 random operations (seed 1, sizes log-uniform 512 B - 64 MiB, a free 45% of the time): "
          "ground truth for a model, with no trace behind it")
def random_mix():
    rng = random.Random(1)
    ops, live, n = [], [], 0
    for _ in range(300):
        if live and rng.random() < 0.45:
            ops.append(("free", live.pop(rng.randrange(len(live)))))
        else:
            size = int(2 ** rng.uniform(9, 26))
            name = "r%d" % n
            n += 1
            ops.append(("alloc", name, size))
            live.append(name)
    return ops


# --- running ----------------------------------------------------------------------

def run_script(drv, name, run, ops, out):
    ptr = ctypes.c_uint64()
    val = ctypes.c_uint64()
    live = {}
    base = None

    def pool(attr):
        drv.check("cuMemPoolGetAttribute", drv.getattr(drv.pool, attr, ctypes.byref(val)))
        return val.value

    for i, op in enumerate(ops):
        rec = {"scenario": name, "run": run, "i": i, "op": op[0]}
        if op[0] == "alloc":
            _, n, size = op
            drv.check("cuMemAllocAsync(%s, %d)" % (n, size), drv.alloc(ctypes.byref(ptr), size, None))
            if base is None:
                base = ptr.value
                out.append({"scenario": name, "run": run, "op": "base", "base": hex(base),
                            "base_mod_32MiB": base % (32 * M)})
            live[n] = (ptr.value, size)
            rec.update(name=n, size=size, off=ptr.value - base, end=ptr.value - base + size)
        elif op[0] == "free":
            a, size = live.pop(op[1])
            drv.check("cuMemFreeAsync(%s)" % op[1], drv.free(a, None))
            rec.update(name=op[1], size=size, off=a - base, end=a - base + size)
        elif op[0] == "sync":
            drv.check("cuCtxSynchronize", drv.sync())
        elif op[0] == "trim":
            drv.check("cuCtxSynchronize", drv.sync())
            drv.check("cuMemPoolTrimTo", drv.cu.cuMemPoolTrimTo(drv.pool, ctypes.c_size_t(0)))
        else:
            raise ValueError("scenario %s: unknown operation %r at %d" % (name, op, i))
        rec.update(reserved=pool(ATTR_RESERVED_MEM_CURRENT), used=pool(ATTR_USED_MEM_CURRENT))
        out.append(rec)
    for a, _ in live.values():
        drv.check("cuMemFreeAsync", drv.free(a, None))


def one(name):
    """Runs scenario name twice in this process (see the docstring); prints its lines."""
    question, fn = SCENARIOS[name]
    out = [{"scenario": name, "op": "question", "question": question}]
    drv = Driver()
    for run in range(2):
        run_script(drv, name, run, fn(), out)
        drv.trim()
    for rec in out:
        print(json.dumps(rec))
    return 0


def main(argv):
    if "--list" in argv:
        for name, (question, _) in SCENARIOS.items():
            print("%-28s %s" % (name, question))
        return 0
    if len(argv) >= 2 and argv[0] == "--one":
        return one(argv[1])
    jobs = 4
    if "--jobs" in argv:
        j = argv.index("--jobs")
        jobs = int(argv[j + 1])
        del argv[j:j + 2]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    outdir, names = argv[0], argv[1:] or list(SCENARIOS)
    for n in names:
        if n not in SCENARIOS:
            print("async_micro: no scenario %r (--list lists them)" % n, file=sys.stderr)
            return 2
    os.makedirs(outdir, exist_ok=True)
    # A fresh process per scenario, a few at a time: each has its own pool.
    rc, pending, done = 0, list(names), []
    running = []
    while pending or running:
        while pending and len(running) < jobs:
            n = pending.pop(0)
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one", n],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            running.append((n, p))
        n, p = running.pop(0)
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            print("async_micro: scenario %s failed (exit %d): %s" % (n, p.returncode, stderr.strip()),
                  file=sys.stderr)
            rc = 1
            continue
        with open(os.path.join(outdir, n + ".jsonl"), "w") as f:
            f.write(stdout)
        done.append((n, stdout))
    order = {n: j for j, n in enumerate(names)}
    with open(os.path.join(outdir, "all.jsonl"), "w") as f:
        for n, stdout in sorted(done, key=lambda d: order[d[0]]):
            f.write(stdout)
            runs = [[(r["op"], r.get("name"), r.get("off")) for r in map(json.loads, stdout.splitlines())
                     if r.get("run") == k and r["op"] in ("alloc", "free")] for k in (0, 1)]
            print("%-28s runs %s" % (n, "equal" if runs[0] == runs[1] else "DIFFER"))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
