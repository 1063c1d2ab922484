#!/usr/bin/env python3
"""Replay one allocation trace through one peer allocator and print one JSON line.

    python3 bench/peers/replay_peer.py PEER TRACE [--max-events N] [--no-warm]
    python3 bench/peers/replay_peer.py --build-cxx      # build torch_cxx.cpp only
    python3 bench/peers/replay_peer.py --list           # the peers

Every `a ID SIZE` of the trace becomes one allocation of SIZE bytes and every
`f ID` its free, in file order, on the default stream (jax: XLA's compute
stream), in this one process. The trace is parsed into flat lists before
anything is timed; the timed region is the alloc/free loop alone.

The JSON line (on stdout; everything else goes to stderr) holds:

    peer, trace, events          who, what (name without extensions), how many events
    peak_live_bytes              largest sum of SIZE alive at once over those events
    peak_reserved_bytes          peak device memory the allocator held from the driver
    ratio                        peak_reserved_bytes / peak_live_bytes
    ns_per_op                    timed loop / events, first pass from an empty pool
    ns_per_op_warm               the same trace again in the same process, with the
                                 pool the first pass left (absent where not run)
    passes                       with --passes N (PyTorch peers): {n, peak_reserved_bytes,
                                 peak_live_bytes, ratio, ns_per_op_later} over N passes in
                                 a row from an emptied cache, what the trace never frees
                                 kept live (the time: passes 2..N together)
    empty_loop_ns_per_op         the same Python loop with no allocator in it
    ooms                         requests the peer refused (their frees are skipped)
    peak_reserved_source         how peak_reserved_bytes was read
    truncated, trace_events      when --max-events cut the trace short
    plus peer-specific keys (versions, counters, cross-checks).

On a failure the line is {"peer", "trace", "error"} and the exit status is 1.
See bench/README.md for what each peer measures and why.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import tracefile  # noqa: E402

perf_counter_ns = time.perf_counter_ns

# Environment each peer needs, set BEFORE its framework is imported. A value of
# None removes the variable, so that "as shipped" really is as shipped.
TORCH_ENV_CLEAN = {"PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": None,
                   "PYTORCH_NO_CUDA_MEMORY_CACHING": None}


def _torch_env(conf):
    env = dict(TORCH_ENV_CLEAN)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    return env


JAX_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "XLA_PYTHON_CLIENT_ALLOCATOR": "bfc",
           "JAX_PLATFORMS": "cuda"}


def peer_table():
    """name -> (environment, runner). Runners import their framework lazily."""
    return {
        "torch-native": (_torch_env(None), run_torch),
        "torch-expandable": (_torch_env("expandable_segments:True"), run_torch),
        "torch-async": (_torch_env("backend:cudaMallocAsync"), run_torch),
        "cupy": ({}, run_cupy),
        "jax-bfc": (JAX_ENV, run_jax),
        "torch-native-cxx": (_torch_env(None), run_torch_cxx),
        "torch-expandable-cxx": (_torch_env("expandable_segments:True"), run_torch_cxx),
        "torch-async-cxx": (_torch_env("backend:cudaMallocAsync"), run_torch_cxx),
        # No device at all: the cost of the Python loop, and a peer that runs
        # anywhere (selftest.py drives run_all.sh with it).
        "empty-loop": ({}, run_empty_loop),
    }


def apply_env(env):
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# --------------------------------------------------------------------------
# The loop with no allocator in it: what the Python harness itself costs.

def empty_loop_ns(tr):
    kinds, ids, sizes = tr.kinds, tr.ids, tr.sizes
    live = [None] * tr.n_ids
    gc.disable()
    t0 = perf_counter_ns()
    for k, i, s in zip(kinds, ids, sizes):
        if k:
            live[i] = s
        else:
            live[i] = None
    t1 = perf_counter_ns()
    gc.enable()
    del live
    return t1 - t0


def run_empty_loop(tr, opts, res):
    ns = min(empty_loop_ns(tr) for _ in range(3))
    res.update(peak_reserved_bytes=tr.peak_live_bytes, ns_per_op=ns / max(1, len(tr)),
               ooms=0, peak_reserved_source="none: no device memory; measures the loop alone")


# --------------------------------------------------------------------------
# PyTorch from Python: torch.empty(size, dtype=uint8, device='cuda'), freed by
# dropping the last reference.

def _torch_setup():
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    x = torch.empty(1, dtype=torch.uint8, device=dev)  # context and allocator up
    del x
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    return torch, dev


def _torch_read_peak(torch, dev, res):
    """peak_reserved_bytes from torch.cuda.max_memory_reserved(), cross-checked on
    the cudaMallocAsync backend against the driver's pool high-water mark."""
    torch.cuda.synchronize(dev)
    reserved = torch.cuda.max_memory_reserved(dev)
    stats = torch.cuda.memory_stats(dev)
    backend = torch.cuda.get_allocator_backend()
    res["allocator_backend"] = backend
    res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    res["num_alloc_retries"] = stats.get("num_alloc_retries")
    res["num_device_alloc"] = stats.get("num_device_alloc")
    res["torch_version"] = torch.__version__
    res["device"] = torch.cuda.get_device_name(dev)
    source = "torch.cuda.max_memory_reserved()"
    if backend == "cudaMallocAsync":
        pool = driver_mempool_attrs(0)
        res["driver_pool"] = pool
        high = pool.get("reserved_mem_high") if isinstance(pool, dict) else None
        if not reserved and high:
            reserved = high
            source = "cuMemPoolGetAttribute(RESERVED_MEM_HIGH) on the default pool"
        elif high is not None:
            source += " (= pool RESERVED_MEM_HIGH %s)" % ("agrees" if high == reserved else "differs: %d" % high)
    res["peak_reserved_bytes"] = reserved
    res["peak_reserved_source"] = source


