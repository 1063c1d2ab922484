#!/usr/bin/env python3
"""Two builds of the CLI under limits with room: does a change raise any
program's peak under a limit, or make a limit hold more than no limit?

    python3 bench/core/limits_ab.py BASE_CLI NEW_CLI [--fits FITS] [--factors 1.1,1.3,1.5,2]
                                    [--passes 5] [--of-peak] [TRACE ...]

For each trace (default: testdata/traces and bench/corpus/traces, the 40)
and each factor F, `gpumem replay --json --passes N --driver-times --limit
F*L` under both builds, where L is the trace's `gpumem fit --passes 3`
figure (FITS: lines "NAME VALUE UNIT ..." as `gpumem fit` prints them after
the name, e.g. "resnet50_train 2.92 GiB 1.003"; without --fits, BASE_CLI's
fit is computed here, some minutes for the 40) or, with --of-peak, the
trace's unlimited peak under BASE_CLI (for traces without a fit figure,
such as bench/synth's). Also each build's unlimited N-pass peak.

Prints, per factor: the traces whose peak is higher or lower under NEW
(MiB), those whose peak is above their unlimited peak under each build,
OOM counts that differ, and the later passes' driver calls for memory
(creates, maps, access grants, unmaps, releases) summed under each build.
The docs/EXPERIMENTS.md sections "The churn guard while tight" and
"Compact placement later than the rest of the tightening" were measured
with the same replays.
"""

import argparse
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
VMM = ("Create", "Map", "SetAccess", "Unmap", "Release")


def trace_name(path):
    base = os.path.basename(path)
    for ext in (".gz", ".trace"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return base


def parse_fits(lines):
    """NAME -> bytes from lines "NAME VALUE UNIT ..."; other lines are skipped."""
    fits = {}
    for line in lines:
        p = line.split()
        if len(p) >= 3 and p[2] in UNITS:
            try:
                fits[p[0]] = int(float(p[1]) * UNITS[p[2]])
            except ValueError:
                continue
    return fits


def replay(cli, path, passes, limit=None):
    """(peak over the passes, OOMs, later passes' VMM calls) of one replay."""
    args = [cli, "replay", "--json", "--passes", str(passes), "--driver-times"]
    if limit:
        args += ["--limit", str(limit)]
    r = subprocess.run(args + [path], capture_output=True, text=True, cwd=ROOT)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        raise SystemExit("%s replay %s: %s" % (cli, path, r.stderr.strip()[-300:]))
    j = json.loads(lines[-1])
    ps = j.get("passes") or {}
    later = sum(v["calls"] for k, v in (ps.get("driver_later") or {}).items() if k in VMM)
    return ps.get("peak_reserved_bytes", j["peak_reserved_bytes"]), j.get("ooms", 0) + ps.get("ooms_later", 0), later


def fit(cli, path):
    r = subprocess.run([cli, "fit", "--passes", "3", "--policy", "gpumem", path], capture_output=True, text=True, cwd=ROOT)
    for line in r.stdout.splitlines():
        p = line.split()
        if p and p[0] == "gpumem" and len(p) >= 3 and p[2] in UNITS:
            return int(float(p[1]) * UNITS[p[2]])
    raise SystemExit("%s fit %s: no figure (%s)" % (cli, path, r.stderr.strip()[-300:]))


def compare(rows, factor):
    """Text lines for one factor; rows: name -> {base, new, unl_base, unl_new} of (peak, ooms, later)."""
    mib = lambda b: b >> 20  # noqa: E731
    higher = sorted(((n, mib(r["new"][0] - r["base"][0])) for n, r in rows.items() if r["new"][0] > r["base"][0]), key=lambda x: -x[1])
    lower = sorted(((n, mib(r["new"][0] - r["base"][0])) for n, r in rows.items() if r["new"][0] < r["base"][0]), key=lambda x: x[1])
    above = {w: sorted(((n, mib(r[w][0] - r["unl_" + w][0])) for n, r in rows.items() if r[w][0] > r["unl_" + w][0]), key=lambda x: -x[1])
             for w in ("base", "new")}
    ooms = [(n, r["base"][1], r["new"][1]) for n, r in rows.items() if r["base"][1] != r["new"][1]]
    calls = [sum(r[w][2] for r in rows.values()) for w in ("base", "new")]
    return ["x%s: %d traces" % (factor, len(rows)),
            "  peak higher under NEW (MiB): %s" % (higher or "none"),
            "  peak lower under NEW (MiB): %s" % (lower or "none"),
            "  above their unlimited peak, BASE: %s" % (above["base"] or "none"),
            "  above their unlimited peak, NEW: %s" % (above["new"] or "none"),
            "  OOMs that differ (BASE, NEW): %s" % (ooms or "none"),
            "  later passes' VMM calls: BASE %d, NEW %d" % tuple(calls)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--fits", help="file of fit figures (default: computed with BASE)")
    ap.add_argument("--factors", default="1.1,1.3,1.5,2")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--of-peak", action="store_true", help="limits as factors of BASE's unlimited peak, not of the fit")
    args = ap.parse_args()
    paths = args.traces or sorted(glob.glob(os.path.join(ROOT, "testdata/traces/*.trace.gz")) +
                                  glob.glob(os.path.join(ROOT, "bench/corpus/traces/*.trace.gz")))
    factors = [float(f) for f in args.factors.split(",")]
    unl = {trace_name(p): {w: replay(c, p, args.passes) for w, c in (("base", args.base), ("new", args.new))} for p in paths}
    if args.of_peak:
        ref = {n: u["base"][0] for n, u in unl.items()}
    elif args.fits:
        with open(args.fits) as f:
            ref = parse_fits(f)
    else:
        ref = {trace_name(p): fit(args.base, p) for p in paths}
    for factor in factors:
        rows = {}
        for p in paths:
            n = trace_name(p)
            if n not in ref:
                print("no fit figure for %s: skipped" % n, file=sys.stderr)
                continue
            lim = int(ref[n] * factor)
            rows[n] = {"base": replay(args.base, p, args.passes, lim), "new": replay(args.new, p, args.passes, lim),
                       "unl_base": unl[n]["base"], "unl_new": unl[n]["new"]}
        print("\n".join(compare(rows, factor)), flush=True)


if __name__ == "__main__":
    main()
