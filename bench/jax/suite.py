"""suite.py [--programs ...] [--modes ...] [--out FILE] [--gpumem PATH]:
every JAX program (programs.py) under every allocator mode, one process
each, then the table. Modes:

    default     BFC, preallocating 75% of the GPU
    bfc-growth  BFC with XLA_PYTHON_CLIENT_PREALLOCATE=false
    platform    XLA_PYTHON_CLIENT_ALLOCATOR=platform (a driver call per buffer)
    cuda-async  XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async, preallocation off
    gpumem      gpumem run -- python3 run.py ... (the idle release is timed)
    gpumem-trim the same, gpumem.trim() at once after the cleanup (timed)
    gpumem-compact  gpumem run with GPUMEM_CONFIG=compact=true (gpumem.Config.Compact)

A mode name ending in "2" is the same mode run again: --modes
bfc-growth,gpumem,bfc-growth2,gpumem-trim alternates BFC growth and gpumem
in separate processes, A/B/A/B, and --ab prints each run's median step time
by phase, the spread of each mode's runs, and gpumem against BFC growth.
Under gpumem the shim's report (GPUMEM_PRELOAD_REPORT=1: stream captures
begun, allocations passed to the driver while captured) is kept as a record
of its own. --deadline stops starting runs that could not end in time.
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
    "gpumem": {"GPUMEM_PRELOAD_REPORT": "1"},
    "gpumem-trim": {"GPUMEM_PRELOAD_REPORT": "1"},
    "gpumem-compact": {"GPUMEM_PRELOAD_REPORT": "1", "GPUMEM_CONFIG": "compact=true"},
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
            if "preload" not in r and "skipped" not in r:
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


def ab_table(path):
    """Step times of alternating runs: per program and phase, each run's
    median (ms), each mode's spread (max / min - 1 over its runs), and
    gpumem's mean of medians against BFC growth's; then the memory bars."""
    runs = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            if "median_step_ms" in r:
                base = r["mode"].rstrip("2")
                if base == "gpumem-trim":
                    base = "gpumem"
                runs.setdefault(r["program"], {}).setdefault(base, []).append(r)
    out = ["| program | phase | bfc-growth runs (ms) | spread | gpumem runs (ms) | spread | gpumem / bfc-growth (mean of medians) | worst pair |",
           "| --- | --- | --- | ---: | --- | ---: | ---: | ---: |"]
    for prog, modes in runs.items():
        b, g = modes.get("bfc-growth", []), modes.get("gpumem", [])
        if not b or not g:
            continue
        for phase in b[0]["median_step_ms"]:
            bs = [r["median_step_ms"][phase] for r in b if phase in r["median_step_ms"]]
            gs = [r["median_step_ms"][phase] for r in g if phase in r["median_step_ms"]]
            if not bs or not gs:
                continue
            spread = lambda xs: "%.1f%%" % ((max(xs) / min(xs) - 1) * 100)  # noqa: E731
            ratio = (sum(gs) / len(gs)) / (sum(bs) / len(bs))
            worst = max(x / y for x in gs for y in bs)
            out.append("| %s | %s | %s | %s | %s | %s | %+.1f%% | %+.1f%% |" % (
                prog, phase, " / ".join("%.2f" % x for x in bs), spread(bs), " / ".join("%.2f" % x for x in gs),
                spread(gs), (ratio - 1) * 100, (worst - 1) * 100))
    out += ["", "| program | mode | context MiB | before the model MiB | peak MiB above it | JAX peak in use MiB | peak / (JAX peak + context) | after cleanup, above start MiB | release ms (from cleanup / from the program's end) | trim ms, reached the shim's allocator | losses equal the first bfc-growth run |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    mib = 1 << 20
    for prog, modes in runs.items():
        first = (modes.get("bfc-growth") or [None])[0]
        for mode_runs in modes.values():
            for r in mode_runs:
                jp = r.get("jax_peak_bytes_in_use")
                ctx = r.get("nvml_context_bytes", r["nvml_start_bytes"])
                t = r.get("trim") or {}
                same = "-" if not first else ("yes" if r["losses"] == first["losses"] else "max rel diff %.1e" % max(
                    [abs(a - c) / max(abs(c), 1e-9) for a, c in zip(r["losses"], first["losses"])] or [0]))
                out.append("| %s | %s | %d | %d | %d | %s | %s | %d | %s / %s | %s, %s | %s |" % (
                    prog, r["mode"], ctx // mib, r["nvml_start_bytes"] // mib,
                    (r["nvml_peak_bytes"] - r["nvml_start_bytes"]) // mib, "-" if jp is None else jp // mib,
                    "-" if not jp else "%.3f" % (r["nvml_peak_bytes"] / (jp + ctx)),
                    (r["nvml_after_cleanup_bytes"] - r["nvml_start_bytes"]) // mib,
                    "-" if r.get("release_ms") is None else "%.0f" % r["release_ms"],
                    "-" if r.get("release_from_end_ms") is None else "%.0f" % r["release_from_end_ms"],
                    "-" if t.get("ms") is None else "%.1f" % t["ms"], t.get("reached_shim_allocator", "-"), same))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", default="mlp,lm,rebuild")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "jax.jsonl"))
    ap.add_argument("--gpumem", default=os.path.join(ROOT, "build", "gpu", "gpumem"))
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds from now after which no run starts unless it can end within them (0: none)")
    ap.add_argument("--ab", action="store_true", help="print the A/B table of alternating runs instead")
    args = ap.parse_args()
    start = time.time()
    for prog in args.programs.split(","):
        for mode in args.modes.split(","):
            if mode not in MODES:
                print(f"suite: unknown mode {mode!r}; modes: {', '.join(MODES)}", file=sys.stderr)
                sys.exit(2)
            timeout = args.timeout
            if args.deadline:
                left = args.deadline - (time.time() - start)
                if left < min(args.timeout, 30):
                    with open(args.out, "a") as f:
                        f.write(json.dumps({"program": prog, "mode": mode, "skipped": "deadline"}) + "\n")
                    print(f"{prog:8s} {mode:11s} skipped: {left:.0f} s left", file=sys.stderr, flush=True)
                    continue
                timeout = min(timeout, int(left))
            env = dict(os.environ, **MODES[mode])
            cmd = [sys.executable, os.path.join(HERE, "run.py"), prog, mode, "--out", args.out]
            if mode.startswith("gpumem"):
                cmd = [args.gpumem, "run", "--"] + cmd + (["--trim-first"] if mode.startswith("gpumem-trim") else [])
            t0 = time.time()
            err = ""
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
                ok, err = p.returncode == 0, p.stderr[-3000:]
                report = [line for line in p.stderr.splitlines() if line.startswith("gpumem: preload:")]
                if report:
                    with open(args.out, "a") as f:
                        f.write(json.dumps({"program": prog, "mode": mode, "preload": report}) + "\n")
            except subprocess.TimeoutExpired:
                ok, err = False, f"timed out after {timeout} s"
            except OSError as e:
                ok, err = False, f"cannot run {cmd[0]}: {e}"
            if not ok:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"program": prog, "mode": mode, "error": err}) + "\n")
            print(f"{prog:8s} {mode:11s} {'ok' if ok else 'FAILED'} {time.time() - t0:5.1f} s", file=sys.stderr, flush=True)
            if not ok:
                print(err, file=sys.stderr)
    print(ab_table(args.out) if args.ab else table(args.out))


if __name__ == "__main__":
    main()
