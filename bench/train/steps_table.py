"""steps_table.py PRESSURE.jsonl: issue 40's time bar as a markdown table,
one row per program: the median step of each run unlimited, at the limit
of its fit figure (tag "limit=L") and at each other factor of it (tag
"limit=L xF"), in the order they ran; the median of each group's run
medians against the unlimited group's; the unlimited runs' own noise (their
largest run median over their smallest, less one); out-of-memory failures;
and the peak reserved of each group (largest run).

scripts/gpu.sh's pressure part writes the file (FACTORS="1 1.3"
ROUNDS=3). The recording run (tag "record") is left out."""

import json
import statistics
import sys


def group(tag):
    if tag == "unlimited":
        return "unlimited"
    if tag.startswith("limit="):
        _, _, f = tag.partition(" x")
        return "x" + (f or "1")
    return None


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    progs = []
    for r in rows:
        if r["program"] not in progs and r.get("tag") != "record":
            progs.append(r["program"])
    groups = sorted({g for r in rows if (g := group(r.get("tag", "")))}, key=lambda g: (g != "unlimited", g))
    head = ["program", "limits"] + ["%s: run medians ms" % g for g in groups] + \
        ["%s vs unlimited" % g for g in groups if g != "unlimited"] + ["unlimited noise", "OOMs", "peak reserved GiB"]
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join("---" for _ in head) + " |")
    for prog in progs:
        runs = [r for r in rows if r["program"] == prog and group(r.get("tag", ""))]
        by = {g: [r for r in runs if group(r["tag"]) == g] for g in groups}
        ok = {g: [r["median_step_ms"] for r in rs if "error" not in r and r.get("median_step_ms")] for g, rs in by.items()}
        med = {g: statistics.median(v) for g, v in ok.items() if v}
        limits = ", ".join(sorted({r["tag"].split()[0][len("limit="):] for r in runs if r["tag"] != "unlimited"}))
        cells = [prog, limits]
        cells += [", ".join("%.1f" % v for v in ok[g]) or "-" for g in groups]
        base = med.get("unlimited")
        cells += ["%+.1f%%" % ((med[g] / base - 1) * 100) if base and g in med else "-" for g in groups if g != "unlimited"]
        u = ok.get("unlimited") or []
        cells.append("%.1f%%" % ((max(u) / min(u) - 1) * 100) if len(u) > 1 else "-")
        cells.append(str(sum(1 for r in runs if "error" in r and "out of memory" in r["error"].lower())))
        cells.append(", ".join("%s %.3f" % (g, max(r["peak_reserved_bytes"] for r in by[g] if "error" not in r) / 2**30)
                               for g in groups if any("error" not in r for r in by[g])))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
