"""probe.py: does the launch gate see every launch of a PyTorch program?

Run under `gpumem run` with GPUMEM_PRELOAD_REPORT=1 (the shim counts the
calls through its gate). Launches elementwise kernels, cuBLAS matmuls,
Triton kernels (torch.compile) and copies, and compares the calls that
passed the gate with the kernels and copies CUPTI saw (torch.profiler) over
the same region. Prints one JSON line: gated calls, profiler's kernels and
copies/sets, and whether every one was seen (gated >= kernels + copies).
"""
import ctypes
import json

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    shim = ctypes.CDLL(None)
    gated = shim.gpumem_preload_gated_calls
    gated.restype = ctypes.c_ulong
    x = torch.ones(1 << 20, device="cuda")
    y = torch.randn(512, 512, device="cuda")
    f = torch.compile(lambda a: (a * 2 + 1).relu().sum())
    f(x)
    h = torch.ones(1 << 16)
    torch.cuda.synchronize()
    g0 = gated()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(500):
            x.add_(1)
        for _ in range(100):
            y = y @ y
            y = y / y.norm()
        for _ in range(100):
            f(x)
        for _ in range(50):
            x[: 1 << 16].copy_(h, non_blocking=False)
            x.zero_()
        torch.cuda.synchronize()
    g1 = gated()
    kernels = copies = 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        n = e.name.lower()
        if "memcpy" in n or "memset" in n:
            copies += 1
        else:
            kernels += 1
    print(json.dumps({"gated": g1 - g0, "kernels": kernels, "copies_sets": copies,
                      "all_seen": g1 - g0 >= kernels + copies,
                      "backend": torch.cuda.memory.get_allocator_backend()}))


if __name__ == "__main__":
    main()
