"""replay_check.py OUTDIR [GPUMEM]: does the replay of a run's trace hold
what the run held? (issue 30: the pool peak of a real run under gpumem
equals, within 1%, the replay of the trace gpumem.torch.record wrote of
that same run.)

For each OUTDIR/PROGRAM.gpumem.trace.gz with its PROGRAM.gpumem.stats.json
(record_check.py writes both on the GPU machine), replays the trace with
`gpumem replay --json` (GPUMEM: the command, default `gpumem` on PATH; on a
machine with no GPU the simulated device) and prints a line per program:
the run's peak reserved bytes, the replay's, their ratio, and whether they
agree within 1%. Exit status 1 if any disagrees, 2 if there is nothing to
check."""

import glob
import json
import os
import subprocess
import sys

TOLERANCE = 0.01


def check(outdir, gpumem="gpumem"):
    rows = []
    for trace in sorted(glob.glob(os.path.join(outdir, "*.gpumem.trace.gz"))):
        prog = os.path.basename(trace)[: -len(".gpumem.trace.gz")]
        stats = os.path.join(outdir, prog + ".gpumem.stats.json")
        if not os.path.exists(stats):
            print(f"{prog}: no {os.path.basename(stats)}: skipped", file=sys.stderr)
            continue
        with open(stats) as f:
            real = int(json.load(f)["peak_reserved"])
        out = subprocess.run([gpumem, "replay", "--json", trace], capture_output=True, text=True, check=True)
        replay = int(json.loads(out.stdout.splitlines()[0])["peak_reserved_bytes"])
        ratio = replay / real if real else float("inf")
        rows.append((prog, real, replay, ratio, abs(ratio - 1) <= TOLERANCE))
    return rows


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows = check(argv[1], argv[2] if len(argv) > 2 else "gpumem")
    if not rows:
        print(f"replay_check: nothing to check in {argv[1]}", file=sys.stderr)
        return 2
    print(f"{'program':24} {'run peak':>14} {'replay peak':>14} {'replay/run':>10}  agree")
    for prog, real, replay, ratio, ok in rows:
        print(f"{prog:24} {real:>14} {replay:>14} {ratio:>10.4f}  {'yes' if ok else 'NO'}")
    return 0 if all(r[4] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
