"""run.py NAME ALLOCATOR [--out FILE] [--tag TAG] [--sample MS] [--record TRACE] [--times N]: runs one
corpus program (programs.PROGRAMS[NAME]) in this process under one
allocator and prints one JSON line (appended to FILE too): the process's
NVML peak above its start (polled from another process,
bench/train/nvmlwatch.py), the allocator's peak reserved and allocated, the
program's seconds and the CPU seconds of the process over them, and with
--sample the Python lines the main thread was seen at most (sampled every
MS milliseconds from a thread of its own): where two runs' time differs.
Whole-program seconds vary by up to a third from run to run on the H200
machines: compare allocators in interleaved rounds, never single runs
(docs/BENCHMARKS.md, "Decode programs interleaved").

ALLOCATOR: native, expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
or gpumem (gpumem.torch.use(); GPUMEM_CONFIG as for any gpumem program,
limit=... for a limit). The real run of what `gpumem replay` models from the
program's recorded trace: compare the two where they disagree.

--times N runs the program N times in the one process, everything it made
dropped between runs (gc.collect, synchronize): the real counterpart of
`gpumem replay --passes N`. "runs" then lists, per run, its seconds, the
allocator's peak reserved bytes so far (over the runs up to it) and what
was still allocated after it (live buffers under gpumem, whose pool rests
only when that is 0: rest.go)."""

import argparse
import collections
import gc
import json
import os
import resource
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class Sampler:
    """Samples the main thread's Python stack every period seconds from a
    thread of its own: counts each sample's innermost frame and its
    innermost frame in a corpus or model file (file:line function), so
    two allocators' runs of one program show where the extra time went
    (a line that waits for the GPU, or one that allocates)."""

    def __init__(self, period):
        self.period, self.main = period, threading.main_thread().ident
        self.leaf, self.own, self.n = collections.Counter(), collections.Counter(), 0
        self.done = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    @staticmethod
    def where(f):
        return "%s:%d %s" % (os.path.basename(f.f_code.co_filename), f.f_lineno, f.f_code.co_name)

    def run(self):
        while not self.done.wait(self.period):
            f = sys._current_frames().get(self.main)
            if f is None:
                continue
            self.n += 1
            self.leaf[self.where(f)] += 1
            while f is not None and os.path.basename(f.f_code.co_filename) != "programs.py":
                f = f.f_back
            if f is not None:
                self.own[self.where(f)] += 1

    def stop(self, top=25):
        self.done.set()
        self.t.join()
        return {"n": self.n, "period_s": self.period,
                "leaf": self.leaf.most_common(top), "programs_py": self.own.most_common(top)}


def run_path(path, k):
    """Where --record writes run k+1 (from 0) of --times: ".runK" before
    ".trace" (x.trace.gz: x.run2.trace.gz), else at the end."""
    i = path.find(".trace")
    return path[:i] + ".run%d" % (k + 1) + path[i:] if i > 0 else path + ".run%d" % (k + 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("allocator", choices=["native", "expandable", "gpumem"])
    ap.add_argument("--out")
    ap.add_argument("--tag", default="")
    ap.add_argument("--record", metavar="TRACE",
                    help="under gpumem: write the run's requests to TRACE (gpumem.torch.record, no call sites; "
                         "with --times, run K>1's to TRACE with .runK before .trace), "
                         "to compare two runs request by request or replay this one")
    ap.add_argument("--times", type=int, default=1,
                    help="run the program TIMES times in this process (the real counterpart of replay --passes)")
    ap.add_argument("--sample", type=float, default=0,
                    help="sample the program's Python stack every SAMPLE ms and add the lines seen most (where the time went)")
    args = ap.parse_args()
    if args.record and args.allocator != "gpumem":
        ap.error("--record records gpumem's requests: use record.py for PyTorch's allocators")
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
    sampler = Sampler(args.sample / 1e3) if args.sample > 0 else None
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    runs = []
    for k in range(args.times):
        t1 = time.perf_counter()
        if args.record and args.allocator == "gpumem":
            path = args.record if k == 0 else run_path(args.record, k)
            with gpumem.torch.record(path, sites=False):
                fn()
                torch.cuda.synchronize()
        else:
            fn()
        gc.collect()
        torch.cuda.synchronize()
        run = {"seconds": time.perf_counter() - t1}
        if args.allocator == "gpumem":
            st = gpumem.torch.stats()
            run.update(peak_reserved_bytes=st["peak_reserved"], live_buffers=st["live_buffers"])
        else:
            run.update(peak_reserved_bytes=torch.cuda.max_memory_reserved(), allocated_bytes=torch.cuda.memory_allocated())
        runs.append(run)
    seconds = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    samples = sampler.stop() if sampler else None
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
           "seconds": seconds, "cpu_seconds": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.allocator == "gpumem":
        rec["gpumem_stats"] = st
    if args.times > 1:
        rec["runs"] = runs
    if samples:
        rec["samples"] = samples
    line = json.dumps(rec)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
