"""Issue 30's time bar under a limit, from `scripts/gpu.sh run tight`
(tight.jsonl: per program, ten passes unlimited and under Config.Gather
at its fit figure, one line each as bench/core/calls_at_fit.sh writes
them; with ROUNDS=N, N lines a program): the allocator's time over the
ten passes, limited against unlimited (bar: at most twice): the ratio of
the medians over the rounds, each side's range beside it, with the first
round's driver calls and splits (the allocator decides the same every
round) and the OOMs of all rounds.

    python3 bench/core/tight_table.py tight.jsonl

A replay's time over ten passes is ns_per_op times the events for the first
pass plus ns_per_op_later times the events for each later pass; the
splits' time is in it (a split runs inside the request that needs it)."""
import json
import statistics
import sys

from calls_table import calls  # bench/core, beside this file


def total_ms(x):
    p = x["passes"]
    return (x["ns_per_op"] * x["events"] + p["ns_per_op_later"] * x["events"] * (p["n"] - 1)) / 1e6


def main(path):
    runs = {}  # program -> [(record, unlimited ms, limited ms)], in file order
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    for r in lines:
        name = r["path"].split("/")[-1].replace(".trace.gz", "")
        runs.setdefault(name, []).append((r, total_ms(r["unlimited"]), total_ms(r["gather"])))
    ratios = []
    n = max(len(v) for v in runs.values()) if runs else 0
    spread = " (median; min-max)" if n > 1 else ""
    print(f"| program | limit MiB | ms unlimited{spread} | ms at the limit{spread} | ratio | calls unlimited / at the limit | splits | OOMs |")
    print("|---|---:|---|---|---:|---|---:|---:|")
    for name, v in runs.items():
        r = v[0][0]
        u, g = r["unlimited"], r["gather"]
        tus, tgs = [x[1] for x in v], [x[2] for x in v]
        tu, tg = statistics.median(tus), statistics.median(tgs)
        ratios.append(tg / tu)
        splits = g.get("splits", 0) + g["passes"].get("splits_later", 0)
        ooms = sum(x[0]["gather"]["ooms"] + x[0]["gather"]["passes"]["ooms_later"] for x in v)

        def cell(t, ts):
            return f"{t:.1f}" + (f" ({min(ts):.1f}-{max(ts):.1f})" if len(ts) > 1 else "")

        print(f"| {name} | {r['cap_mib']} | {cell(tu, tus)} | {cell(tg, tgs)} | {tg / tu:.2f} | {calls(u):,} / {calls(g):,} | {splits} | {ooms} |")
    if ratios:
        print()
        print(f"{len(ratios)} programs, {n} round(s) each: median ratio {statistics.median(ratios):.2f}, at most {max(ratios):.2f}; "
              f"within twice on {sum(x <= 2 for x in ratios)} of {len(ratios)}")


if __name__ == "__main__":
    main(sys.argv[1])