def run_torch(tr, opts, res):
    torch, dev = _torch_setup()
    empty, u8 = torch.empty, torch.uint8
    OOM = torch.cuda.OutOfMemoryError
    kinds, ids, sizes, n_ids = tr.kinds, tr.ids, tr.sizes, tr.n_ids

    trims = tr.trims
    res["trims"] = len(trims)

    def one_pass(kept=None):
        # kept: the requests an earlier pass left live (passes keep what the
        # trace never frees, allocated once, as gpumem replay --passes does).
        live = kept if kept is not None else [None] * n_ids
        keep = kept is not None
        ooms = 0
        gc.disable()
        t0 = perf_counter_ns()
        if not trims:
            for k, i, s in zip(kinds, ids, sizes):
                if k:
                    if keep and live[i] is not None:
                        continue
                    try:
                        live[i] = empty(s, dtype=u8, device=dev)
                    except OOM:
                        ooms += 1
                else:
                    live[i] = None
        else:
            # The program's empty_cache calls where it made them (the
            # trace's "t" lines), as gpumem replay trims there.
            at, next_trim = 0, trims[0]
            for n, (k, i, s) in enumerate(zip(kinds, ids, sizes)):
                while n == next_trim:
                    torch.cuda.empty_cache()
                    at += 1
                    next_trim = trims[at] if at < len(trims) else -1
                if k:
                    if keep and live[i] is not None:
                        continue
                    try:
                        live[i] = empty(s, dtype=u8, device=dev)
                    except OOM:
                        ooms += 1
                else:
                    live[i] = None
        t1 = perf_counter_ns()
        gc.enable()
        return t1 - t0, ooms, live

    ns, ooms, live = one_pass()
    _torch_read_peak(torch, dev, res)
    del live  # requests the trace never freed
    res.update(ns_per_op=ns / max(1, len(tr)), ooms=ooms)
    if opts.warm:
        ns2, _, live = one_pass()
        del live
        res["ns_per_op_warm"] = ns2 / max(1, len(tr))
    if opts.passes > 1:
        state = {"live": None}

        def replay():
            ns, _, state["live"] = one_pass(state["live"])
            return ns
        _torch_passes(torch, dev, tr, opts.passes, replay, res)
        state["live"] = None


