"""history_probe.py: does a PyTorch allocator hold the same memory on a
program's real run as on a replay of that run's own requests?

    python3 bench/train/history_probe.py run PROGRAM SNAPSHOT [--steps N]
    python3 bench/train/history_probe.py replay SNAPSHOT OUT_SNAPSHOT
    python3 bench/train/history_probe.py compare REAL_SNAPSHOT REPLAY_SNAPSHOT
    python3 bench/train/history_probe.py fixture SNAPSHOT PREFIX [N]

PROBE_HISTORY=0 runs without the history (nothing dumped: the run's own
peak, to see whether recording changes it); PROBE_GC=off turns Python's
cyclic garbage collector off for the run. The allocator is whatever PYTORCH_CUDA_ALLOC_CONF chooses (expandable
segments: expandable_segments:True). `run` runs a training program of
programs.py (or a corpus program, bench/corpus/programs.py) with PyTorch's memory history on (no stacks) and dumps it;
`replay` makes, in a fresh process, the same requests in the same order on
the same streams (torch.empty of the recorded block size; a free where the
history's free_completed is; torch.cuda.empty_cache() before the request
that follows a run of segment_unmap events, which only an empty cache or an
out-of-memory retry makes) with history on, and dumps that; each prints one
JSON line with max_memory_reserved. `compare` (no GPU, no PyTorch) walks
both histories side by side and prints where they first differ: the
reserved bytes after each event (maps minus unmaps), the first request
whose placement (offset in its segment) or whose segment growth differs,
and both peaks with the event index where each is reached. `fixture` (no
GPU) writes the first N requests (default 40,000) of a one-stream history as
PREFIX.trace.gz (a gpumem trace, times left out) and PREFIX.offsets.gz (per
allocation, the offset PyTorch gave it from the lowest address of its pool:
at most 1 MiB small, else large): what policy's
TestTorchExpandableAgainstRealHistory replays through the emulation.

Why: on beam_search_decode expandable segments reserved 814 MiB on the real
run and 853.5 MiB on a replay of the identical request sequence
(docs/BENCHMARKS.md); gpumem's real run and replay agree. Which events
differ says what the replay (ours and bench/peers') leaves out."""

import json
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

REQ = ("alloc", "free_completed")
SEG = ("segment_map", "segment_unmap", "segment_alloc", "segment_free")


def events(snap, device=0):
    return snap["device_traces"][device]


