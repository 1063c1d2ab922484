#!/usr/bin/env python3
"""Address repetition per trace and policy, one markdown table, from the
JSON lines of `gpumem replay --policy all --passes N --json TRACE...` on
stdin: per trace, each policy's share of requests that got the address the
same request had in the pass before (passes.same_address), and gpumem's
first-pass and all-passes ratios beside.

    go run ./cmd/gpumem replay --policy all --passes 10 --json TRACES | python3 bench/core/repeat_table.py
"""
import collections
import json
import sys


def main():
    rows = collections.OrderedDict()
    policies = []
    for line in sys.stdin:
        if not line.strip():
            continue
        d = json.loads(line)
        if "passes" not in d:
            sys.exit("repeat_table: %s under %s has no passes: run the replay with --passes 2 or more" % (d["trace"], d["policy"]))
        if d["policy"] not in policies:
            policies.append(d["policy"])
        rows.setdefault(d["trace"], {})[d["policy"]] = d
    print("| trace | " + " | ".join(policies) + " | gpumem ratio, pass 1 / all passes |")
    print("| --- | " + " | ".join("---:" for _ in policies) + " | ---: |")
    for tr, ps in rows.items():
        cells = ["%.3f" % ps[p]["passes"]["same_address"] if p in ps else "-" for p in policies]
        g = ps.get("gpumem")
        fit = "%.4f / %.4f" % (g["ratio"], g["passes"]["ratio"]) if g else "-"
        print("| %s | %s | %s |" % (tr, " | ".join(cells), fit))


if __name__ == "__main__":
    main()
