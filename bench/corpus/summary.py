#!/usr/bin/env python3
"""Print the corpus replay table, tune and holdout apart.

    go run ./cmd/gpumem replay --json [--passes 10] bench/corpus/traces/*.trace.gz \\
        | python3 bench/corpus/summary.py [--manifest bench/corpus/MANIFEST.md] [FILE...]

Reads `gpumem replay --json` lines (from FILEs, else stdin) and the split of
each program from MANIFEST.md's table, and prints one markdown table per
split: per program its events, peak live bytes, the ratio of
peak reserved to peak live (with --passes also over all passes), OOMs
and ns/event, then the split's mean and max ratio. Programs of the manifest
with no line are listed as not replayed; a line whose trace is not in the
manifest is an error (exit 1): every replayed trace must have a split.
Standard library only.
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROW = re.compile(r"^\|\s*([a-z0-9_]+)\s*\|\s*(tune|holdout)\s*\|")


def read_manifest(path):
    """{program: split}, in the manifest's order."""
    splits = {}
    with open(path) as f:
        for line in f:
            m = ROW.match(line)
            if m:
                splits[m.group(1)] = m.group(2)
    if not splits:
        raise ValueError("%s: no program table" % path)
    return splits


def read_results(files):
    rows = {}
    for f in files:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue  # gpumem's notes, e.g. which device it used
            try:
                d = json.loads(line)
                name = d["trace"]
                d["ratio"] = float(d["ratio"])
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError("%s:%d: not a replay line: %s" % (getattr(f, "name", "-"), n, e))
            rows[name] = d  # the last line for a trace wins
    return rows


def table(split, names, rows):
    out = ["### %s (%d programs)" % (split, len(names)), ""]
    passes = any("passes" in rows[n] for n in names if n in rows)
    head = "| program | events | peak live GB | ratio |"
    rule = "| --- | ---: | ---: | ---: |"
    if passes:
        head += " ratio, all passes |"
        rule += " ---: |"
    out += [head + " OOMs | ns/event |", rule + " ---: | ---: |"]
    ratios, later, missing = [], [], []
    for n in names:
        d = rows.get(n)
        if d is None:
            missing.append(n)
            continue
        ratios.append(d["ratio"])
        line = "| %s | %d | %.3f | %.4f |" % (n, d.get("events", 0), d.get("peak_live_bytes", 0) / 1e9, d["ratio"])
        if passes:
            r = d.get("passes", {}).get("ratio", d["ratio"])
            later.append(r)
            line += " %.4f |" % r
        out.append(line + " %d | %.0f |" % (d.get("ooms", 0), d.get("ns_per_op", 0)))
    if ratios:
        line = "| **mean / max** | | | %.4f / %.4f |" % (sum(ratios) / len(ratios), max(ratios))
        if passes:
            line += " %.4f / %.4f |" % (sum(later) / len(later), max(later))
        out.append(line + " | |")
    if missing:
        out += ["", "Not replayed: " + ", ".join(missing) + "."]
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=os.path.join(HERE, "MANIFEST.md"))
    ap.add_argument("files", nargs="*")
    args = ap.parse_args(argv)
    try:
        splits = read_manifest(args.manifest)
        files = [open(p) for p in args.files] or [sys.stdin]
        rows = read_results(files)
    except (OSError, ValueError) as e:
        print("summary.py: %s" % e, file=sys.stderr)
        return 1
    unknown = sorted(set(rows) - set(splits))
    out = []
    for split in ("tune", "holdout"):
        out += table(split, [n for n in splits if splits[n] == split], rows)
        out.append("")
    print("\n".join(out).rstrip())
    if unknown:
        print("summary.py: not in %s (no split): %s" % (args.manifest, ", ".join(unknown)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
