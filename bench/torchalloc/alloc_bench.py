"""alloc_bench.py ALLOCATOR [--out FILE]: the cost of PyTorch's allocation
path inside a real PyTorch process, under PyTorch's allocator ("native")
or gpumem ("gpumem"): torch.empty then del in a loop, for a few sizes,
each timed over many repetitions after a warm-up (every request a cache
hit). A JSON line per size: microseconds per empty+del pair, the median
of REPEAT timed loops. Kernel-free: what the host pays per tensor, which
latency-bound programs (token-by-token generation) pay thousands of times
per step."""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("allocator", choices=["native", "gpumem"])
    ap.add_argument("--out")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    import torch
    if args.allocator == "gpumem":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem.torch
        gpumem.torch.use()
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    rows = []
    for nbytes in (512, 64 << 10, 4 << 20, 64 << 20):
        n = nbytes // 4

        def loop(k):
            t0 = time.perf_counter()
            for _ in range(k):
                x = torch.empty(n, device=dev)
                del x
            return (time.perf_counter() - t0) / k * 1e6

        loop(2000)  # warm: the block is cached
        times = [loop(args.n) for _ in range(args.repeat)]
        # Two live at once, freed in turn: a pattern with a neighbour.
        keep = torch.empty(n, device=dev)
        pair = [loop(args.n) for _ in range(args.repeat)]
        del keep
        rows.append({"allocator": args.allocator, "bytes": nbytes, "us_per_pair": statistics.median(times),
                     "us_per_pair_with_neighbour": statistics.median(pair), "spread": [min(times), max(times)]})
    text = "\n".join(json.dumps(r) for r in rows)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
