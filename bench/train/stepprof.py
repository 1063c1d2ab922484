"""stepprof.py PROGRAM ALLOCATOR [--steps N] [--profile-steps K] [--out FILE]:
where a training step's time goes, one JSON line (appended to FILE too).

Issue 40 asks why a program's step is slower under a limit (the default's
tightening) than unlimited. This runs one program of programs.py in this
process, as run.py does (a synchronize ends every step), and records:

- every step's wall time, and gpumem's counters' change over that step
  (driver calls, fences, creates are in device_calls; driver_ns and wait_ns,
  the host time of those calls and of the fences; misses and miss_ns, the
  allocations the cache did not serve at once and their host time; moves: splits, copies,
  copied_bytes, and split_ns, the host's wall time inside the moves);
- over K steps after the warm-up, a torch.profiler trace (CPU and CUDA):
  the GPU's busy time (the union of its kernels, copies and sets), so the
  GPU's idle time inside the steps; the host's time in CUDA runtime and
  driver calls by name (a host wait shows as a synchronize, gpumem's own
  driver calls as cuMem* where CUPTI reports them); and the CPU ops whose
  self time changed most (the allocator runs inside aten::empty* and the
  ops that allocate).

The limit comes from GPUMEM_CONFIG (limit=...), as for any gpumem program.
Compare two lines (unlimited, at the fit) with the same K: an allocator
cost on the host with the GPU waiting shows as GPU idle time and split_ns
or sync time; a cost on the GPU (copies) as GPU busy time."""

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

COUNTERS = ("device_calls", "fences", "splits", "copies", "copied_bytes", "split_ns", "allocs",
            "driver_ns", "wait_ns", "misses", "miss_ns")


def union_us(intervals):
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def summarize(trace_path):
    """GPU busy time, host CUDA call times and CPU op self times of a chrome trace."""
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    gpu, calls, ops = [], {}, {}
    first, last = None, None
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, ts, dur = e.get("cat", ""), float(e.get("ts", 0)), float(e.get("dur", 0))
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append((ts, ts + dur))
        elif cat in ("cuda_runtime", "cuda_driver"):
            c = calls.setdefault(e["name"], [0, 0.0])
            c[0] += 1
            c[1] += dur
        elif cat == "cpu_op":
            o = ops.setdefault(e["name"], [0, 0.0])
            o[0] += 1
            o[1] += dur
        if cat in ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "cuda_runtime", "cuda_driver"):
            first = ts if first is None else min(first, ts)
            last = ts + dur if last is None else max(last, ts + dur)
    return {
        "gpu_busy_us": union_us(gpu),
        "gpu_items": len(gpu),
        "trace_span_us": (last - first) if first is not None else 0,
        "cuda_calls": {k: {"n": v[0], "us": round(v[1], 1)} for k, v in sorted(calls.items(), key=lambda kv: -kv[1][1])[:25]},
        "cpu_ops": {k: {"n": v[0], "us": round(v[1], 1)} for k, v in sorted(ops.items(), key=lambda kv: -kv[1][1])[:25]},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("allocator", choices=["native", "expandable", "gpumem"])
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--profile-steps", type=int, default=4)
    ap.add_argument("--out")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    gm = None
    if args.allocator == "gpumem":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem.torch
        gpumem.torch.use()
        gm = gpumem.torch
    sys.path.insert(0, HERE)
    import programs
    from run import emit

    fn, default_steps = programs.PROGRAMS[args.program]
    warm = max(2, (args.steps or default_steps) // 5)
    steps = (args.steps or default_steps) + args.profile_steps
    prof_from, prof_to = steps - args.profile_steps, steps

    def counters():
        if gm is None:
            return {}
        st = dict(gm.stats())
        full = json.loads(gpumem.library().stats_json(0))  # the host time of driver calls and waits
        st["driver_ns"], st["wait_ns"] = full.get("DriverNanos", 0), full.get("WaitNanos", 0)
        st["misses"], st["miss_ns"] = full.get("Misses", 0), full.get("MissNanos", 0)
        return {k: st.get(k, 0) for k in COUNTERS}

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    rows = []
    state = {"t": time.perf_counter(), "c": counters(), "i": 0, "prof": None}
    trace_path = os.path.join(tempfile.mkdtemp(prefix="stepprof-"), "trace.json")

    def log(loss):
        torch.cuda.synchronize()
        now = time.perf_counter()
        c = counters()
        i = state["i"]
        rows.append({"step": i, "ms": (now - state["t"]) * 1e3, "profiled": state["prof"] is not None,
                     **{k: c[k] - state["c"].get(k, 0) for k in c}, "loss": float(loss.detach())})
        state["i"] = i + 1
        if state["i"] == prof_from and args.profile_steps > 0:
            from torch.profiler import ProfilerActivity, profile
            state["prof"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            state["prof"].__enter__()
        elif state["i"] == prof_to and state["prof"] is not None:
            state["prof"].__exit__(None, None, None)
            state["prof"].export_chrome_trace(trace_path)
            state["prof"] = None
        state["c"] = counters()
        state["t"] = time.perf_counter()

    fn(steps, log)
    torch.cuda.synchronize()

    plain = [r for r in rows[warm:] if not r["profiled"]]
    profiled = [r for r in rows if r["profiled"]]
    rec = {
        "program": args.program, "allocator": args.allocator, "tag": args.tag,
        "config": os.environ.get("GPUMEM_CONFIG", ""), "warm": warm,
        "median_step_ms": statistics.median(r["ms"] for r in plain) if plain else None,
        "per_step_median": {k: statistics.median(r[k] for r in plain) for k in COUNTERS if plain and k in plain[0]},
        "profiled_steps_ms": [round(r["ms"], 3) for r in profiled],
        "steps": rows,
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
    }
    if os.path.exists(trace_path):
        rec["profile"] = summarize(trace_path)
        window_us = sum(r["ms"] for r in profiled) * 1e3
        rec["profile"]["window_us"] = window_us
        rec["profile"]["gpu_idle_us_per_step"] = (window_us - rec["profile"]["gpu_busy_us"]) / max(1, len(profiled))
        rec["profile"]["gpu_busy_us_per_step"] = rec["profile"]["gpu_busy_us"] / max(1, len(profiled))
    if gm is not None:
        rec["gpumem_stats"] = gm.stats()
    emit(rec, args.out)


if __name__ == "__main__":
    main()
