"""top_h100.py OUTDIR: `gpumem top` and `gpumem serve` watching a real
PyTorch program on gpumem (issue 12's GPU bar: both show the program with
its pool, and NVML's figure reconciles with gpumem's reserved bytes plus
what the process held outside gpumem, its CUDA context, within 1%).

Runs on the GPU machine from the repository root, after `scripts/gpu.sh
build` here (build/gpu/gpumem, python/gpumem/libgpumem.so carried). For
each way of starting the server (serve= in GPUMEM_CONFIG, which measures
the context when the allocator starts; gpumem.serve() after the first
training step, which measures it then), it starts one training program
under gpumem in a child process and, while it trains, every 2 s: runs
`gpumem top --once` (kept), reads NVML's figure for the child (nvidia-ml-py)
and the child's /debug/gpumem/stats, and scrapes `gpumem serve`'s
/metrics. Prints one JSON line per sample and a summary line per variant;
writes OUTDIR/top_frames.txt, OUTDIR/serve_metrics.txt."""

import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUMEM = os.path.join(ROOT, "build", "gpu", "gpumem")

CHILD = r"""
import os, sys, time
sys.path.insert(0, os.path.join(@ROOT@, "python"))
sys.path.insert(0, os.path.join(@ROOT@, "bench", "train"))
import gpumem, gpumem.torch
gpumem.torch.use()
import torch, programs
fn, _ = programs.PROGRAMS[@PROGRAM@]
n = [0]
def log(loss):
    n[0] += 1
    if n[0] == 1 and @VARIANT@ == "serve_after_step":
        torch.cuda.synchronize()
        print("served", gpumem.serve("127.0.0.1:0"), flush=True)
for _ in range(@ROUNDS@):
    fn(@STEPS@, log)
torch.cuda.synchronize()
print("done", flush=True)
time.sleep(3)
"""


def nvml_used(pid):
    import pynvml
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == pid:
                return p.usedGpuMemory
        return None
    finally:
        pynvml.nvmlShutdown()


def get(url):
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.read().decode()


def variant(name, program, steps, rounds, outdir, frames, metrics_out):
    run_dir = os.path.join("/tmp", "gpumem_run_" + name)
    os.makedirs(run_dir, exist_ok=True)
    for f in os.listdir(run_dir):
        os.remove(os.path.join(run_dir, f))
    env = dict(os.environ, GPUMEM_RUN_DIR=run_dir, PYTHONUNBUFFERED="1")
    if name == "serve_at_start":
        env["GPUMEM_CONFIG"] = "serve=127.0.0.1:0"
    code = CHILD.replace("@ROOT@", repr(ROOT)).replace("@PROGRAM@", repr(program)).replace(
        "@VARIANT@", repr(name)).replace("@ROUNDS@", str(rounds)).replace("@STEPS@", str(steps))
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    os.set_blocking(child.stdout.fileno(), False)
    serve = subprocess.Popen([GPUMEM, "serve", "--listen", "127.0.0.1:19464"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples, log = [], []
    t0 = time.time()
    try:
        while child.poll() is None and time.time() - t0 < 150:
            time.sleep(2)
            try:
                out = child.stdout.read()
                if out:
                    log.append(out)
            except (BlockingIOError, TypeError):
                pass
            ann = [f for f in os.listdir(run_dir) if f.isdigit()]
            if not ann:
                continue
            try:
                top = subprocess.run([GPUMEM, "top", "--once"], env=env, capture_output=True, text=True, timeout=20).stdout
                frames.write(f"== {name} t={time.time() - t0:.1f}s\n{top}\n")
                addr = open(os.path.join(run_dir, ann[0])).read().strip().split()[-1]
                stats = json.loads(get(f"http://{addr}/debug/gpumem/stats"))["0"]
                used = nvml_used(child.pid)
                s = {"variant": name, "t": round(time.time() - t0, 1), "nvml": used,
                     "reserved": stats["stats"]["Reserved"], "outside": stats.get("outside"),
                     "top_shows_pid": str(child.pid) in top, "top_shows_pool": "gpumem pools" in top}
                if used and s["outside"] is not None:
                    s["unexplained"] = used - s["reserved"] - s["outside"]
                    s["unexplained_share"] = s["unexplained"] / used
                m = get("http://127.0.0.1:19464/metrics")
                s["serve_has_pool"] = f'pid="{child.pid}"' in m and "gpumem_reserved_bytes" in m
                s["serve_has_outside"] = "gpumem_process_outside_bytes" in m
                if len(samples) == 3:
                    metrics_out.write(f"== {name}\n" + "\n".join(l for l in m.splitlines() if not l.startswith("#") and str(child.pid) in l) + "\n")
                samples.append(s)
                print(json.dumps(s), flush=True)
            except Exception as e:  # a sample that fails is said and skipped
                print(json.dumps({"variant": name, "sample_error": repr(e)}), flush=True)
    finally:
        serve.terminate()
        if child.poll() is None:
            child.kill()
        try:
            rest = child.stdout.read()
            if rest:
                log.append(rest)
        except Exception:
            pass
    shares = [abs(s["unexplained_share"]) for s in samples if "unexplained_share" in s]
    summary = {"variant": name, "program": program, "samples": len(samples),
               "max_abs_unexplained_share": max(shares) if shares else None,
               "top_always_shows_pool": all(s["top_shows_pool"] and s["top_shows_pid"] for s in samples) if samples else False,
               "serve_always_has_pool": all(s["serve_has_pool"] for s in samples) if samples else False,
               "child_exit": child.returncode, "child_tail": "".join(log)[-600:]}
    print(json.dumps(summary), flush=True)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "."
    program = os.environ.get("PROGRAM", "gpt2_train_varlen")
    with open(os.path.join(outdir, "top_frames.txt"), "w") as frames, open(os.path.join(outdir, "serve_metrics.txt"), "w") as m:
        for name in ("serve_at_start", "serve_after_step"):
            variant(name, program, int(os.environ.get("STEPS", "20")), int(os.environ.get("ROUNDS", "1")), outdir, frames, m)


if __name__ == "__main__":
    main()