def _torch_passes(torch, dev, tr, n, replay, res):
    """res["passes"]: the peak PyTorch reserved over n passes of the trace in a
    row from an emptied cache, and the time per event of passes 2..n (gpumem
    replay --passes N reports the same): a program that runs longer than its
    trace. replay() runs one
    pass and returns its time in ns, keeping what the trace never frees live
    from the pass that allocated it (as gpumem replay --passes since 9480c4a,
    and a real process its workspaces); the ratio is over the most live over
    the passes (tracefile.peak_live_passes). Before, what a pass left live
    was freed before the next."""
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    later = 0
    for i in range(n):
        ns = replay()
        if i > 0:
            later += ns
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_reserved(dev)
    res["passes"] = {"n": n, "peak_reserved_bytes": peak,
                     "peak_live_bytes": tr.peak_live_passes(n),
                     "ratio": peak / tr.peak_live_passes(n) if tr.peak_live_bytes else None,
                     "ns_per_op_later": later / max(1, (n - 1) * len(tr))}


# --------------------------------------------------------------------------
# PyTorch's caching allocator from C++ (torch_cxx.cpp): raw_alloc / raw_delete in
# a C++ loop timed with std::chrono, no Python per operation.

def cxx_build_dir():
    import tempfile
    return os.environ.get("GPUMEM_BENCH_BUILD") or os.path.join(
        tempfile.gettempdir(), "gpumem_bench_torch_cxx")


def load_cxx(verbose=False):
    # cpp_extension runs `ninja` from PATH: make the interpreter's own bin folder
    # (a virtual environment's, where pip put ninja) and the ninja package's visible.
    paths = [os.path.dirname(sys.executable)]
    try:
        import ninja
        paths.append(ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    cur = os.environ.get("PATH", "").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join([p for p in paths if p not in cur] + cur)
    from torch.utils.cpp_extension import load
    build = cxx_build_dir()
    os.makedirs(build, exist_ok=True)
    return load(name="gpumem_bench_torch_cxx",
                sources=[os.path.join(HERE, "torch_cxx.cpp")],
                build_directory=build, extra_cflags=["-O3"], with_cuda=True,
                verbose=verbose)


def run_torch_cxx(tr, opts, res):
    import array
    torch, dev = _torch_setup()
    mod = load_cxx()
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    kinds = array.array("b", tr.kinds)
    ids = array.array("q", tr.ids)
    sizes = array.array("q", tr.sizes)
    n = max(1, len(tr))
    cold, warm = [], []
    for run in range(max(1, opts.repeat)):
        if run > 0:
            # Give every cached segment back so that this run starts cold too
            # (replay() has freed what the trace left live).
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()
        ns, ooms = mod.replay(kinds, ids, sizes, tr.n_ids)
        cold.append(ns / n)
        if run == 0:
            # The ratio is the first pass's, as for every other peer: a
            # warm pass can grow PyTorch's cache further (it does on
            # programs that free at random).
            _torch_read_peak(torch, dev, res)
        if opts.warm:
            ns2, _ = mod.replay(kinds, ids, sizes, tr.n_ids)
            warm.append(ns2 / n)
    torch.cuda.synchronize(dev)
    res["peak_reserved_bytes_all_runs"] = torch.cuda.max_memory_reserved(dev)
    res.update(ns_per_op=statistics.median(cold), ooms=ooms,
               allocator_name=mod.allocator_name())
    if warm:
        res["ns_per_op_warm"] = statistics.median(warm)
    if opts.passes > 1:
        _torch_passes(torch, dev, tr, opts.passes,
                      lambda: mod.replay(kinds, ids, sizes, tr.n_ids)[0], res)
    if len(cold) > 1:
        res["ns_per_op_runs"] = [round(x, 1) for x in cold]
        if warm:
            res["ns_per_op_warm_runs"] = [round(x, 1) for x in warm]
    res["timed_in"] = "C++ (std::chrono::steady_clock around the raw_alloc/raw_delete loop)"


# --------------------------------------------------------------------------
# The driver's view of the stream-ordered pool (cudaMallocAsync backend).

def driver_mempool_attrs(ordinal):
    """RESERVED_MEM_HIGH and friends of the device's default memory pool, read with
    cuMemPoolGetAttribute through ctypes on libcuda (the pool cudaMallocAsync draws
    from, whose high-water mark torch's own stats report on that backend)."""
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int()
        pool = ctypes.c_void_p()
        rc = lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(ordinal))
        if rc:
            return "cuDeviceGet failed: %d" % rc
        rc = lib.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev)
        if rc:
            return "cuDeviceGetDefaultMemPool failed: %d" % rc
        out = {}
        # CUmemPool_attribute: RESERVED_MEM_CURRENT 5, RESERVED_MEM_HIGH 6,
        # USED_MEM_CURRENT 7, USED_MEM_HIGH 8 (same values as cudaMemPoolAttr*).
        for name, attr in (("reserved_mem_current", 5), ("reserved_mem_high", 6),
                           ("used_mem_high", 8)):
            v = ctypes.c_uint64()
            rc = lib.cuMemPoolGetAttribute(pool, ctypes.c_int(attr), ctypes.byref(v))
            if rc:
                return "cuMemPoolGetAttribute(%s) failed: %d" % (name, rc)
            out[name] = v.value
        return out
    except OSError as e:
        return "libcuda: %s" % e


