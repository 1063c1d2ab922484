"""Does the simulated device decide as the GPU did? For each line of a
tight.jsonl (scripts/gpu.sh run tight: ten passes of a program on the GPU,
unlimited and under --gather --limit at its fit), replays the same program
the same way on the simulated device here and compares the driver calls
(creates, maps, unmaps, releases), the splits and the peak reserved bytes.

    python3 bench/core/sim_vs_gpu.py TIGHT.jsonl [GPUMEM]

GPUMEM is the CLI (default build/gpumem), built at the commit the GPU ran.
Prints each run that differs and a count; exit 1 if any differs."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calls_table import calls, splits  # noqa: E402 (bench/core, beside this file)


def main(path, cli):
    same, differ = 0, []
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    for r in lines:
        if r.get("round", 1) != 1:
            continue
        for key, extra in (("unlimited", []), ("gather", ["--gather", "--limit", f"{r['cap_mib']}MiB"])):
            out = subprocess.run([cli, "replay", "--device", "sim", "--json", "--passes", "10", *extra, r["path"]],
                                 capture_output=True, text=True, check=True).stdout
            d, g = json.loads(out), r[key]
            got = (calls(d), splits(d), d["peak_reserved_bytes"])
            want = (calls(g), splits(g), g["peak_reserved_bytes"])
            if got == want:
                same += 1
            else:
                differ.append(f"{os.path.basename(r['path'])} {key}: simulated {got}, GPU {want} (calls, splits, peak reserved)")
    for line in differ:
        print(line)
    print(f"{same} runs decided the same on the simulated device as on the GPU, {len(differ)} differently")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else "build/gpumem"))
