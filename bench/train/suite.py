"""suite.py [--programs a,b] [--allocators ...] [--out FILE]: every training
program under every allocator, one process each (native twice, to measure
the run-to-run noise), then the table (table.py). Results are JSON lines in
FILE (default $OUT/train.jsonl, else bench/out/train.jsonl)."""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import programs  # noqa: E402
import table  # noqa: E402

RUNS = [("native", ""), ("gpumem", ""), ("expandable", ""), ("native", "repeat")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", default=",".join(programs.PROGRAMS))
    ap.add_argument("--runs", default=",".join(f"{a}:{t}" if t else a for a, t in RUNS))
    ap.add_argument("--out")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--steps", type=int, default=0, help="steps per program (default: each program's own)")
    args = ap.parse_args()
    out = args.out or os.path.join(os.environ.get("OUT") or os.path.join(HERE, os.pardir, "out"), "train.jsonl")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    runs = [tuple((r.split(":") + [""])[:2]) for r in args.runs.split(",")]
    for prog in args.programs.split(","):
        for alloc, tag in runs:
            t0 = time.time()
            cmd = [sys.executable, os.path.join(HERE, "run.py"), prog, alloc, "--out", out, "--tag", tag, "--steps", str(args.steps)]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                ok = p.returncode == 0
                err = p.stderr[-2000:]
            except subprocess.TimeoutExpired:
                ok, err = False, f"timed out after {args.timeout} s"
            if not ok:
                with open(out, "a") as f:
                    f.write(json.dumps({"program": prog, "allocator": alloc, "tag": tag, "error": err}) + "\n")
            print(f"{prog:22s} {alloc:10s} {tag:7s} {'ok' if ok else 'FAILED'} {time.time() - t0:5.1f} s",
                  file=sys.stderr, flush=True)
            if not ok:
                print(err, file=sys.stderr)
    print(table.render(table.load(out)))


if __name__ == "__main__":
    main()
