"""alloc_bench.py ALLOCATOR [--out FILE]: the cost of PyTorch's allocation
path inside a real PyTorch process, under PyTorch's allocator ("native"),
gpumem ("gpumem") or a CUDAPluggableAllocator that does almost nothing
("pluggable": the floor of PyTorch's pluggable path, which gpumem goes
through): torch.empty then del in a loop, for a few sizes,
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


NOOP = r"""
#include <dlfcn.h>
#include <stddef.h>
typedef int (*alloc_t)(unsigned long long *, size_t);
static alloc_t cu_alloc;
enum { N = 256 };
static size_t sizes[N];
static void *ptrs[N];
static int n;
void *noop_alloc(size_t size, int device, void *stream) {
    for (int i = n - 1; i >= 0; i--)
        if (sizes[i] == size) {
            void *p = ptrs[i];
            n--;
            sizes[i] = sizes[n];
            ptrs[i] = ptrs[n];
            return p;
        }
    if (!cu_alloc) cu_alloc = (alloc_t)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuMemAlloc_v2");
    unsigned long long p = 0;
    return cu_alloc(&p, size) ? NULL : (void *)p;
}
void noop_free(void *ptr, size_t size, int device, void *stream) {
    if (n < N) {
        sizes[n] = size;
        ptrs[n++] = ptr;
    }
}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("allocator", choices=["native", "gpumem", "pluggable"])
    ap.add_argument("--out")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    import torch
    if args.allocator == "gpumem":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem.torch
        gpumem.torch.use()
    elif args.allocator == "pluggable":
        # The floor of any CUDAPluggableAllocator: PyTorch's own path
        # around an allocator that does nearly nothing (a free list per
        # size over cuMemAlloc), compiled here.
        import subprocess
        import tempfile
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "noop.c"), "w") as f:
            f.write(NOOP)
        so = os.path.join(d, "libnoop.so")
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", so, os.path.join(d, "noop.c"), "-ldl"], check=True)
        torch.cuda.memory.change_current_allocator(torch.cuda.memory.CUDAPluggableAllocator(so, "noop_alloc", "noop_free"))
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