# --------------------------------------------------------------------------
# CuPy: the default cupy.cuda.MemoryPool, pool.malloc(size) -> MemoryPointer,
# freed by dropping it.

def run_cupy(tr, opts, res):
    import cupy
    cupy.cuda.Device(0).use()
    pool = cupy.get_default_memory_pool()
    malloc, total = pool.malloc, pool.total_bytes
    OOM = cupy.cuda.memory.OutOfMemoryError
    p = malloc(512)
    del p
    pool.free_all_blocks()
    kinds, ids, sizes, n_ids = tr.kinds, tr.ids, tr.sizes, tr.n_ids

    def timed_pass():
        live = [None] * n_ids
        ooms = 0
        gc.disable()
        t0 = perf_counter_ns()
        for k, i, s in zip(kinds, ids, sizes):
            if k:
                try:
                    live[i] = malloc(s)
                except OOM:
                    ooms += 1
            else:
                live[i] = None
        t1 = perf_counter_ns()
        gc.enable()
        return t1 - t0, ooms, live

    def peak_pass():
        # Same replay, reading pool.total_bytes() after every allocation. Not
        # timed: the sampling would add its own cost to every operation.
        live = [None] * n_ids
        peak = 0
        gc.disable()
        for k, i, s in zip(kinds, ids, sizes):
            if k:
                try:
                    live[i] = malloc(s)
                except OOM:
                    continue
                t = total()
                if t > peak:
                    peak = t
            else:
                live[i] = None
        gc.enable()
        return peak, live

    # Pass 1, timed, from an empty pool.
    ns, ooms, live = timed_pass()
    held_after_timed = total()
    del live
    pool.free_all_blocks()
    # Pass 2, peak, from an empty pool again.
    peak, live = peak_pass()
    del live
    res.update(peak_reserved_bytes=peak, ns_per_op=ns / max(1, len(tr)), ooms=ooms,
               peak_reserved_source="max of pool.total_bytes() after every allocation, "
                                    "in a second untimed pass from an empty pool",
               held_at_end_of_timed_pass=held_after_timed,
               cupy_version=cupy.__version__)
    # CuPy's pool gives nothing back to the driver during a pass (only on OOM
    # or free_all_blocks), so what the timed pass holds at its end is that pass's
    # own peak. It can differ from the sampled pass's: CuPy keeps free chunks in
    # Python sets and pops whichever the hash order yields, so two passes over the
    # same trace may choose differently (seen: up to 5% on gpt2_generate).
    if opts.warm:
        ns2, _, live = timed_pass()  # pool still holds what pass 2 left
        del live
        res["ns_per_op_warm"] = ns2 / max(1, len(tr))


# --------------------------------------------------------------------------
# JAX: XLA's BFC allocator in growth mode. One compiled executable per distinct
# size (rounded up to BFC's 256-byte granule, which BFC itself rounds to, so its
# decisions are unchanged), all compiled before the timed loop; each allocation
# runs the executable for its size (a uint8 zeros array of that size), each free
# calls .delete() on the array.

