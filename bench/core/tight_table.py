"""Issue 30's time bar under a limit, from `scripts/gpu.sh run tight`
(tight.jsonl: per program, ten passes unlimited and under Config.Gather
at its fit figure, one line each as bench/core/calls_at_fit.sh writes
them): the allocator's time over the ten passes, limited against
unlimited (bar: at most twice), with the driver calls and splits.

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
    ratios = []
    print("| program | limit MiB | ms unlimited | ms at the limit (x) | calls unlimited / at the limit | splits | OOMs |")
    print("|---|---:|---:|---|---|---:|---:|")
    for line in open(path):
        r = json.loads(line)
        u, g = r["unlimited"], r["gather"]
        tu, tg = total_ms(u), total_ms(g)
        ratios.append(tg / tu)
        splits = g.get("splits", 0) + g["passes"].get("splits_later", 0)
        ooms = g["ooms"] + g["passes"]["ooms_later"]
        name = r["path"].split("/")[-1].replace(".trace.gz", "")
        print(f"| {name} | {r['cap_mib']} | {tu:.1f} | {tg:.1f} ({tg / tu:.2f}) | {calls(u):,} / {calls(g):,} | {splits} | {ooms} |")
    if ratios:
        print()
        print(f"median {statistics.median(ratios):.2f}, at most {max(ratios):.2f}; "
              f"within twice on {sum(x <= 2 for x in ratios)} of {len(ratios)}")


if __name__ == "__main__":
    main(sys.argv[1])
