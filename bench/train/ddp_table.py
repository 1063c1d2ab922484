"""ddp_table.py FILE: the table of ddp.py's JSON lines, one row per run
(program, allocator, tag, in the order they ran): each rank's NVML peak and
peak reserved, the spread of the NVML peaks over the ranks (largest over
smallest, less one), the median step time of rank 0 against the first
native run of the same program, and the largest relative loss difference
from that run (rank 0).

A run is the set of lines of one launch: a rank seen again starts the
next run."""

import json
import sys

GIB = 1 << 30


def load(path):
    runs = []  # [(key, {rank: rec})]
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        key = (r.get("program", "gpt2_ddp"), r["allocator"], r.get("tag", ""))
        if not runs or runs[-1][0] != key or r["rank"] in runs[-1][1]:
            runs.append((key, {}))
        runs[-1][1][r["rank"]] = r
    return runs


def main(path):
    runs = load(path)
    base = {}
    for (prog, alloc, tag), ranks in runs:
        if alloc == "native" and prog not in base and 0 in ranks:
            base[prog] = ranks[0]
    print("| program | allocator | NVML peak MiB per rank | spread | peak reserved MiB per rank | median step ms (rank 0) | vs native | loss diff vs native |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: |")
    for (prog, alloc, tag), ranks in runs:
        r0, b = ranks.get(0), base.get(prog)
        nv = [ranks[k]["nvml_peak_bytes"] for k in sorted(ranks)]
        peaks = " / ".join("%d" % (v >> 20) for v in nv)
        spread = "%.1f%%" % ((max(nv) / min(nv) - 1) * 100) if min(nv) > 0 else "-"
        res = " / ".join("%d" % (ranks[k]["peak_reserved_bytes"] >> 20) for k in sorted(ranks))
        step = r0["median_step_ms"] if r0 else float("nan")
        vs = "%+.1f%%" % ((step / b["median_step_ms"] - 1) * 100) if b and r0 else "-"
        diff = max(abs(x - y) / abs(y) for x, y in zip(r0["losses"], b["losses"])) if b and r0 else 0
        print("| %s | %s | %s | %s | %s | %.1f | %s | %.1e |" % (
            prog, alloc + (" " + tag if tag else ""), peaks, spread, res, step, vs, diff))


if __name__ == "__main__":
    main(sys.argv[1])
