"""stats_cost.py ALLOCATOR [--live N] [--calls K] [--out FILE]: what PyTorch's
memory questions cost inside a real PyTorch process, under PyTorch's
allocator ("native") or gpumem ("gpumem"), with many tensors live: 2N
tensors of 64 KiB to 1 MiB made and every other one freed (N live between N
free blocks), then torch.cuda.memory_allocated, max_memory_allocated,
memory_reserved, max_memory_reserved, memory_stats and mem_get_info each
called K times. A JSON line: microseconds per call of each, the median of
five timed loops, and the figures each allocator gave (memory_allocated
must equal the live tensors' bytes rounded as the allocator rounds them,
and memory_stats' "allocated_bytes.all.current" must equal
memory_allocated).

Programs and libraries ask memory_allocated at every step, some at every
layer; PyTorch answers from counters. gpumem answered from its whole
statistics until its Usage (docs/BENCHMARKS.md, "torch.cuda.memory_allocated()
and a pool's used bytes: counts, not a walk"): 0.33-0.38 ms with 40,000
blocks in the Go benchmark. This is the same question asked of the real
path (ctypes, the C library, the host layer)."""

import argparse
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("allocator", choices=["native", "gpumem"])
    ap.add_argument("--live", type=int, default=20000)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch
    if args.allocator == "gpumem":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem.torch
        gpumem.torch.use()
    torch.zeros(1, device="cuda")
    rng = random.Random(1)
    tensors = [torch.empty(64 * 1024 + rng.randrange(960 * 1024), dtype=torch.uint8, device="cuda")
               for _ in range(2 * args.live)]
    del tensors[::2]
    torch.cuda.synchronize()
    live_bytes = sum(t.numel() for t in tensors)
    questions = {
        "memory_allocated": torch.cuda.memory_allocated,
        "max_memory_allocated": torch.cuda.max_memory_allocated,
        "memory_reserved": torch.cuda.memory_reserved,
        "max_memory_reserved": torch.cuda.max_memory_reserved,
        "memory_stats": torch.cuda.memory_stats,
        "mem_get_info": torch.cuda.mem_get_info,
    }
    us = {}
    for name, fn in questions.items():
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            runs.append((time.perf_counter() - t0) / args.calls * 1e6)
        us[name] = round(statistics.median(runs), 3)
    allocated = torch.cuda.memory_allocated()
    stats_allocated = torch.cuda.memory_stats().get("allocated_bytes.all.current")
    rec = {"allocator": args.allocator, "live": len(tensors), "live_bytes": live_bytes,
           "memory_allocated": allocated, "stats_allocated": stats_allocated,
           "memory_reserved": torch.cuda.memory_reserved(), "us_per_call": us,
           "ok": allocated >= live_bytes and stats_allocated == allocated}
    line = json.dumps(rec)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    if not rec["ok"]:
        sys.exit("stats_cost: memory_allocated %d for %d live bytes, memory_stats says %s" % (allocated, live_bytes, stats_allocated))


if __name__ == "__main__":
    main()
