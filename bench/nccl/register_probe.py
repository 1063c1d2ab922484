"""register_probe.py native|gpumem: NCCL's user-buffer registration
(issue 42 item 2) on one GPU, world size 1: a MemPool of NCCL's allocator
(backend.mem_allocator), registered with backend.register_mem_pool, an
all_reduce on a tensor from it, then deregistered; and the same with a
MemPool of the current allocator. Prints one line per step: ok with the
data check, or the exception's type and first line, and how long it took
(a hang is the worst outcome: each step runs under a watchdog)."""

import os
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

mode = sys.argv[1]
if mode == "gpumem":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import gpumem.torch
    gpumem.torch.use()

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29631")
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
backend = dist.group.WORLD._get_backend(dev)


def watchdog(seconds):
    done = threading.Event()

    def bite():
        if not done.wait(seconds):
            print(f"HANG: step still running after {seconds} s", flush=True)
            os._exit(3)
    threading.Thread(target=bite, daemon=True).start()
    return done


def step(name, fn):
    t0 = time.time()
    done = watchdog(60)
    try:
        res = fn()
        print(f"{mode} {name}: ok {res} ({time.time() - t0:.2f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 - the probe reports whatever is raised
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"{mode} {name}: {type(e).__name__}: {first} ({time.time() - t0:.2f} s)", flush=True)
        if os.environ.get("PROBE_TRACE"):
            traceback.print_exc()
    finally:
        done.set()


def reduce_in(pool):
    with torch.cuda.use_mem_pool(pool):
        t = torch.arange(1 << 20, device=dev, dtype=torch.float32)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    want = torch.arange(1 << 20, device=dev, dtype=torch.float32)
    return f"sum equal: {bool(torch.equal(t, want))}"


state = {}


def nccl_pool():
    state["nccl"] = torch.cuda.MemPool(backend.mem_allocator)
    return "made"


def register(key):
    def fn():
        backend.register_mem_pool(state[key])
        return "registered"
    return fn


def deregister(key):
    def fn():
        backend.deregister_mem_pool(state[key])
        return "deregistered"
    return fn


def own_pool():
    state["own"] = torch.cuda.MemPool()
    return "made"


step("MemPool(backend.mem_allocator)", nccl_pool)
if "nccl" in state:
    step("register_mem_pool(nccl pool)", register("nccl"))
    step("all_reduce in nccl pool", lambda: reduce_in(state["nccl"]))
    step("deregister_mem_pool(nccl pool)", deregister("nccl"))
step("MemPool()", own_pool)
if "own" in state:
    step("register_mem_pool(own pool)", register("own"))
    step("all_reduce in own pool", lambda: reduce_in(state["own"]))
    step("deregister_mem_pool(own pool)", deregister("own"))
t = torch.ones(1 << 20, device=dev)
step("plain all_reduce", lambda: (dist.all_reduce(t), torch.cuda.synchronize(), f"ok: {float(t.sum())}")[-1])
dist.destroy_process_group()
print(f"{mode} done", flush=True)