def cmd_run(prog, out, steps=None):
    import torch
    sys.path.insert(0, HERE)
    import programs
    if prog in programs.PROGRAMS:
        fn, default_steps = programs.PROGRAMS[prog]
        call = lambda: fn(steps or default_steps, lambda loss: torch.cuda.synchronize())  # noqa: E731
    else:  # a corpus program (bench/corpus/programs.py): runs whole
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "corpus"))
        del sys.modules["programs"]
        import programs as corpus
        call = corpus.PROGRAMS[prog][0]
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    history = os.environ.get("PROBE_HISTORY", "1") != "0"
    if os.environ.get("PROBE_GC") == "off":
        import gc
        gc.disable()
    if history:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=50_000_000)
    call()
    torch.cuda.synchronize()
    if history:
        torch.cuda.memory._dump_snapshot(out)
    print(json.dumps({"mode": "run", "program": prog, "history": history, "gc": os.environ.get("PROBE_GC", "on"),
                      "max_reserved": torch.cuda.max_memory_reserved(),
                      "max_allocated": torch.cuda.max_memory_allocated(),
                      "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}))


def cmd_replay(src, out):
    import torch
    with open(src, "rb") as f:
        ev = events(pickle.load(f))
    streams = {}
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    default = torch.cuda.current_stream().cuda_stream
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=50_000_000)
    live, unmapped, n = {}, False, 0
    for e in ev:
        a = e["action"]
        if a == "segment_unmap":
            unmapped = True
        elif a == "alloc":
            if unmapped:
                torch.cuda.empty_cache()
                unmapped = False
            s = e["stream"]
            if s not in streams:
                streams[s] = None if s in (0, default) else torch.cuda.Stream()
            st = streams[s]
            if st is None:
                live[e["addr"]] = torch.empty(e["size"], dtype=torch.uint8, device="cuda")
            else:
                with torch.cuda.stream(st):
                    live[e["addr"]] = torch.empty(e["size"], dtype=torch.uint8, device="cuda")
            n += 1
        elif a == "free_completed":
            live.pop(e["addr"], None)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(out)
    print(json.dumps({"mode": "replay", "requests": n, "streams": len(streams),
                      "max_reserved": torch.cuda.max_memory_reserved(),
                      "max_allocated": torch.cuda.max_memory_allocated(),
                      "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}))


def walk(ev):
    """Per request (alloc or free) in order: (action, size, offset from the
    lowest address seen, reserved after). Reserved follows segment events:
    map/alloc add, unmap/free subtract."""
    reserved, peak, at, rows = 0, 0, 0, []
    kinds = {}
    for e in ev:
        a = e["action"]
        kinds[a] = kinds.get(a, 0) + 1
        if a in ("segment_map", "segment_alloc"):
            reserved += e["size"]
        elif a in ("segment_unmap", "segment_free"):
            reserved -= e["size"]
        if a in SEG and reserved > peak:
            peak, at = reserved, len(rows)
        if a in REQ:
            rows.append((a, e["size"], e["addr"], reserved, e.get("stream", 0)))
    return rows, peak, at, kinds


def cmd_compare(real, replay):
    out = {}
    sides = {}
    for name, path in (("real", real), ("replay", replay)):
        with open(path, "rb") as f:
            snap = pickle.load(f)
        rows, peak, at, kinds = walk(events(snap))
        sides[name] = rows
        out[name] = {"requests": len(rows), "peak_reserved": peak, "peak_at_request": at, "actions": kinds,
                     "streams": sorted({r[4] for r in rows})}
    a, b = sides["real"], sides["replay"]
    first_size = first_res = None
    base_a = min(r[2] for r in a)
    base_b = min(r[2] for r in b)
    first_place = None
    for i, (x, y) in enumerate(zip(a, b)):
        if first_size is None and (x[0], x[1]) != (y[0], y[1]):
            first_size = i
        if first_place is None and x[0] == "alloc" and x[2] - base_a != y[2] - base_b:
            first_place = i
        if first_res is None and x[3] != y[3]:
            first_res = i
        if first_size is not None and first_res is not None and first_place is not None:
            break

    def ctx(i):
        if i is None:
            return None
        lo = max(0, i - 3)
        return {"index": i,
                "real": [(r[0], r[1], r[2] - base_a, r[3]) for r in a[lo:i + 3]],
                "replay": [(r[0], r[1], r[2] - base_b, r[3]) for r in b[lo:i + 3]]}
    out["first_request_differs"] = ctx(first_size)
    out["first_placement_differs"] = ctx(first_place)
    out["first_reserved_differs"] = ctx(first_res)
    print(json.dumps(out, indent=1))


def cmd_fixture(src, prefix, n=40000):
    import gzip
    with open(src, "rb") as f:
        ev = events(pickle.load(f))
    rows, ids, nid = [], {}, 0
    for e in ev:
        a = e["action"]
        if a not in REQ:
            continue
        if len(rows) >= n:
            break
        if e.get("stream", 0) != 0:
            sys.exit("history_probe: fixture: a request on stream %d; fixtures are of one-stream runs" % e["stream"])
        if a == "alloc":
            ids[e["addr"]] = nid
            rows.append(("a", nid, e["size"], e["addr"]))
            nid += 1
        else:
            rows.append(("f", ids.pop(e["addr"]), e["size"], e["addr"]))
    small = [r[3] for r in rows if r[0] == "a" and r[2] <= 1 << 20]
    large = [r[3] for r in rows if r[0] == "a" and r[2] > 1 << 20]
    base = (min(small) if small else 0, min(large) if large else 0)
    name = os.path.basename(prefix)
    with gzip.open(prefix + ".trace.gz", "wt") as f:
        f.write("# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US\n")
        f.write("# the first %d requests of a PyTorch memory history (bench/train/history_probe.py fixture), "
                "times left out; the offsets PyTorch gave them are %s.offsets.gz\n" % (len(rows), name))
        for k, i, size, _ in rows:
            f.write("a %d %d 0 0\n" % (i, size) if k == "a" else "f %d 0\n" % i)
    with gzip.open(prefix + ".offsets.gz", "wt") as f:
        f.write("# per allocation, in trace order: the offset PyTorch placed it at, from the lowest address "
                "of its pool (small: at most 1 MiB; large) in the same requests\n")
        for k, _, size, addr in rows:
            if k == "a":
                f.write("%d\n" % (addr - base[0 if size <= 1 << 20 else 1]))
    print(json.dumps({"requests": len(rows), "allocations": nid}))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "run" and len(rest) in (2, 4) and (len(rest) == 2 or rest[2] == "--steps"):
        cmd_run(rest[0], rest[1], int(rest[3]) if len(rest) == 4 else None)
    elif mode == "replay" and len(rest) == 2:
        cmd_replay(*rest)
    elif mode == "compare" and len(rest) == 2:
        cmd_compare(*rest)
    elif mode == "fixture" and len(rest) in (2, 3):
        cmd_fixture(rest[0], rest[1], *(int(x) for x in rest[2:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
