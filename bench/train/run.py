"""run.py PROGRAM ALLOCATOR [--steps N] [--out FILE]: runs one training
program (programs.py) under one allocator in this process and prints one
JSON line (appended to FILE too).

ALLOCATOR: native (PyTorch as shipped), expandable
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) or gpumem
(gpumem.torch.use()). The line holds: the process's peak device memory as
NVML reports it (polled from another process), the peak reserved by the
allocator, every step's time and loss, the median step time after warm-up
(the first fifth of the steps, at least 2), and how long after
del + gc.collect() + torch.cuda.empty_cache() the NVML figure took to come
back within 64 MiB of its value before the model was built (measured on a
second, short round of the program: see the comment at the cleanup)."""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def nvml_used(pid):
    import pynvml
    pynvml.nvmlInit()
    total = 0
    for i in range(pynvml.nvmlDeviceGetCount()):
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i)):
            if p.pid == pid and p.usedGpuMemory is not None:
                total += p.usedGpuMemory
    return total


def emit(rec, out):
    """Prints rec as one JSON line, and appends it to the file out if given."""
    line = json.dumps(rec)
    print(line)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("allocator", choices=["native", "expandable", "gpumem"])
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--tag", default="")
    ap.add_argument("--no-watch", action="store_true", help="no NVML polling (its peak is then 0)")
    ap.add_argument("--profile", action="store_true", help="cProfile the steps; the top 30 functions go to stderr")
    ap.add_argument("--record", metavar="TRACE", help="record the whole run's allocations "
                    "(gpumem.torch.record: gpumem's recorder, or under PyTorch's allocators its memory "
                    "history converted), both rounds, for gpumem fit and replay")
    args = ap.parse_args()

    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    if args.allocator == "gpumem":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem.torch
        gpumem.torch.use()
    recording = None
    if args.record:
        if args.allocator != "gpumem":
            # The request sequence under PyTorch's own allocator, which
            # may differ from the one under gpumem (what the program asks
            # can depend on the allocator: cuDNN's workspaces, say).
            sys.path.insert(0, os.path.join(ROOT, "python"))
            import gpumem.torch
        recording = gpumem.torch.record(args.record)
        recording.__enter__()
    sys.path.insert(0, HERE)
    import programs

    fn, default_steps = programs.PROGRAMS[args.program]
    steps = args.steps or default_steps
    pid = os.getpid()

    torch.zeros(1, device="cuda")  # the context, before anything is measured
    torch.cuda.synchronize()
    before = nvml_used(pid)
    watch = None
    if not args.no_watch:
        watch = subprocess.Popen([sys.executable, os.path.join(HERE, "nvmlwatch.py"), str(pid)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert watch.stdout.readline().strip() == "ready"

    times, losses = [], []
    last = [time.perf_counter()]

    def log(loss):
        torch.cuda.synchronize()
        now = time.perf_counter()
        times.append((now - last[0]) * 1e3)
        losses.append(float(loss.detach()))
        last[0] = time.perf_counter()

    start = time.perf_counter()
    if args.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        model, opt = prof.runcall(fn, steps, log)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    else:
        model, opt = fn(steps, log)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start

    if args.allocator == "gpumem":
        st = gpumem.torch.stats()
        peak_reserved, peak_allocated = st["peak_reserved"], st["peak_allocated"]
    else:
        peak_reserved, peak_allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()

    # Give everything back. The first cleanup's NVML figure also holds what
    # the program loaded on the way (CUDA modules loaded lazily, library
    # handles and workspaces), which no allocator can give back; so a second,
    # short round of the same program measures the release: NVML before it,
    # and how long after its cleanup the figure takes to come back within
    # 64 MiB of that.
    def cleanup(model, opt):
        del model, opt
        gc.collect()
        torch.cuda.empty_cache()

    cleanup(model, opt)
    model = opt = None
    after_first = nvml_used(pid)
    held_after = gpumem.torch.stats()["reserved"] if args.allocator == "gpumem" else torch.cuda.memory_reserved()

    before2 = nvml_used(pid)
    model, opt = fn(2, lambda loss: None)
    torch.cuda.synchronize()
    during2 = nvml_used(pid)
    del model, opt
    gc.collect()
    t0 = time.perf_counter()
    torch.cuda.empty_cache()
    release_ms, after2 = None, None
    while time.perf_counter() - t0 < 2.0:
        after2 = nvml_used(pid)
        if after2 <= before2 + (64 << 20):
            release_ms = (time.perf_counter() - t0) * 1e3
            break
        time.sleep(0.002)

    nvml_peak = 0
    if watch:
        watch.stdin.close()
        nvml_peak = int(watch.stdout.readline())
        watch.wait()

    warm = max(2, steps // 5)
    rec = {
        "program": args.program, "allocator": args.allocator, "tag": args.tag, "steps": steps,
        "nvml_peak_bytes": nvml_peak, "nvml_before_bytes": before,
        "nvml_after_cleanup_bytes": after_first, "allocator_held_after_cleanup_bytes": held_after,
        "nvml_round2_before_bytes": before2, "nvml_round2_during_bytes": during2,
        "nvml_round2_after_bytes": after2, "release_ms": release_ms, "peak_reserved_bytes": peak_reserved,
        "peak_allocated_bytes": peak_allocated,
        "median_step_ms": statistics.median(times[warm:]) if len(times) > warm else None,
        "total_step_ms_after_warmup": sum(times[warm:]),
        "wall_s": wall, "step_ms": times, "losses": losses, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    if args.allocator == "gpumem":
        rec["gpumem_stats"] = json.loads(gpumem.library().stats_json(0))
    if recording is not None:
        recording.__exit__(None, None, None)
        rec["trace"] = os.path.basename(args.record)
    emit(rec, args.out)


if __name__ == "__main__":
    main()
