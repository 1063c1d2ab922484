"""Driver calls over ten passes at the fit figure against unlimited, before
and after: python3 bench/core/calls_table.py BEFORE.jsonl AFTER.jsonl (lines
of bench/core/calls_at_fit.sh). Calls are creates, maps, unmaps
and releases of the first pass plus creates, maps and releases of the later
passes (replay's JSON has no later-pass unmaps), as in docs/EXPERIMENTS.md,
"Gathering before an out-of-memory"."""
import json
import statistics
import sys


def calls(x):
    p = x["passes"]
    return (x["creates"] + x["maps"] + x["unmaps"] + x["releases"]
            + p["creates_later"] + p["maps_later"] + p["releases_later"])


def splits(x):
    return x.get("splits", 0) + x["passes"].get("splits_later", 0)


def ooms(x):
    return x["ooms"] + x["passes"]["ooms_later"]


def load(path):
    return {json.loads(l)["path"].split("/")[-1].replace(".trace.gz", ""): json.loads(l) for l in open(path)}


def main(before_path, after_path):
    before, after = load(before_path), load(after_path)
    rb, ra = [], []
    print("| program | unlimited | at the fit, before (x) | after (x) | splits before / after | OOMs before / after |")
    print("|---|---:|---|---|---|---|")
    for k in sorted(after):
        b, a = before[k], after[k]
        ub, ua = calls(b["unlimited"]), calls(a["unlimited"])
        gb, ga = calls(b["gather"]), calls(a["gather"])
        rb.append(gb / ub)
        ra.append(ga / ua)
        print(f"| {k} | {ua:,} | {gb:,} ({gb / ub:.1f}) | {ga:,} ({ga / ua:.1f}) | {splits(b['gather'])} / {splits(a['gather'])} | {ooms(b['gather'])} / {ooms(a['gather'])} |")
    print()
    print(f"median ratio {statistics.median(rb):.2f} before, {statistics.median(ra):.2f} after; "
          f"at most {max(rb):.1f} before, {max(ra):.1f} after; "
          f"within twice the unlimited run: {sum(r <= 2 for r in rb)} before, {sum(r <= 2 for r in ra)} after, of {len(ra)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
