"""suite.py [--programs ...] [--modes ...] [--out FILE] [--gpumem PATH]:
every JAX program (programs.py) under every allocator mode, one process
each, then the table. Modes:

    default     BFC, preallocating 75% of the GPU
    bfc-growth  BFC with XLA_PYTHON_CLIENT_PREALLOCATE=false
    platform    XLA_PYTHON_CLIENT_ALLOCATOR=platform (a driver call per buffer)
    cuda-async  XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async, preallocation off
    gpumem      gpumem run -- python3 run.py ...
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODES = {
    "default": {},
    "bfc-growth": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "platform": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
    "cuda-async": {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "gpumem": {},
}
# A mode name ending in "2" is the same mode run again (the run-to-run noise).
for _m in list(MODES):
    MODES[_m + "2"] = MODES[_m]
GIB = 1 << 30


def table(path):
    rows = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            rows[(r["program"], r["mode"])] = r
    out = ["| program | mode | NVML MiB above start: peak / after del + gc + clear_caches | release ms | peak vs bfc-growth | median step ms by phase | vs bfc-growth | losses equal bfc-growth |",
           "| --- | --- | --- | ---: | ---: | --- | --- | --- |"]
    for (prog, mode), r in rows.items():
        if "error" in r:
            out.append(f"| {prog} | {mode} | failed: {r['error'][-200:]!r} | | | | | |")
            continue
        base = rows.get((prog, "bfc-growth"))
        mib = lambda b: (b - r["nvml_start_bytes"]) / (1 << 20)  # noqa: E731
        vs_peak = "%.3f" % (r["nvml_peak_bytes"] / base["nvml_peak_bytes"]) if base and "error" not in base else "-"
        steps = " / ".join("%s %.2f" % (k, v) for k, v in r["median_step_ms"].items())
        vs = "-"
        if base and "error" not in base:
            vs = " / ".join("%+.1f%%" % ((v / base["median_step_ms"][k] - 1) * 100)
                            for k, v in r["median_step_ms"].items() if k in base["median_step_ms"])
        same = "-" if not base or "error" in base else ("yes" if r["losses"] == base["losses"] else
                                                          "max diff %.1e" % max(abs(a - b) / max(abs(b), 1e-9) for a, b in zip(r["losses"], base["losses"])))
        out.append("| %s | %s | %.0f / %.0f | %s | %s | %s | %s | %s |" % (
            prog, mode, mib(r["nvml_peak_bytes"]), mib(r["nvml_after_cleanup_bytes"]),
            "-" if r["release_ms"] is None else "%.0f" % r["release_ms"], vs_peak, steps, vs, same))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", default="mlp,lm,rebuild")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "jax.jsonl"))
    ap.add_argument("--gpumem", default=os.path.join(ROOT, "build", "gpu", "gpumem"))
    ap.add_argument("--timeout", type=int, default=240)
    args = ap.parse_args()
    for prog in args.programs.split(","):
        for mode in args.modes.split(","):
            env = dict(os.environ, **MODES[mode])
            cmd = [sys.executable, os.path.join(HERE, "run.py"), prog, mode, "--out", args.out]
            if mode.startswith("gpumem"):
                cmd = [args.gpumem, "run", "--"] + cmd
            t0 = time.time()
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
                ok, err = p.returncode == 0, p.stderr[-3000:]
            except subprocess.TimeoutExpired:
                ok, err = False, f"timed out after {args.timeout} s"
            if not ok:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"program": prog, "mode": mode, "error": err}) + "\n")
            print(f"{prog:8s} {mode:10s} {'ok' if ok else 'FAILED'} {time.time() - t0:5.1f} s", file=sys.stderr, flush=True)
            if not ok:
                print(err, file=sys.stderr)
    print(table(args.out))


if __name__ == "__main__":
    main()
