"""run.py PROGRAM MODE [--out FILE] [--trim-first]: one JAX program
(programs.py) in this process, under the allocator mode the environment set
(suite.py sets it; MODE only names it), printing one JSON line: NVML device
memory of the process with the context up (nvml_context_bytes) and before
the model (nvml_start_bytes: after a tiny jitted training step has been
compiled and run, so that the modules XLA and cuBLAS load are counted in),
its peak during the program (polled from another process) and after the
program's arrays are deleted, collected and jax.clear_caches() run (at once,
and the time it took to come back within 64 MiB of the start, from the end
of the program and from the cleanup, waiting up to WAIT seconds), the median
step time of each phase after its first two steps, the losses, and JAX's own
peak_bytes_in_use where the allocator reports it.

Under gpumem run (GPUMEM_LIBRARY set), gpumem.trim() is called through the
Python package, which loads the same libgpumem the shim loaded (one dlopen
of one path: one allocator); the record says whether it reached it
(gpumem's Reserved and Trims before and after). Without --trim-first the
trim comes after the wait (the idle release is measured); with it, at once
after the cleanup (the trim is measured)."""

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
    ap.add_argument("--trim-first", action="store_true", help="under gpumem, trim at once after the cleanup")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    sys.path.insert(0, HERE)
    import programs

    pid = os.getpid()
    jnp.zeros(1).block_until_ready()  # the context and the client
    context = nvml_used(pid)
    warm_up(jax, jnp)
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
    t_end = time.perf_counter()  # the program's arrays are deleted at its return
    wall = t_end - t0
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
    on_gpumem = bool(os.environ.get("GPUMEM_LIBRARY"))
    trim = None
    if on_gpumem and args.trim_first:
        trim = timed_trim(pid, start)
    release_ms, release_from_end_ms, after, drops = None, None, nvml_used(pid), []
    while time.perf_counter() - t1 < args.wait:
        now = nvml_used(pid)
        if now < after - (8 << 20):
            drops.append(((time.perf_counter() - t1) * 1e3, now))
        after = now
        if after <= start + (64 << 20):
            release_ms = (time.perf_counter() - t1) * 1e3
            release_from_end_ms = (time.perf_counter() - t_end) * 1e3
            break
        time.sleep(0.005)
    gm = None
    if on_gpumem:
        gm = gpumem_stats()
        if trim is None:
            trim = timed_trim(pid, start)
    watch.stdin.close()
    peak = int(watch.stdout.readline())
    watch.wait()
    rec = {"program": args.program, "mode": args.mode, "nvml_context_bytes": context, "nvml_start_bytes": start,
           "nvml_peak_bytes": peak,
           "nvml_end_of_program_bytes": during, "nvml_after_cleanup_at_once_bytes": after_at_once,
           "nvml_after_cleanup_bytes": after, "release_ms": release_ms, "release_from_end_ms": release_from_end_ms,
           "cleanup_ms": (t1 - t_end) * 1e3, "trim_first": args.trim_first,
           "trim_ms": trim and trim["ms"], "trim": trim,
           "nvml_drops_ms_bytes": drops,
           "jax_peak_bytes_in_use": stats.get("peak_bytes_in_use"),
           "median_step_ms": {k: statistics.median(v[2:]) for k, v in times.items() if len(v) > 2},
           "step_ms": times, "losses": losses, "wall_s": wall, "jax": jax.__version__,
           "gpumem_stats_after_release": gm}
    emit(rec, args.out)


def warm_up(jax, jnp):
    """Compiles and runs a tiny training step (matmul, softmax cross-entropy,
    gradient), so that what XLA and cuBLAS load at their first use is in the
    figure before the model; its arrays are gone when it returns."""
    def loss(w, x, y):
        logits = jnp.tanh(x @ w[0]) @ w[1]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))
    step = jax.jit(jax.value_and_grad(loss))
    w = (jnp.ones((64, 64), jnp.float32) / 8, jnp.ones((64, 10), jnp.float32) / 8)
    value, grads = step(w, jnp.ones((32, 64), jnp.float32), jnp.zeros((32,), jnp.int32))
    float(value)
    del w, value, grads, step
    gc.collect()


def gpumem_stats():
    """gpumem's numbers for device 0, through the Python package (the
    library the shim loaded)."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import gpumem
    return json.loads(gpumem.library().stats_json(0))


def timed_trim(pid, start):
    """gpumem.trim(), the time until NVML is within 64 MiB of start (up to
    1 s), and whether it reached the shim's allocator: its Trims counter
    went up and its Reserved went to 0 or stayed there."""
    before = gpumem_stats()  # puts the package's directory on the path
    import gpumem
    t = time.perf_counter()
    gpumem.trim()
    ms = None
    while time.perf_counter() - t < 1.0:
        if nvml_used(pid) <= start + (64 << 20):
            ms = (time.perf_counter() - t) * 1e3
            break
        time.sleep(0.002)
    after = gpumem_stats()
    return {"ms": ms, "reserved_before": before.get("Reserved"), "reserved_after": after.get("Reserved"),
            "trims_before": before.get("Trims"), "trims_after": after.get("Trims"), "nvml_after_bytes": nvml_used(pid),
            "reached_shim_allocator": (after.get("Trims") or 0) > (before.get("Trims") or 0) and after.get("Reserved") == 0}


if __name__ == "__main__":
    main()
