"""run.py PROGRAM MODE [--out FILE]: one JAX program (programs.py) in this
process, under the allocator mode the environment set (suite.py sets it;
MODE only names it), printing one JSON line: NVML device memory of the
process at start (context up, nothing allocated), its peak during the
program (polled from another process) and after the program's arrays are
deleted, collected and jax.clear_caches() run (at once, and the time it took
to come back within 64 MiB of the start, waiting up to WAIT seconds), the
median step time of each phase after its first two steps, the losses, and
JAX's own peak_bytes_in_use where the allocator reports it. Under gpumem
run, gpumem.trim() is also timed."""

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
sys.path.insert(0, os.path.join(ROOT, "bench", "train"))
from run import emit, nvml_used  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("mode")
    ap.add_argument("--out")
    ap.add_argument("--wait", type=float, default=7.0, help="seconds to wait for the memory to come back")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    sys.path.insert(0, HERE)
    import programs

    pid = os.getpid()
    jnp.zeros(1).block_until_ready()  # the context and the client
    start = nvml_used(pid)
    watch = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "train", "nvmlwatch.py"), str(pid)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert watch.stdout.readline().strip() == "ready"
    times, losses = {}, []
    last = [time.perf_counter()]

    def log(phase, loss):
        loss = float(loss)  # waits for the step
        now = time.perf_counter()
        times.setdefault(phase, []).append((now - last[0]) * 1e3)
        losses.append(loss)
        last[0] = time.perf_counter()

    t0 = time.perf_counter()
    programs.PROGRAMS[args.program](log)
    wall = time.perf_counter() - t0
    stats = {}
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:
        pass
    during = nvml_used(pid)
    gc.collect()
    jax.clear_caches()
    t1 = time.perf_counter()
    after_at_once = nvml_used(pid)
    release_ms, after, drops = None, after_at_once, []
    while time.perf_counter() - t1 < args.wait:
        now = nvml_used(pid)
        if now < after - (8 << 20):
            drops.append(((time.perf_counter() - t1) * 1e3, now))
        after = now
        if after <= start + (64 << 20):
            release_ms = (time.perf_counter() - t1) * 1e3
            break
        time.sleep(0.005)
    trim_ms, gm = None, None
    if os.environ.get("GPUMEM_LIBRARY"):
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem
        gm = json.loads(gpumem.library().stats_json(0))
        t2 = time.perf_counter()
        gpumem.trim()
        while time.perf_counter() - t2 < 1.0:
            if nvml_used(pid) <= start + (64 << 20):
                trim_ms = (time.perf_counter() - t2) * 1e3
                break
            time.sleep(0.002)
    watch.stdin.close()
    peak = int(watch.stdout.readline())
    watch.wait()
    rec = {"program": args.program, "mode": args.mode, "nvml_start_bytes": start, "nvml_peak_bytes": peak,
           "nvml_end_of_program_bytes": during, "nvml_after_cleanup_at_once_bytes": after_at_once,
           "nvml_after_cleanup_bytes": after, "release_ms": release_ms, "trim_ms": trim_ms,
           "nvml_drops_ms_bytes": drops,
           "jax_peak_bytes_in_use": stats.get("peak_bytes_in_use"),
           "median_step_ms": {k: statistics.median(v[2:]) for k, v in times.items() if len(v) > 2},
           "step_ms": times, "losses": losses, "wall_s": wall, "jax": jax.__version__,
           "gpumem_stats_after_release": gm}
    emit(rec, args.out)


if __name__ == "__main__":
    main()
