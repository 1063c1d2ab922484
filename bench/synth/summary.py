#!/usr/bin/env python3
"""Summarize `gpumem replay --json` lines per trace family.

    go run ./cmd/gpumem replay --json DIR/*.trace.gz | python3 bench/synth/summary.py

A family is the trace name without its trailing digits (kv0..kv4 -> kv); a
name without digits is its own family. Per family: traces, mean and max ratio,
with `--passes N` also the mean and max ratio over all passes, and the
driver calls of the first pass with an estimate of their time on the
H100 from the single-thread costs measured by TestDriverParallel (16 MiB
spans, docs/EXPERIMENTS.md): create 11.3 us, map 1.2 us + access grant 25 us,
unmap 16.8 us, release 14.7 us. The estimate ranks policies; only device runs
measure time.
"""
import collections
import json
import sys

COST_US = {"creates": 11.3, "maps": 26.2, "unmaps": 16.8, "releases": 14.7}


def family(name):
    base = name.rstrip("0123456789")
    return base if base and base != name else name


def main():
    fams = collections.OrderedDict()
    for line in sys.stdin:
        if line.strip():
            d = json.loads(line)
            fams.setdefault(family(d["trace"]), []).append(d)
    # With --passes N the replay also reports the peak over all passes.
    passes = any("passes" in r for rows in fams.values() for r in rows)
    head = "| family | traces | mean ratio | max ratio (trace) |"
    rule = "| --- | ---: | ---: | --- |"
    if passes:
        head += " mean ratio, all passes | max ratio, all passes |"
        rule += " ---: | ---: |"
    print(head + " creates | maps | unmaps | releases | est. driver ms |")
    print(rule + " ---: | ---: | ---: | ---: | ---: |")
    for fam, rows in fams.items():
        ratios = [r["ratio"] for r in rows]
        worst = max(rows, key=lambda r: r["ratio"])
        tot = {k: sum(r.get(k, 0) for r in rows) for k in COST_US}
        ms = sum(COST_US[k] * tot[k] for k in COST_US) / 1000
        line = "| %s | %d | %.4f | %.4f (%s) |" % (
            fam, len(rows), sum(ratios) / len(ratios), worst["ratio"], worst["trace"])
        if passes:
            later = [r.get("passes", {}).get("ratio", r["ratio"]) for r in rows]
            line += " %.4f | %.4f |" % (sum(later) / len(later), max(later))
        print(line + " %d | %d | %d | %d | %.1f |" % (
            tot["creates"], tot["maps"], tot["unmaps"], tot["releases"], ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
