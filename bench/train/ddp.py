"""ddp.py ALLOCATOR [--fsdp] [--steps N] [--out FILE] [--record DIR]: a
GPT-2 trained data parallel under torch.distributed (NCCL), one process
per GPU, under one allocator (native, expandable or gpumem). Launch with

    python3 -m torch.distributed.run --nproc_per_node 4 bench/train/ddp.py gpumem --out ddp.jsonl

--fake-world N runs it without torchrun, one process on one GPU as rank 0
of N under PyTorch's fake process group: no communication, but FSDP's
streams, copies and the memory they hand to each other, as on N GPUs.

Without --fsdp: GPT-2 small (124M parameters) under DistributedDataParallel
(program "gpt2_ddp"). With --fsdp: a 0.76B-parameter GPT-2 (1536 wide, 24
layers) sharded by FSDP2 (fully_shard on each block, then on the whole
model; program "gpt_fsdp"), whose all-gathers and reduce-scatters run on
streams of their own and hand memory to the compute stream. --record DIR
(gpumem only) records each rank's allocations into DIR/RANK.trace.gz, for
gpumem replay.

Each rank appends one JSON line: its process's NVML peak (polled from
another process), its allocator's peak reserved, its step times (median
after warm-up) and its losses; per step also the host's time to enqueue it
and the process's CPU time (host_ms, cpu_ms), the CPU time the hypervisor
took from the host's vCPUs (steal_ms, /proc/stat) and the process's
involuntary context switches (nivcsw), and under gpumem its driver work. Sequence lengths vary per step (64..1024,
the same on every rank, so that the ranks stay in step); tokens differ by
rank."""

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from run import emit  # noqa: E402


def host_steal_ms():
    """The host's stolen CPU time so far, all CPUs summed, in ms (/proc/stat's
    eighth field of the cpu line); 0 where there is none to read."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) * 1000.0 / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("allocator", choices=["native", "expandable", "gpumem"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out")
    ap.add_argument("--tag", default="")
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--record", metavar="DIR")
    ap.add_argument("--fake-world", type=int, default=0, metavar="N",
                    help="no torchrun: one process on one GPU as rank 0 of N, under PyTorch's fake process "
                         "group (collectives do nothing; FSDP's streams, copies and memory handoffs run): "
                         "the streams of N ranks on one GPU, the losses meaningless")
    args = ap.parse_args()
    if args.fake_world:
        rank, local, world = 0, 0, args.fake_world
    else:
        rank, local, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    import torch.distributed as dist
    if args.allocator == "gpumem":  # before set_device, which initializes the allocator
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gpumem.torch
        gpumem.torch.use()
    torch.cuda.set_device(local)
    recording = None
    if args.record:  # of this rank's device, set above
        if args.allocator != "gpumem":
            ap.error("--record needs the gpumem allocator")
        os.makedirs(args.record, exist_ok=True)
        recording = gpumem.torch.record(os.path.join(args.record, "%d.trace.gz" % rank), device=local)
        recording.__enter__()
    from transformers import GPT2Config, GPT2LMHeadModel

    if args.fake_world:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 (registers the "fake" backend)
        dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=world)
    else:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.zeros(1, device="cuda")
    pid = os.getpid()
    watch = subprocess.Popen([sys.executable, os.path.join(HERE, "nvmlwatch.py"), str(pid)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert watch.stdout.readline().strip() == "ready"

    torch.manual_seed(0)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        program = "gpt_fsdp"
        model = GPT2LMHeadModel(GPT2Config(n_embd=1536, n_layer=24, n_head=16)).cuda()
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    else:
        program = "gpt2_ddp"
        model = GPT2LMHeadModel(GPT2Config()).cuda()
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lo = 256 if args.fsdp else 64
    lengths = random.Random(program).choices(range(lo, 1025), k=args.steps)
    g = torch.Generator(device="cuda").manual_seed(rank)
    times, losses = [], []
    # Per step, the host's time to enqueue it (up to the synchronize) and
    # the process's CPU time: a step whose enqueue takes as long as the
    # step is host-bound, one far shorter waits for the GPU.
    host_ms, cpu_ms = [], []
    # And the machine's part: the CPU time the hypervisor took from this
    # host's vCPUs during the step (/proc/stat's steal, all CPUs summed),
    # and how often this process was switched out involuntarily: a step
    # slow for the host's sake, not the allocator's, shows there.
    steal_ms, nivcsw = [], []
    # gpumem's driver work per step (creates, fences, stream waits,
    # releases, and the host time of its driver calls and of its waits for
    # the GPU), to tell growth steps and host waits from the rest.
    per_step = {"Creates": [], "Fences": [], "Orders": [], "Releases": [], "Maps": [], "Unmaps": [], "SetAccess": [],
                "DriverNanos": [], "WaitNanos": [], "Misses": [], "MissNanos": [],
                "CreateNanos": [], "MapNanos": [], "SetAccessNanos": [], "UnmapNanos": [], "ReleaseNanos": [],
                "EventCalls": [], "EventNanos": [], "MarkCalls": [], "MarkNanos": []}
    counts = (lambda: gpumem.library().stats_json(local)) if args.allocator == "gpumem" else None
    if counts:
        import json
        before = json.loads(counts())
    for n in lengths:
        t0, c0 = time.perf_counter(), time.process_time()
        s0, v0 = host_steal_ms(), resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        x = torch.randint(0, 50257, (8, n), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        host_ms.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        cpu_ms.append((time.process_time() - c0) * 1e3)
        steal_ms.append(host_steal_ms() - s0)
        nivcsw.append(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - v0)
        losses.append(float(loss.detach()))
        if counts:
            now = json.loads(counts())
            for k in per_step:
                per_step[k].append(now.get(k, 0) - before.get(k, 0))
            before = now
    if args.allocator == "gpumem":
        st = gpumem.torch.stats()
        peak_reserved = st["peak_reserved"]
    else:
        peak_reserved = torch.cuda.max_memory_reserved()
    watch.stdin.close()
    nvml_peak = int(watch.stdout.readline())
    watch.wait()
    warm = max(2, args.steps // 5)
    if recording is not None:
        recording.__exit__(None, None, None)
    if args.fake_world:
        program += "_fake%d" % world
    rec = {"program": program, "allocator": args.allocator, "tag": args.tag, "rank": rank, "world": world,
           "steps": args.steps, "nvml_peak_bytes": nvml_peak, "peak_reserved_bytes": peak_reserved,
           "median_step_ms": statistics.median(times[warm:]), "step_ms": times, "host_ms": host_ms,
           "cpu_ms": cpu_ms, "steal_ms": steal_ms, "nivcsw": nivcsw, "losses": losses,
           "lengths": lengths, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.allocator == "gpumem":
        import json
        rec["gpumem_stats"] = json.loads(gpumem.library().stats_json(local))
        rec["gpumem_per_step"] = per_step
    dist.barrier()
    dist.destroy_process_group()
    emit(rec, args.out)


if __name__ == "__main__":
    main()
