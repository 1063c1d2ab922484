#!/usr/bin/env python3
"""The capacity a program needs for one pass of its trace and for N passes
(gpumem fit --passes), under gpumem's two placements and PyTorch's
allocators as emulated: what the ten-pass drift costs a job that repeats
its trace, in GPU memory to buy.

    python3 bench/core/fit_passes.py [--passes 10] [--jobs 2] [--out DIR] [--binary GPUMEM] TRACE...

Builds the CLI from the working tree (or takes --binary), runs `gpumem fit --policy P [--passes N]`
for every trace and policy (in parallel), keeps each output in DIR, and
prints one markdown table: capacity / peak live for one pass and N passes,
per policy. Simulated device; decisions are the GPU's (docs/BENCHMARKS.md).
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICIES = ["gpumem", "gpumem-compact", "torch-expandable", "torch-native"]


def parse_size(s):
    n, u = s.split()
    return float(n) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[u]


def run(binary, trace, policy, passes, outdir):
    name = os.path.basename(trace).split(".")[0]
    args = [binary, "fit", "--policy", policy] + (["--passes", str(passes)] if passes > 1 else []) + [trace]
    p = subprocess.run(args, capture_output=True, text=True)
    path = os.path.join(outdir, f"{name}.{policy}.{passes}.txt")
    with open(path, "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {p.returncode}: {p.stderr}")
    m = re.search(r"^" + re.escape(policy) + r"\s+(\S+ \S+)\s+(\S+)\s+(\S+ \S+)", p.stdout, re.M)
    live = re.search(r"peak live ([\d.]+ [KMGT]?i?B)", p.stdout)
    return name, policy, passes, parse_size(m.group(1)) / parse_size(live.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=None)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--binary", default=None, help="a gpumem binary to use instead of building one (on a machine without Go)")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="gpumem-fit-")
    os.makedirs(out, exist_ok=True)
    binary = a.binary
    if binary is None:
        binary = os.path.join(tempfile.mkdtemp(prefix="gpumem-fitbin-"), "gpumem")
        subprocess.run(["go", "build", "-o", binary, "./cmd/gpumem"], cwd=ROOT, check=True, env=dict(os.environ, CGO_ENABLED="0"))
    pols = a.policies.split(",")
    # The longest first (ten passes of the largest traces), so that the
    # last to finish are short.
    jobs = [(t, p, n) for t in a.traces for p in pols for n in (1, a.passes)]
    jobs.sort(key=lambda j: -os.path.getsize(j[0]) * j[2])
    res = {}
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
        for name, pol, n, x in ex.map(lambda j: run(binary, j[0], j[1], j[2], out), jobs):
            res[(name, pol, n)] = x
    names = []
    for t in a.traces:
        n = os.path.basename(t).split(".")[0]
        if n not in names:
            names.append(n)
    print(f"capacity / peak live, one pass / {a.passes} passes (`gpumem fit --policy P [--passes {a.passes}]`); outputs in {out}\n")
    print("| trace | " + " | ".join(pols) + " |")
    print("| --- |" + " ---: |" * len(pols))
    for n in names:
        cells = []
        for p in pols:
            one, many = res[(n, p, 1)], res[(n, p, a.passes)]
            cells.append(f"{one:.3f} / {many:.3f}" + (" **+%.3f**" % (many - one) if many - one >= 0.01 else ""))
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
