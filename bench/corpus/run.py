"""run.py NAME ALLOCATOR [--out FILE] [--tag TAG]: runs one corpus program
(programs.PROGRAMS[NAME]) in this process under one allocator and prints
one JSON line (appended to FILE too): the process's NVML peak above its
start (polled from another process, bench/train/nvmlwatch.py), the
allocator's peak reserved and allocated, and the program's seconds.

ALLOCATOR: native, expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
or gpumem (gpumem.torch.use(); GPUMEM_CONFIG as for any gpumem program,
limit=... for a limit). The real run of what `gpumem replay` models from the
program's recorded trace: compare the two where they disagree."""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("allocator", choices=["native", "expandable", "gpumem"])
    ap.add_argument("--out")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    if args.allocator == "gpumem":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem.torch
        gpumem.torch.use()
    sys.path.insert(0, HERE)
    import programs
    fn = programs.PROGRAMS[args.name][0]

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    watch = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "train", "nvmlwatch.py"), str(os.getpid())],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert watch.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    watch.stdin.close()
    nvml_peak = int(watch.stdout.readline())
    watch.wait()
    if args.allocator == "gpumem":
        st = gpumem.torch.stats()
        reserved, allocated = st["peak_reserved"], st["peak_allocated"]
    else:
        reserved, allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    rec = {"program": args.name, "allocator": args.allocator, "tag": args.tag,
           "config": os.environ.get("GPUMEM_CONFIG", "") if args.allocator == "gpumem" else "",
           "nvml_peak_bytes": nvml_peak, "peak_reserved_bytes": reserved, "peak_allocated_bytes": allocated,
           "seconds": seconds, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.allocator == "gpumem":
        rec["gpumem_stats"] = st
    line = json.dumps(rec)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
