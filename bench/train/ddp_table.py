"""ddp_table.py FILE (.jsonl, or .jsonl.gz): the table of ddp.py's JSON lines, one row per run
(program, allocator, tag, in the order they ran): each rank's NVML peak and
peak reserved, the spread of the NVML peaks over the ranks (largest over
smallest, less one), the median step time of rank 0 against the first
native run of the same program, the median of rank 0's steady steps (those
after the longest sequence has run, where no allocator has reason to grow),
gpumem's host time in driver calls and fences on rank 0 (in the
steps that reach a new length, and in the steady ones; ddp.py records it
per step), and the largest relative loss difference from that run (rank 0).
After the table: gpumem's steady steps over expandable segments' in each
round run under both; where ddp.py recorded them, each run's host steal
and involuntary context switches a steady step (rank 0: was the machine
slow then?); and for each gpumem run whose records have them (ddp.py since
bae9ffd), rank 0's driver time by call over the whole run: which call a
slow growth waited in.

A run is the set of lines of one launch: a rank seen again starts the
next run."""

import gzip
import json
import statistics
import sys

GIB = 1 << 30


def load(path):
    runs = []  # [(key, {rank: rec})]
    for line in (gzip.open(path, "rt") if path.endswith(".gz") else open(path)):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        key = (r.get("program", "gpt2_ddp"), r["allocator"], r.get("tag", ""))
        if not runs or runs[-1][0] != key or r["rank"] in runs[-1][1]:
            runs.append((key, {}))
        runs[-1][1][r["rank"]] = r
    return runs


