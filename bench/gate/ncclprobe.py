"""ncclprobe.py: the launch gate beside NCCL (torchrun, two ranks or more).
Run under `gpumem run` with GPUMEM_PRELOAD_REPORT=1: all-reduces and a
broadcast, checked; each rank prints one JSON line with the gated calls
made over them. The shim's report at exit says whether moves stayed gated
(NCCL's lookups and registrations classified) or why they are off."""
import ctypes
import json
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    gated = ctypes.CDLL(None).gpumem_preload_gated_calls
    gated.restype = ctypes.c_ulong
    x = torch.ones(1 << 22, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    g0 = gated()
    ok = True
    for i in range(20):
        y = torch.full((1 << 22,), float(rank + i), device="cuda")
        dist.all_reduce(y)
        ok &= bool((y == float(sum(r + i for r in range(world)))).all())
    z = torch.full((1 << 20,), float(rank), device="cuda")
    dist.broadcast(z, 0)
    ok &= bool((z == 0).all())
    torch.cuda.synchronize()
    print(json.dumps({"rank": rank, "gated": gated() - g0, "correct": ok,
                      "backend": torch.cuda.memory.get_allocator_backend()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
