"""ddp_table.py FILE: the two-GPU table of ddp.py's JSON lines: per
allocator, each rank's NVML peak and peak reserved, the median step time of
rank 0, and the largest relative loss difference from the first native run
(rank 0)."""

import json
import sys

GIB = 1 << 30


def main(path):
    runs = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            runs.setdefault((r["allocator"], r.get("tag", "")), {})[r["rank"]] = r
    base = runs.get(("native", ""), {}).get(0)
    print("| allocator | NVML peak GiB (rank 0 / 1) | peak reserved GiB (rank 0 / 1) | median step ms (rank 0) | vs native | loss diff vs native |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for (alloc, tag), ranks in runs.items():
        r0 = ranks.get(0)
        peaks = " / ".join("%.2f" % (ranks[k]["nvml_peak_bytes"] / GIB) for k in sorted(ranks))
        res = " / ".join("%.2f" % (ranks[k]["peak_reserved_bytes"] / GIB) for k in sorted(ranks))
        vs = "%+.1f%%" % ((r0["median_step_ms"] / base["median_step_ms"] - 1) * 100) if base else "-"
        diff = max(abs(a - b) / abs(b) for a, b in zip(r0["losses"], base["losses"])) if base else 0
        print("| %s | %s | %s | %.1f | %s | %.1e |" % (alloc + (" " + tag if tag else ""), peaks, res, r0["median_step_ms"], vs, diff))


if __name__ == "__main__":
    main(sys.argv[1])