BFC_GRANULE = 256


def _is_oom(e):
    m = str(e)
    return "RESOURCE_EXHAUSTED" in m or "out of memory" in m.lower()


def run_jax(tr, opts, res):
    import jax
    import jax.numpy as jnp
    from concurrent.futures import ThreadPoolExecutor

    dev = jax.devices()[0]
    if dev.platform != "gpu":
        raise RuntimeError("jax device is %r, not a GPU" % dev)
    kinds, ids, sizes, n_ids = tr.kinds, tr.ids, tr.sizes, tr.n_ids

    t_prep = time.perf_counter()
    rounded = sorted({(s + BFC_GRANULE - 1) // BFC_GRANULE * BFC_GRANULE
                      for k, s in zip(kinds, sizes) if k and s > 0})

    def make(n):
        return jax.jit(lambda: jnp.zeros((n,), jnp.uint8))

    mode = getattr(opts, "jax_compile", "ahead")
    if mode == "lazy":
        # jax.jit objects, each compiled by its first call inside the loop.
        compiled = {n: make(n) for n in rounded}
        res["jax_compile"] = mode
    elif mode == "eager":
        # jnp.zeros called op by op: JAX's own per-shape cache, filled in the loop.
        compiled = {n: (lambda n=n: jnp.zeros((n,), jnp.uint8)) for n in rounded}
        res["jax_compile"] = mode
    else:
        lowered = {n: make(n).lower() for n in rounded}
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as ex:
            compiled = dict(zip(rounded, ex.map(lambda n: lowered[n].compile(), rounded)))
        del lowered

    def zero_size():
        return None  # a 0-byte request: XLA would hold no device memory for it

    fns = []
    for k, s in zip(kinds, sizes):
        if not k:
            fns.append(None)
        elif s == 0:
            fns.append(zero_size)
        else:
            fns.append(compiled[(s + BFC_GRANULE - 1) // BFC_GRANULE * BFC_GRANULE])
    # Warm the dispatch path with the smallest size (256 bytes of BFC's first region).
    if rounded:
        w = compiled[rounded[0]]()
        w.block_until_ready()
        w.delete()
    res["prep_s"] = round(time.perf_counter() - t_prep, 3)
    res["executables"] = len(compiled)

    live = [None] * n_ids
    ooms = 0
    gc.disable()
    t0 = perf_counter_ns()
    for k, i, f in zip(kinds, ids, fns):
        if k:
            try:
                live[i] = f()
            except Exception as e:  # noqa: BLE001 (XlaRuntimeError/JaxRuntimeError)
                if not _is_oom(e):
                    raise
                ooms += 1
        else:
            a = live[i]
            if a is not None:
                a.delete()
                live[i] = None
    for a in live:
        if a is not None:
            a.block_until_ready()
    t1 = perf_counter_ns()
    gc.enable()

    stats = dev.memory_stats() or {}
    if "peak_pool_bytes" in stats:
        peak, source = stats["peak_pool_bytes"], "memory_stats()['peak_pool_bytes']"
    else:
        peak = stats.get("peak_bytes_in_use")
        source = "memory_stats()['peak_bytes_in_use'] (no peak_pool_bytes: NOT the pool)"
    for a in live:
        if a is not None:
            a.delete()
    del live
    res.update(peak_reserved_bytes=peak, peak_reserved_source=source,
               ns_per_op=(t1 - t0) / max(1, len(tr)), ooms=ooms,
               jax_version=jax.__version__, device=getattr(dev, "device_kind", str(dev)),
               bfc_stats={k: stats.get(k) for k in ("peak_bytes_in_use", "pool_bytes",
                                                     "bytes_limit", "num_allocs",
                                                     "largest_alloc_size")})
    # No warm pass: at 20-70 us/op it would double the longest runs of the suite.


# --------------------------------------------------------------------------

def emit(out, obj):
    out.write(json.dumps(obj, sort_keys=False) + "\n")
    out.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peer", nargs="?")
    ap.add_argument("trace", nargs="?")
    ap.add_argument("--max-events", type=int, default=0,
                    help="replay only the first N events (row marked truncated)")
    ap.add_argument("--no-warm", dest="warm", action="store_false",
                    help="skip the second (warm) timed pass")
    ap.add_argument("--repeat", type=int, default=1,
                    help="C++ peers: replay N times, each from an emptied cache, and "
                         "report the median times (every run's in ns_per_op_runs)")
    ap.add_argument("--passes", type=int, default=1,
                    help="PyTorch peers: also replay N passes in a row from an emptied "
                         "cache and report their peak (key passes), as gpumem replay --passes")
    ap.add_argument("--jax-compile", choices=("ahead", "lazy", "eager"), default="ahead",
                    help="jax-bfc: compile every size's executable before the timed loop "
                         "(ahead, the default) or at its first use inside it (lazy: XLA's "
                         "compiler then takes device memory amid the trace's allocations), or "
                         "call jnp.zeros op by op (eager)")
    ap.add_argument("--build-cxx", action="store_true",
                    help="build torch_cxx.cpp with torch.utils.cpp_extension and exit")
    ap.add_argument("--list", action="store_true", help="print the peer names")
    opts = ap.parse_args(argv)

    # Keep stdout for the one JSON line: whatever a library prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    peers = peer_table()
    if opts.list:
        emit(out, {"peers": list(peers)})
        return 0
    if opts.build_cxx:
        apply_env(_torch_env(None))
        t = time.perf_counter()
        try:
            # Quiet: a successful build's compiler lines name the GPU
            # machine's paths; a failed build raises with the compiler's
            # output, which the traceback below prints.
            load_cxx(verbose=False)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            emit(out, {"build": "torch_cxx", "error": "%s: %s" % (type(e).__name__, e)})
            return 1
        emit(out, {"build": "torch_cxx", "build_s": round(time.perf_counter() - t, 1),
                   "dir": cxx_build_dir()})
        return 0
    if not opts.peer or not opts.trace:
        ap.error("PEER and TRACE are required")

    name = tracefile.trace_name(opts.trace)
    res = {"peer": opts.peer, "trace": name}
    if opts.peer not in peers:
        res["error"] = "unknown peer %r (known: %s)" % (opts.peer, ", ".join(peers))
        emit(out, res)
        return 1
    env, runner = peers[opts.peer]
    apply_env(env)
    t_start = time.perf_counter()
    try:
        full = tracefile.load(opts.trace)
        tr = full.truncated(opts.max_events)
        res.update(events=len(tr), allocations=tr.allocations,
                   peak_live_bytes=tr.peak_live_bytes)
        if len(tr) < len(full):
            res.update(truncated=True, trace_events=len(full),
                       trace_peak_live_bytes=full.peak_live_bytes)
        if len(full.streams) > 1:
            res["trace_streams"] = len(full.streams)  # all replayed on one stream
        del full
        res["empty_loop_ns_per_op"] = round(empty_loop_ns(tr) / max(1, len(tr)), 1)
        runner(tr, opts, res)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        res["error"] = "%s: %s" % (type(e).__name__, str(e)[:500])
        emit(out, res)
        return 1
    live, held = res.get("peak_live_bytes"), res.get("peak_reserved_bytes")
    res["ratio"] = round(held / live, 4) if live and held is not None else None
    if live and res.get("held_at_end_of_timed_pass") is not None:  # cupy: see run_cupy
        res["ratio_timed_pass"] = round(res["held_at_end_of_timed_pass"] / live, 4)
    for k in ("ns_per_op", "ns_per_op_warm"):
        if k in res:
            res[k] = round(res[k], 1)
    res["wall_s"] = round(time.perf_counter() - t_start, 2)
    # Put the keys every consumer reads first.
    head = ["peer", "trace", "events", "peak_live_bytes", "peak_reserved_bytes", "ratio",
            "ns_per_op", "ooms"]
    emit(out, {**{k: res[k] for k in head if k in res},
               **{k: v for k, v in res.items() if k not in head}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
