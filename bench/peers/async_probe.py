"""What CUDA's stream-ordered pool does, event by event, on a trace.

    python3 bench/peers/async_probe.py OUTDIR TRACE [TRACE...] [--passes N] [--after-free sync|query]

Replays each trace (bench/peers/tracefile.py) on the device's default memory
pool through the driver API, as PyTorch's backend:cudaMallocAsync uses it
(c10/cuda/CUDAMallocAsyncAllocator.cpp): the release threshold is UINT64_MAX,
the reuse flags keep their defaults (on), every request of SIZE bytes is
cuMemAllocAsync(SIZE) on the legacy default stream and every free is
cuMemFreeAsync on it. After every event it reads the pool's
RESERVED_MEM_CURRENT and USED_MEM_CURRENT. The pool's internals are not
public; this is the data the cuda-async emulation (policy/cuda_async.go) is
fitted to and checked against.

--after-free sync synchronizes the context after every free, and
--after-free query asks cuStreamQuery of the default stream after every free
(the host learns what completed without waiting): with them the pool sees
each free as completed, not pending, when the next request comes; the pool
treats the two differently (docs/EXPERIMENTS.md, "cuda-async, second round").

Writes OUTDIR/NAME.npz per trace, one row per event and pass:
    kind      1 allocation, 0 free
    size      the request (0 for a free)
    addr      the address the pool gave (the freed address for a free)
    reserved  RESERVED_MEM_CURRENT after the event
    used      USED_MEM_CURRENT after the event
    pass_     which pass (0-based); leftovers are freed between passes
and prints one JSON line per trace and pass: peak live, peak reserved, ratio.
Needs libcuda.so.1 and numpy; no PyTorch.
"""

import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tracefile  # noqa: E402

ATTR_RELEASE_THRESHOLD = 4
ATTR_RESERVED_MEM_CURRENT = 5
ATTR_RESERVED_MEM_HIGH = 6
ATTR_USED_MEM_CURRENT = 7


class Driver:
    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.check("cuInit", self.cu.cuInit(0))
        dev = ctypes.c_int()
        self.check("cuDeviceGet", self.cu.cuDeviceGet(ctypes.byref(dev), 0))
        ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self.check("cuCtxSetCurrent", self.cu.cuCtxSetCurrent(ctx))
        self.pool = ctypes.c_void_p()
        self.check("cuDeviceGetDefaultMemPool", self.cu.cuDeviceGetDefaultMemPool(ctypes.byref(self.pool), dev))
        high = ctypes.c_uint64(2**64 - 1)
        self.check("cuMemPoolSetAttribute", self.cu.cuMemPoolSetAttribute(self.pool, ATTR_RELEASE_THRESHOLD, ctypes.byref(high)))
        self.alloc = self.cu.cuMemAllocAsync
        self.alloc.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_void_p]
        self.free = self.cu.cuMemFreeAsync
        self.free.argtypes = [ctypes.c_uint64, ctypes.c_void_p]
        self.getattr = self.cu.cuMemPoolGetAttribute
        self.getattr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.sync = self.cu.cuCtxSynchronize
        self.query = self.cu.cuStreamQuery
        self.query.argtypes = [ctypes.c_void_p]

    @staticmethod
    def check(what, rc):
        if rc != 0:
            raise RuntimeError("%s: CUresult %d" % (what, rc))

    def trim(self):
        self.check("cuCtxSynchronize", self.sync())
        self.check("cuMemPoolTrimTo", self.cu.cuMemPoolTrimTo(self.pool, ctypes.c_size_t(0)))
        zero = ctypes.c_uint64(0)
        self.check("reset high", self.cu.cuMemPoolSetAttribute(self.pool, ATTR_RESERVED_MEM_HIGH, ctypes.byref(zero)))


def replay(drv, tr, passes, after_free=None):
    import numpy as np

    n = len(tr) * passes
    kind = np.zeros(n, np.uint8)
    size = np.zeros(n, np.uint64)
    addr = np.zeros(n, np.uint64)
    reserved = np.zeros(n, np.uint64)
    used = np.zeros(n, np.uint64)
    pass_ = np.zeros(n, np.uint16)
    ptr = ctypes.c_uint64()
    val = ctypes.c_uint64()
    vp = ctypes.byref(val)
    alloc, free, getattr_, pool = drv.alloc, drv.free, drv.getattr, drv.pool
    summaries = []
    k = 0
    for p in range(passes):
        live = {}
        peak_res = 0
        t0 = time.perf_counter()
        for kd, i, sz in zip(tr.kinds, tr.ids, tr.sizes):
            if kd:
                if sz == 0:
                    continue
                rc = alloc(ctypes.byref(ptr), sz, None)
                if rc != 0:
                    raise RuntimeError("%s pass %d: cuMemAllocAsync(%d): CUresult %d" % (tr.name, p, sz, rc))
                live[i] = ptr.value
                a = ptr.value
            else:
                a = live.pop(i, None)
                if a is None:
                    continue
                rc = free(a, None)
                if rc != 0:
                    raise RuntimeError("%s pass %d: cuMemFreeAsync: CUresult %d" % (tr.name, p, rc))
                if after_free == "sync":
                    drv.check("cuCtxSynchronize", drv.sync())
                elif after_free == "query":
                    drv.query(None)  # CUDA_SUCCESS or CUDA_ERROR_NOT_READY, both fine
            kind[k], size[k], addr[k], pass_[k] = kd, sz, a, p
            getattr_(pool, ATTR_RESERVED_MEM_CURRENT, vp)
            reserved[k] = val.value
            if val.value > peak_res:
                peak_res = val.value
            getattr_(pool, ATTR_USED_MEM_CURRENT, vp)
            used[k] = val.value
            k += 1
        for a in live.values():
            free(a, None)
        drv.check("cuCtxSynchronize", drv.sync())
        getattr_(pool, ATTR_RESERVED_MEM_HIGH, vp)
        summaries.append({"trace": tr.name, "pass": p, "peak_live_bytes": tr.peak_live_bytes,
                          "peak_reserved_bytes": peak_res, "reserved_high": val.value,
                          "ratio": round(peak_res / tr.peak_live_bytes, 4),
                          "seconds": round(time.perf_counter() - t0, 2)})
    return summaries, dict(kind=kind[:k], size=size[:k], addr=addr[:k], reserved=reserved[:k],
                           used=used[:k], pass_=pass_[:k])


def main(argv):
    import numpy as np

    passes = 1
    if "--passes" in argv:
        j = argv.index("--passes")
        passes = int(argv[j + 1])
        del argv[j:j + 2]
    after_free = None
    if "--after-free" in argv:
        j = argv.index("--after-free")
        after_free = argv[j + 1]
        if after_free not in ("sync", "query"):
            print("--after-free: want sync or query, not %r" % after_free, file=sys.stderr)
            return 2
        del argv[j:j + 2]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, paths = argv[0], argv[1:]
    os.makedirs(out, exist_ok=True)
    drv = Driver()
    for path in paths:
        tr = tracefile.load(path)
        drv.trim()  # each trace starts on an empty pool, as in its own process
        summaries, arrays = replay(drv, tr, passes, after_free)
        np.savez_compressed(os.path.join(out, tr.name + ".npz"), **arrays)
        for s in summaries:
            if after_free:
                s["after_free"] = after_free
            print(json.dumps(s), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
