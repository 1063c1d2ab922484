"""front_table.py FILE.jsonl: the front cache's step-time table from
`scripts/gpu.sh run front` (bench/train/run.py lines tagged r<N>,
front-r<N>, nofront-r<N> and stats): per program, each round's median step
under PyTorch's allocator, gpumem, and gpumem with GPUMEM_FRONT=0, the
fastest of each, NVML and reserved peaks, the last loss, and the share of
requests the front served (Stats.Reused over Allocs)."""

import json
import sys


def kind(rec):
    if rec["allocator"] == "native":
        return "PyTorch"
    return "gpumem, GPUMEM_FRONT=0" if rec["tag"].startswith("nofront") else "gpumem"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = {}
    for line in open(sys.argv[1]):
        rec = json.loads(line)
        if rec.get("tag") == "stats":
            continue
        rows.setdefault((rec["program"], kind(rec)), []).append(rec)
    print("| program | allocator | median step ms, each round | fastest | NVML peak MiB | peak reserved MiB | last loss | served by the front |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- | ---: |")
    for (prog, k), recs in sorted(rows.items()):
        steps = [r["median_step_ms"] for r in recs]
        st = recs[-1].get("gpumem_stats") or {}
        served = f"{st['Reused'] / st['Allocs']:.1%}" if st.get("Allocs") else "-"
        print(f"| {prog} | {k} | {', '.join(f'{s:.0f}' for s in steps)} | {min(steps):.0f} | "
              f"{recs[-1]['nvml_peak_bytes'] >> 20} | {recs[-1]['peak_reserved_bytes'] >> 20} | "
              f"{recs[-1]['losses'][-1]:.6g} | {served} |")


if __name__ == "__main__":
    main()
