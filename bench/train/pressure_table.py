"""pressure_table.py PRESSURE.jsonl: issue 30's runs under a limit as a
markdown table, one row per program: the limit (the run.py tag
"limit=L" that scripts/gpu.sh's pressure part gives, its `gpumem fit`
figure), whether any run at it ran out of memory, the peak reserved at
the limit and unlimited, the median step of each run at the limit and
unlimited in the order they ran, the last loss of each, and whether the
device calls (creates, maps, unmaps, releases) at the limit equal the
unlimited runs' (the limit had to act where they do not), and the
splits of each run at the limit (Config.Gather's moves; 0 without it).

Runs tagged "record" (the recording run) are left out; a failed run (an
"error" line, as suite.py and gpu.sh write them) counts as an
out-of-memory when its message says so."""

import json
import sys

CALLS = ("Creates", "Maps", "Unmaps", "Releases")


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def calls(rec):
    st = rec.get("gpumem_stats") or {}
    return tuple(st.get(k) for k in CALLS)


def table(rows):
    progs = []
    for r in rows:
        if r.get("program") not in progs and r.get("tag") != "record":
            progs.append(r["program"])
    out = ["| program | L | OOM at L | peak reserved GiB at L (unlimited) | median step ms at L (unlimited) "
           "| last loss at L (unlimited) | device calls at L = unlimited | splits at L |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for prog in progs:
        runs = [r for r in rows if r.get("program") == prog and r.get("tag") != "record"]
        free = [r for r in runs if r.get("tag") == "unlimited" and "error" not in r]
        limited = [r for r in runs if str(r.get("tag", "")).startswith("limit=")]
        limit = sorted({r["tag"][len("limit="):] for r in limited}) or ["-"]
        ooms = sum(1 for r in limited if "error" in r and "out of memory" in r["error"].lower())
        failed = sum(1 for r in limited if "error" in r) - ooms
        ok = [r for r in limited if "error" not in r]

        def gib(rs):
            return ", ".join(f"{r['gpumem_stats']['PeakReserved'] / 2**30:.3f}" for r in rs if r.get("gpumem_stats")) or "-"

        def steps(rs):
            return ", ".join(f"{r['median_step_ms']:.1f}" for r in rs if r.get("median_step_ms") is not None) or "-"

        def loss(rs):
            return ", ".join(f"{r['losses'][-1]:.5f}" for r in rs if r.get("losses")) or "-"

        same = "-"
        if ok and free:
            same = "yes" if all(calls(r) == calls(free[0]) for r in ok + free) else "no"
        oom = f"{ooms} of {len(limited)}" + (f" ({failed} failed otherwise)" if failed else "")
        splits = ", ".join(str(r["gpumem_stats"].get("Splits", 0)) for r in ok if r.get("gpumem_stats")) or "-"
        out.append(f"| {prog} | {', '.join(limit)} | {oom} | {gib(ok)} ({gib(free)}) | {steps(ok)} ({steps(free)}) "
                   f"| {loss(ok)} ({loss(free)}) | {same} | {splits} |")
    return "\n".join(out)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(table(load(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
