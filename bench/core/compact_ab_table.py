#!/usr/bin/env python3
"""The table of bench/core/compact_ab.sh's results: per program, compact's
ratio (first pass / three passes) and ns per event (first pass / later
passes) by the base build and by the new one, with PyTorch from C++ of the
same call: expandable segments' first pass and native's later passes, and
the counts against issue 11's bars.

    python3 bench/core/compact_ab_table.py DIR [DIR...]
"""
import json
import os
import sys


def load(path, key):
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if "error" in d:
            continue
        out[(d.get(key) if key else None, d["trace"])] = d
    return out


def main():
    print("| program | ratio 1 / 3 passes: base / new | expandable / native ratio (3 passes) | first pass ns: base / new / expandable | later ns: base / new / native |")
    print("| --- | --- | --- | --- | --- |")
    n = fit = first_b = first_n = later_b = later_n = 0
    for d in sys.argv[1:]:
        base = load(os.path.join(d, "base.jsonl"), None)
        new = load(os.path.join(d, "new.jsonl"), None)
        peers = load(os.path.join(d, "peers.jsonl"), "peer")
        for (_, t), b in base.items():
            w = new.get((None, t))
            e = peers.get(("torch-expandable-cxx", t))
            nat = peers.get(("torch-native-cxx", t))
            if not w or not e or not nat:
                print("| %s | missing |" % t)
                continue
            n += 1
            fit += w["ratio"] <= 1.02 and w["passes"]["ratio"] <= 1.02
            first_b += b["ns_per_op"] <= e["ns_per_op"]
            first_n += w["ns_per_op"] <= e["ns_per_op"]
            later_b += b["passes"]["ns_per_op_later"] <= nat["passes"]["ns_per_op_later"] / 2
            later_n += w["passes"]["ns_per_op_later"] <= nat["passes"]["ns_per_op_later"] / 2
            print("| %s | %.4f / %.4f, %.4f / %.4f | %.4f / %.4f | %.0f / %.0f / %.0f | %.0f / %.0f / %.0f |" % (
                t, b["ratio"], b["passes"]["ratio"], w["ratio"], w["passes"]["ratio"],
                e["passes"]["ratio"], nat["passes"]["ratio"],
                b["ns_per_op"], w["ns_per_op"], e["ns_per_op"],
                b["passes"]["ns_per_op_later"], w["passes"]["ns_per_op_later"], nat["passes"]["ns_per_op_later"]))
    print()
    print("%d programs: new within 1.02 (first and three passes) on %d; first pass at most expandable's: base %d, new %d; later passes at most half native's: base %d, new %d" % (
        n, fit, first_b, first_n, later_b, later_n))


if __name__ == "__main__":
    main()
