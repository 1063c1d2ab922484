"""speed_table.py GPUMEM.jsonl PEERS.jsonl: issue 11's bars on the H100, one
markdown table per split of the corpus (tune, holdout; MANIFEST.md) and one
for the shipped traces, from `gpumem replay --device cuda --json --passes N`
and bench/peers/run_all.sh's torch-native-cxx and torch-expandable-cxx lines
(bench/core/gpu_corpus.sh writes both).

Columns: first-pass ratio of gpumem and of the two PyTorch allocators; the
ratio over all passes; gpumem's first-pass time per event against
expandable segments' (bar: at most 1); gpumem's later passes' time per event
against PyTorch as shipped (bar: at most 0.5). A bar that fails is marked
with a cross. Standard library only."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            out[(r.get("peer", "gpumem"), r["trace"])] = r
    return out


def splits():
    path = os.path.join(HERE, "..", "corpus", "MANIFEST.md")
    s = {}
    for line in open(path):
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[2] in ("tune", "holdout"):
            s[cells[1]] = cells[2]
    return s


def main():
    g, p = load(sys.argv[1]), load(sys.argv[2])
    split = splits()
    groups = {"tune": [], "holdout": [], "shipped": []}
    for (_, t) in g:
        groups[split.get(t, "shipped")].append(t)
    for name, traces in groups.items():
        if not traces:
            continue
        print(f"\n**{name}**\n")
        print("| trace | gpumem | torch-native | torch-expandable | gpumem, all passes | native / expandable, all passes | first pass time vs expandable | later passes vs native |")
        print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
        for t in sorted(traces):
            r = g[("gpumem", t)]
            n = p.get(("torch-native-cxx", t), {})
            e = p.get(("torch-expandable-cxx", t), {})

            def pr(d):
                return (d.get("passes") or {}).get("ratio")

            best = min(x for x in (n.get("ratio"), e.get("ratio")) if x) if (n or e) else None
            mark = "" if best is None or r["ratio"] < best else " ✗"
            first = r["ns_per_op"] / e["ns_per_op"] if e.get("ns_per_op") else None
            later_g = (r.get("passes") or {}).get("ns_per_op_later")
            later_n = (n.get("passes") or {}).get("ns_per_op_later")
            later = later_g / later_n if later_g and later_n else None

            def f(x, fmt="%.4f"):
                return fmt % x if x is not None else "-"

            print(f"| {t} | {f(r['ratio'])}{mark} | {f(n.get('ratio'))} | {f(e.get('ratio'))} | {f(pr(r))} | "
                  f"{f(pr(n))} / {f(pr(e))} | {f(first, '%.2fx')}{' ✗' if first and first > 1 else ''} | "
                  f"{f(later, '%.2fx')}{' ✗' if later and later > 0.5 else ''} |")


if __name__ == "__main__":
    main()
