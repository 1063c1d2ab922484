#!/usr/bin/env python3
"""The allocator core's evaluation set, one table: every shipped trace, every
synthetic family of bench/synth (several seeds) and, where present, the
corpus traces its manifest marks `tune`, replayed on the simulated device.

    python3 bench/core/eval.py [--seeds 100,10] [--out FILE.jsonl] [--base FILE.jsonl] [--replay-args ARGS]

Per trace: the first pass's ratio, the ratio over ten passes (`replay
--passes 10`: the peak of all ten), driver work (maps + creates) per 1000
events in the first pass and in an average later pass, and ns per event on
the simulated device (first pass / later passes; CPU time only: the sim's
driver calls cost nothing, so time on a GPU is this plus the calls times
their cost, docs/EXPERIMENTS.md "What the driver costs"). Then one line per
family: the mean and the worst of each column. With --base (the jsonl of an
earlier run) each ratio is shown with its change, and the script lists
every shipped trace whose first-pass ratio rose or passed 1.02 and exits 1
if there is one. It also lists every trace over issue 11's bars that a
replay checks: a first pass over 1.02, ten passes over the first pass + 1%
of peak live.

The gpumem binary is built once from the working tree; synthetic traces are
generated into a temporary directory (bench/synth/gen.py, seeds FIRST to
FIRST+COUNT-1).
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PASSES = 10


def family(name):
    base = name.rstrip("0123456789")
    return base if base and base != name else name


def corpus_tune():
    """Corpus traces its manifest (bench/corpus/MANIFEST.md) marks `tune`;
    `holdout` traces are never replayed here."""
    man = os.path.join(ROOT, "bench", "corpus", "MANIFEST.md")
    if not os.path.exists(man):
        return []
    rowre = re.compile(r"^\|\s*([a-z0-9_]+)\s*\|\s*(tune|holdout)\s*\|")
    out = []
    with open(man) as f:
        for line in f:
            m = rowre.match(line)
            if m and m.group(2) == "tune":
                p = os.path.join(ROOT, "bench", "corpus", "traces", m.group(1) + ".trace.gz")
                if os.path.exists(p):
                    out.append(p)
    return out


def row(d):
    ev = d["events"]
    p = d["passes"]
    first = (d["maps"] + d["creates"]) * 1000 / ev
    later = (p["maps_later"] + p["creates_later"]) * 1000 / (ev * (p["n"] - 1))
    return {
        "trace": d["trace"], "ratio": d["ratio"], "ratio10": p["ratio"],
        "drv1": first, "drvL": later, "ns1": d["ns_per_op"], "nsL": p["ns_per_op_later"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="100,10", help="FIRST,COUNT of the synthetic seeds (default 100,10)")
    ap.add_argument("--out", help="write the replay's JSON lines here")
    ap.add_argument("--base", help="JSON lines of an earlier run to compare with")
    ap.add_argument("--only", help="comma-separated families to run (default: all)")
    ap.add_argument("--replay-args", default="", help="more flags for gpumem replay, such as '--compact' or '--span 8MiB'")
    args = ap.parse_args()
    first, count = (int(x) for x in args.seeds.split(","))
    tmp = tempfile.mkdtemp(prefix="gpumem-eval-")
    subprocess.run([sys.executable, os.path.join(ROOT, "bench/synth/gen.py"), tmp, str(first), str(count)], check=True)
    binary = os.path.join(tmp, "gpumem")
    subprocess.run(["go", "build", "-o", binary, "./cmd/gpumem"], cwd=ROOT, check=True, env=dict(os.environ, CGO_ENABLED="0"))
    shipped = sorted(glob.glob(os.path.join(ROOT, "testdata/traces/*.trace.gz")))
    traces = shipped + corpus_tune() + sorted(glob.glob(os.path.join(tmp, "*.trace.gz")))
    if args.only:
        keep = set(args.only.split(","))
        traces = [t for t in traces if family(os.path.basename(t).split(".")[0]) in keep]
    out = subprocess.run([binary, "replay", "--device", "sim", "--json", "--passes", str(PASSES)] + args.replay_args.split() + traces,
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    lines = [l for l in out.splitlines() if l.strip()]
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    rows = [row(json.loads(l)) for l in lines]
    base = {}
    if args.base:
        with open(args.base) as f:
            for l in f:
                if l.strip():
                    r = row(json.loads(l))
                    base[r["trace"]] = r
    shipped_names = {os.path.basename(t).split(".")[0] for t in shipped}

    def delta(r, k):
        b = base.get(r["trace"])
        return "" if b is None else " (%+.4f)" % (r[k] - b[k])

    print("| trace | ratio, pass 1 | ratio, %d passes | maps+creates /1000 ev, pass 1 | later pass | ns/ev sim, pass 1 | later |" % PASSES)
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    fams = collections.OrderedDict()
    for r in rows:
        name = r["trace"]
        fam = name if name in shipped_names else family(name)
        fams.setdefault(fam, []).append(r)
    for fam, rs in fams.items():
        if len(rs) == 1:
            r = rs[0]
            print("| %s | %.4f%s | %.4f%s | %.1f | %.1f | %.0f | %.0f |" % (
                r["trace"], r["ratio"], delta(r, "ratio"), r["ratio10"], delta(r, "ratio10"),
                r["drv1"], r["drvL"], r["ns1"], r["nsL"]))
            continue
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in rs[0] if k != "trace"}
        worst = {k: max(rs, key=lambda r: r[k]) for k in ("ratio", "ratio10")}
        bm = ""
        if base and all(r["trace"] in base for r in rs):
            bm = " (%+.4f)" % (mean["ratio"] - sum(base[r["trace"]]["ratio"] for r in rs) / len(rs))
        print("| %s (%d) mean / worst | %.4f%s / %.4f %s | %.4f / %.4f %s | %.1f / %.1f | %.1f / %.1f | %.0f | %.0f |" % (
            fam, len(rs), mean["ratio"], bm, worst["ratio"]["ratio"], worst["ratio"]["trace"],
            mean["ratio10"], worst["ratio10"]["ratio10"], worst["ratio10"]["trace"],
            mean["drv1"], max(r["drv1"] for r in rs), mean["drvL"], max(r["drvL"] for r in rs),
            mean["ns1"], mean["nsL"]))
    # Issue 11's bars that a replay can check: a first pass at most 1.02,
    # ten passes at most the first pass + 1% of peak live.
    over = ["%s: first pass %.4f" % (r["trace"], r["ratio"]) for r in rows if r["ratio"] > 1.02]
    drift = ["%s: %.4f over ten passes, first pass %.4f" % (r["trace"], r["ratio10"], r["ratio"])
             for r in rows if r["ratio10"] > r["ratio"] + 0.01]
    if over:
        print("\nfirst pass over 1.02 (%d):\n  %s" % (len(over), "\n  ".join(over)))
    if drift:
        print("\nten passes over the first pass + 1%% of peak live (%d):\n  %s" % (len(drift), "\n  ".join(drift)))
    bad = []
    for r in rows:
        if r["trace"] in shipped_names:
            b = base.get(r["trace"])
            if r["ratio"] > 1.02 or (b and r["ratio"] > b["ratio"] + 1e-9):
                bad.append("%s: first-pass ratio %.4f%s" % (r["trace"], r["ratio"], "" if not b else " (was %.4f)" % b["ratio"]))
    if bad:
        print("\nshipped traces worse than the base or over 1.02:\n  " + "\n  ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