def steady(rec):
    """Indices of rec's steady steps: those after the longest sequence has
    run (and after warm-up), where no allocator has reason to grow."""
    lengths, warm = rec["lengths"], max(2, len(rec["lengths"]) // 5)
    last = max(range(len(lengths)), key=lambda i: (lengths[i], -i))  # the first longest
    return list(range(max(warm, last + 1), len(lengths)))


def host_ms(rec, steps):
    """gpumem's host time in driver calls and fences over steps, ms."""
    per = rec.get("gpumem_per_step") or {}
    if "DriverNanos" not in per:
        return None
    return sum(per["DriverNanos"][i] + per["WaitNanos"][i] for i in steps) / 1e6


def main(path):
    runs = load(path)
    base = {}
    for (prog, alloc, tag), ranks in runs:
        if alloc == "native" and prog not in base and 0 in ranks:
            base[prog] = ranks[0]
    print("| program | allocator | NVML peak MiB per rank | spread | peak reserved MiB per rank | median step ms (rank 0) | vs native | steady steps ms | host ms in driver calls and fences: growth / steady | loss diff vs native |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | --- | ---: |")
    for (prog, alloc, tag), ranks in runs:
        r0, b = ranks.get(0), base.get(prog)
        nv = [ranks[k]["nvml_peak_bytes"] for k in sorted(ranks)]
        peaks = " / ".join("%d" % (v >> 20) for v in nv)
        spread = "%.1f%%" % ((max(nv) / min(nv) - 1) * 100) if min(nv) > 0 else "-"
        res = " / ".join("%d" % (ranks[k]["peak_reserved_bytes"] >> 20) for k in sorted(ranks))
        step = r0["median_step_ms"] if r0 else float("nan")
        vs = "%+.1f%%" % ((step / b["median_step_ms"] - 1) * 100) if b and r0 else "-"
        diff = max(abs(x - y) / abs(y) for x, y in zip(r0["losses"], b["losses"])) if b and r0 else 0
        st, host = "-", "-"
        if r0 and "lengths" in r0:
            ss = steady(r0)
            st = "%.1f" % statistics.median(r0["step_ms"][i] for i in ss) if ss else "-"
            warm = max(2, len(r0["lengths"]) // 5)
            grow = [i for i in range(warm, len(r0["lengths"])) if i not in ss]
            g, h = host_ms(r0, grow), host_ms(r0, ss)
            if g is not None:
                host = "%.1f / %.1f" % (g, h)
        print("| %s | %s | %s | %s | %s | %.1f | %s | %s | %s | %.1e |" % (
            prog, alloc + (" " + tag if tag else ""), peaks, spread, res, step, vs, st, host, diff))
    ratios = against_expandable(runs)
    if ratios:
        print("\nsteady steps, gpumem over expandable segments in the same round (rank 0): %s; median %.3f" % (
            ", ".join("%s %.3f" % (t, r) for t, r in ratios), statistics.median(r for _, r in ratios)))
    stolen = [(prog, alloc, tag, statistics.median(r0["steal_ms"][i] for i in steady(r0)),
               statistics.median(r0["nivcsw"][i] for i in steady(r0)))
              for (prog, alloc, tag), ranks in runs
              if (r0 := ranks.get(0)) and "steal_ms" in r0 and steady(r0)]
    if stolen:
        print("\nsteady steps, rank 0, median a step: the host's stolen CPU ms (all vCPUs) / involuntary switches: %s" % (
            ", ".join("%s%s%s %.1f / %d" % (p + " " if len({x[0] for x in stolen}) > 1 else "", a, " " + t if t else "", ms, n)
                      for p, a, t, ms, n in stolen)))
    for (prog, alloc, tag), ranks in runs:
        line = by_call(ranks.get(0))
        if line:
            print("\n%s %s%s, rank 0, driver time by call: %s" % (prog, alloc, " " + tag if tag else "", line))
        line = misses(ranks.get(0))
        if line:
            print("\n%s %s%s, rank 0, a steady step (median): %s" % (prog, alloc, " " + tag if tag else "", line))


def against_expandable(runs):
    """(tag, gpumem's median steady step over expandable's) for each round
    (program and tag) run under both: rounds differ by more than the
    allocators do, so the same round is the fair comparison."""
    med = {}
    for (prog, alloc, tag), ranks in runs:
        r0 = ranks.get(0)
        if alloc in ("gpumem", "expandable") and r0 and "lengths" in r0 and steady(r0):
            med.setdefault((prog, tag), {})[alloc] = statistics.median(r0["step_ms"][i] for i in steady(r0))
    return [((prog + " " if len({p for p, _ in med}) > 1 else "") + tag, m["gpumem"] / m["expandable"])
            for (prog, tag), m in med.items() if len(m) == 2]


def by_call(rec):
    """rec's driver time by call over all its steps, with the counts where
    ddp.py records them; None without the per-call times."""
    per = (rec or {}).get("gpumem_per_step") or {}
    if "CreateNanos" not in per:
        return None
    out = []
    for name, ns, n in (("create", "CreateNanos", "Creates"), ("map", "MapNanos", "Maps"),
                        ("set_access", "SetAccessNanos", "SetAccess"), ("unmap", "UnmapNanos", "Unmaps"),
                        ("release", "ReleaseNanos", "Releases")):
        ms = sum(per[ns]) / 1e6
        calls = sum(per[n]) if n and n in per else None
        each = " (%d calls, %.3f ms each)" % (calls, ms / calls) if calls else ""
        out.append("%s %.1f ms%s" % (name, ms, each))
    return ", ".join(out)


def misses(rec):
    """gpumem's slow path in rec's steady steps, the median a step: the
    misses and their host time, and within it the event calls (the
    streams' order) and the driver calls and fences; None where ddp.py
    did not record the event calls (before they were counted)."""
    per = (rec or {}).get("gpumem_per_step") or {}
    if "EventNanos" not in per or not steady(rec):
        return None
    ss = steady(rec)
    med = lambda k, scale=1: statistics.median(per[k][i] for i in ss) / scale
    marks = ""
    if "MarkNanos" in per:
        marks = " (markers' writes %d in %.2f ms)" % (med("MarkCalls"), med("MarkNanos", 1e6))
    return "%d misses in %.2f ms; %d event calls in %.2f ms%s; driver calls %.2f ms, fences %.2f ms" % (
        med("Misses"), med("MissNanos", 1e6), med("EventCalls"), med("EventNanos", 1e6), marks,
        med("DriverNanos", 1e6), med("WaitNanos", 1e6))


if __name__ == "__main__":
    main(sys.argv[1])
