"""lmperf.py: where the LM's step time goes under gpumem run (issue 10).

    lmperf.py --gpumem PATH --shim PATH [--lengths 256,1024] [--steps 16]
              [--repeats 2] [--deadline S] [--out FILE]
    lmperf.py child LENGTHS STEPS      (one process: what the parent runs)

The lm program of programs.py (same model, same step), at fixed lengths
only, each length's steps in a row, in processes of their own, alternating
the modes round by round:

    bfc-growth       XLA's BFC allocator, preallocation off
    cuda-async       XLA's cuda_async allocator on the driver's own pool
                     (preallocation off)
    gpumem           gpumem run (XLA's command buffers of fused kernels only,
                     the default of gpumem run)
    gpumem-xla       gpumem run --xla-command-buffers xla (XLA's default ones)
    bfc-nocb, gpumem-nocb   the same with XLA's command buffers (CUDA graphs)
                     off: XLA_FLAGS=--xla_gpu_enable_command_buffer=
    bfc-fusion, gpumem-fusion   command buffers of fused kernels only
                     (--xla_gpu_enable_command_buffer=FUSION): the traced
                     commands (cuBLAS, cuDNN, custom calls) run outside them
    bfc-cache256, gpumem-cache256   every command buffer, 256 traced address
                     sets kept per command (--xla_cmd_buffer_trace_cache_size)

--modes picks some (default: all). --program mlp runs programs.py's mlp
instead (8 x 4096, momentum), --lengths then being its batch sizes.

Every mode preloads the shim with GPUMEM_PRELOAD_REPORT=1 (the BFC and
cuda-async modes with GPUMEM_PRELOAD_PASSTHROUGH=1: every call goes to the
driver, counted), so that each run reports how many stream captures XLA
began and how many calls of each wrapped entry point it made. A persistent
compilation cache (in a temporary directory) keeps the later runs from
compiling again.

Each child prints one JSON line: per length, the step times (ms, between
consecutive waits for the loss), and how many distinct sets of output
buffer addresses its steps got (XLA re-traces a command whose buffers moved:
TracedCommandBuffer::GetOrTraceCommandBuffer). The parent prints, per
length, each run's median step (after the first two steps) side by side,
each mode's mean against bfc-growth, and each run's shim report."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

MODES = {
    "bfc-growth": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "GPUMEM_PRELOAD_PASSTHROUGH": "1"},
    "cuda-async": {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "GPUMEM_PRELOAD_PASSTHROUGH": "1"},
    "gpumem": {},  # gpumem run's defaults: command buffers of fused kernels only
    "gpumem-xla": {},  # gpumem run --xla-command-buffers xla: XLA's default command buffers
    "bfc-nocb": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "GPUMEM_PRELOAD_PASSTHROUGH": "1",
                 "XLA_FLAGS": "--xla_gpu_enable_command_buffer="},
    "gpumem-nocb": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="},
    # Command buffers of kernels only: cuBLAS, cuDNN and custom calls, the
    # commands XLA records by stream capture (re-traced when their buffers
    # move), run outside the graphs; kernel launches are updated in place.
    "bfc-fusion": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "GPUMEM_PRELOAD_PASSTHROUGH": "1",
                   "XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION"},
    "gpumem-fusion": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION"},
    # Every command buffer, with room for 256 traced address sets per
    # command instead of 16.
    "bfc-cache256": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "GPUMEM_PRELOAD_PASSTHROUGH": "1",
                     "XLA_FLAGS": "--xla_cmd_buffer_trace_cache_size=256"},
    "gpumem-cache256": {"XLA_FLAGS": "--xla_cmd_buffer_trace_cache_size=256"},
}


def child(lengths, steps):
    import jax
    import jax.numpy as jnp
    sys.path.insert(0, HERE)
    import programs

    if os.environ.get("LMPERF_PROGRAM") == "mlp":  # the mlp program; "lengths" are batch sizes
        params = programs._mlp_init(jax.random.PRNGKey(0), 4096, 8, 1024, 10)
        step = programs._momentum_step(lambda p, x, y: programs._xent(programs._mlp_apply(p, x), y))

        def batch(n, i):
            k1, k2 = jax.random.split(jax.random.PRNGKey(n * 1000 + i))
            return jax.random.normal(k1, (n, 1024), jnp.float32), jax.random.randint(k2, (n,), 0, 10)
    else:
        params = programs._lm_init(jax.random.PRNGKey(0), 32000, 1024, 6, 16)
        step = programs._momentum_step(programs._lm_loss, lr=1e-4)

        def batch(n, i):
            return (jax.random.randint(jax.random.PRNGKey(i), (16, n + 1), 0, 32000),)
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    out = {"lengths": {}}
    for n in lengths:
        times, addrs, losses = [], set(), []
        last = time.perf_counter()
        for i in range(steps):
            params, velocity, loss = step(params, velocity, *batch(n, i))
            losses.append(float(loss))  # waits for the step
            now = time.perf_counter()
            times.append((now - last) * 1e3)
            leaves = jax.tree_util.tree_leaves((params, velocity))
            addrs.add(tuple(x.unsafe_buffer_pointer() for x in leaves))
            last = time.perf_counter()
        out["lengths"][str(n)] = {"step_ms": times, "median_ms": statistics.median(times[2:]),
                                  "distinct_output_addresses": len(addrs), "losses": losses}
    print(json.dumps(out), flush=True)


def run(mode, args, cache):
    env = dict(os.environ, GPUMEM_PRELOAD_REPORT="1", JAX_COMPILATION_CACHE_DIR=cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    env.update(MODES[mode])
    if "XLA_FLAGS" in MODES[mode] and os.environ.get("XLA_FLAGS"):
        env["XLA_FLAGS"] = os.environ["XLA_FLAGS"] + " " + MODES[mode]["XLA_FLAGS"]
    cmd = [sys.executable, os.path.abspath(__file__), "child", args.lengths, str(args.steps)]
    if mode.startswith("gpumem"):
        extra = ["--xla-command-buffers", "xla"] if mode == "gpumem-xla" else []
        cmd = [args.gpumem, "run", "--shim", args.shim] + extra + ["--"] + cmd
    else:
        env["LD_PRELOAD"] = args.shim + (" " + os.environ["LD_PRELOAD"] if os.environ.get("LD_PRELOAD") else "")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "error": f"timed out after {args.timeout} s"}
    rec = {"mode": mode, "wall_s": time.time() - t0,
           "preload": [line for line in p.stderr.splitlines() if line.startswith("gpumem: preload:")]}
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        rec["error"] = f"exit {p.returncode}: {p.stderr[-2000:]}"
    else:
        rec.update(json.loads(lines[-1]))
    return rec


def table(recs, lengths):
    ok = [r for r in recs if "lengths" in r]
    out = ["| length | mode | run medians (ms) | mean | vs bfc-growth | distinct output address sets / steps |",
           "| ---: | --- | --- | ---: | ---: | --- |"]
    for n in lengths:
        base = [r["lengths"][n]["median_ms"] for r in ok if r["mode"] == "bfc-growth"]
        for mode in MODES:
            rs = [r for r in ok if r["mode"] == mode]
            if not rs:
                continue
            med = [r["lengths"][n]["median_ms"] for r in rs]
            mean = sum(med) / len(med)
            vs = "%+.1f%%" % ((mean / (sum(base) / len(base)) - 1) * 100) if base else "-"
            addrs = " / ".join("%d/%d" % (r["lengths"][n]["distinct_output_addresses"], len(r["lengths"][n]["step_ms"]))
                               for r in rs)
            out.append("| %s | %s | %s | %.2f | %s | %s |" % (n, mode, " / ".join("%.2f" % m for m in med), mean, vs, addrs))
    return "\n".join(out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child([int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpumem", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--lengths", default="256,1024")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--program", choices=("lm", "mlp"), default="lm",
                    help="mlp: programs.py's mlp, --lengths then being its batch sizes")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per run")
    ap.add_argument("--deadline", type=float, default=0, help="seconds after which no run starts (0: none)")
    ap.add_argument("--out", default="lmperf.jsonl")
    args = ap.parse_args()
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            sys.exit(f"lmperf: unknown mode {m!r}; modes: {', '.join(MODES)}")
    os.environ["LMPERF_PROGRAM"] = args.program  # the children inherit it
    start, recs = time.time(), []
    with tempfile.TemporaryDirectory() as cache:
        for rnd in range(args.repeats):
            for mode in modes:
                left = args.deadline - (time.time() - start)
                if args.deadline and left < 25:
                    print(f"{mode:12s} round {rnd + 1}: skipped, {left:.0f} s left", file=sys.stderr, flush=True)
                    continue
                rec = run(mode, args, cache)
                rec["round"] = rnd + 1
                recs.append(rec)
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(f"{mode:12s} round {rnd + 1}: {'FAILED ' + rec['error'][-300:] if 'error' in rec else 'ok'} "
                      f"{rec.get('wall_s', 0):.1f} s", file=sys.stderr, flush=True)
    print(table(recs, args.lengths.split(",")))
    print()
    print("## the shim's reports")
    for r in recs:
        for line in r.get("preload", []):
            print(f"{r['mode']} round {r['round']}: {line}")


if __name__ == "__main__":
    main()
