#!/usr/bin/env python3
"""Where the time of a replay goes on the driver: one row per trace and
label (the runs of bench/core/driver_times.sh, or any `gpumem replay --json
--driver-times` output, a label per file or per line's "label").

    python3 bench/core/driver_table.py [--wide] FILE.jsonl...

Per row: ns per event of the first pass and of a later pass, the part of it
spent in driver calls, and the operations that cost most (calls per pass x
microseconds per call). The rest of a pass's time is the allocator's own
code (and the replay loop's). With --wide, one row per trace and a column
per label: first pass ns per event (driver's part) and later pass ns per
event (driver's part); then each operation's mean cost over every run.
"""
import json
import os
import sys


def ops(times, passes, events, top=4):
    if not times:
        return ""
    names = sorted(times, key=lambda k: -times[k]["ns"])
    out = []
    for k in names[:top]:
        o = times[k]
        if o["calls"] == 0:
            continue
        out.append("%s %.0f x %.1f us" % (k, o["calls"] / passes, o["ns"] / o["calls"] / 1e3))
    return ", ".join(out)


def wide(paths):
    runs, labels, cost = {}, [], {}
    for p in paths:
        for line in open(p):
            d = json.loads(line)
            label = d.get("label") or os.path.basename(p).split(".")[0]
            if label not in labels:
                labels.append(label)
            ev = d["events"]
            first = d.get("driver") or {}
            cell = "%.0f (%.0f)" % (d["ns_per_op"], sum(o["ns"] for o in first.values()) / ev)
            ps = d.get("passes")
            if ps:
                later = ps.get("driver_later") or {}
                cell += " / %.0f (%.0f)" % (ps["ns_per_op_later"], sum(o["ns"] for o in later.values()) / ev / (ps["n"] - 1))
            else:
                later = {}
            runs.setdefault(d["trace"], {})[label] = cell
            for t in (first, later):
                for k, o in t.items():
                    c = cost.setdefault(k, [0, 0])
                    c[0] += o["calls"]
                    c[1] += o["ns"]
    print("| trace | " + " | ".join(labels) + " |")
    print("| --- |" + " ---: |" * len(labels))
    for t in sorted(runs):
        print("| %s | %s |" % (t, " | ".join(runs[t].get(l, "") for l in labels)))
    print()
    print("| operation | calls | mean us per call |")
    print("| --- | ---: | ---: |")
    for k in sorted(cost, key=lambda k: -cost[k][1]):
        calls, ns = cost[k]
        if calls:
            print("| %s | %d | %.1f |" % (k, calls, ns / calls / 1e3))


def main(paths):
    if paths and paths[0] == "--wide":
        return wide(paths[1:])
    rows = []
    for p in paths:
        for line in open(p):
            d = json.loads(line)
            label = d.get("label") or os.path.basename(p).split(".")[0]
            ev = d["events"]
            drv = sum(o["ns"] for o in (d.get("driver") or {}).values())
            row = [d["trace"], label, "%.4f" % d["ratio"], "%.0f" % d["ns_per_op"], "%.0f" % (drv / ev), ops(d.get("driver"), 1, ev)]
            ps = d.get("passes")
            if ps:
                n = ps["n"] - 1
                later = sum(o["ns"] for o in (ps.get("driver_later") or {}).values())
                row += ["%.0f" % ps["ns_per_op_later"], "%.0f" % (later / ev / n), ops(ps.get("driver_later"), n, ev)]
            rows.append(row)
    rows.sort()
    print("| trace | run | ratio | first pass ns/event | of it driver | dearest calls (per pass x us) | later pass ns/event | of it driver | dearest calls |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
