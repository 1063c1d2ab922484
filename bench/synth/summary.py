#!/usr/bin/env python3
"""Summarize `gpumem replay --json` lines per trace family.

    go run ./cmd/gpumem replay --json DIR/*.trace.gz | python3 bench/synth/summary.py

A family is the trace name without its trailing digits (kv0..kv4 -> kv); a
name without digits is its own family. Per family: traces, mean and max ratio,
and the driver calls of the first pass with an estimate of their time on the
H100 from the single-thread costs measured by TestDriverParallel (16 MiB
spans, docs/BENCHMARKS.md): create 11.3 us, map 1.2 us + access grant 25 us,
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
    print("| family | traces | mean ratio | max ratio (trace) | creates | maps | unmaps | releases | est. driver ms |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for fam, rows in fams.items():
        ratios = [r["ratio"] for r in rows]
        worst = max(rows, key=lambda r: r["ratio"])
        tot = {k: sum(r.get(k, 0) for r in rows) for k in COST_US}
        ms = sum(COST_US[k] * tot[k] for k in COST_US) / 1000
        print("| %s | %d | %.4f | %.4f (%s) | %d | %d | %d | %d | %.1f |" % (
            fam, len(rows), sum(ratios) / len(ratios), worst["ratio"], worst["trace"],
            tot["creates"], tot["maps"], tot["unmaps"], tot["releases"], ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
