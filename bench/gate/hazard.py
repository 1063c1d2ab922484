"""hazard.py: the launch gate's hazard test (issue 41), on a GPU.

Worker threads, each on a CUDA stream of its own, read-modify-write live
tensors over and over (x.add_(1)), while the main thread asks for a tensor
that fits under the limit only once gpumem moves live chunks out of sparse
spans (a gather). A move copies a chunk to new memory and maps that at the
same address: a kernel launched meanwhile on the old memory loses its
writes, with no error. Each round strands the workers' tensors first (each
2 MiB tensor alone in a 16 MiB span, the rest freed), so that the gather
moves exactly the memory the workers are writing. At the end of a round
every element of every tensor is checked against the adds made to it.

    gpumem run --config limit=1600MiB,span_size=16MiB -- python3 hazard.py
        the gate (gpumem run's shim sees every launch): no tensor may be wrong
    python3 hazard.py --use --config limit=1600MiB,span_size=16MiB,gather=true
        gpumem.torch.use() with gather=true and no shim: the same moves with
        no gate, to show what the gate prevents

Prints one JSON line: rounds, tensors checked, wrong tensors (and wrong
elements), splits and gate refusals from gpumem's stats, requests served.
"""
import argparse
import json
import os
import sys
import threading

import torch

MIB = 1 << 20


def worker(tensors, adds, stream, stop, started):
    with torch.cuda.stream(stream):
        started.set()
        while not stop.is_set():
            for i, t in enumerate(tensors):
                t.add_(1)
                adds[i] += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--use", action="store_true", help="gpumem.torch.use() in the program (no shim)")
    ap.add_argument("--config", default="", help="GPUMEM_CONFIG for --use")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--per-worker", type=int, default=25)
    ap.add_argument("--big-mib", type=int, default=1000)
    ap.add_argument("--quiet", action="store_true",
                    help="the workers start after the big request: the moves alone, no launch beside them")
    args = ap.parse_args()
    if args.use:
        os.environ["GPUMEM_CONFIG"] = args.config
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "python"))
        import gpumem.torch
        gpumem.torch.use()
    import gpumem
    torch.cuda.init()
    dev = torch.device("cuda")
    n = 2 * MIB // 4  # floats in a 2 MiB tensor
    wrong = wrong_elems = checked = served = 0
    for _ in range(args.rounds):
        # Strand: each worker tensor alone in its span, beside freed filler.
        groups, filler = [], []
        for w in range(args.workers):
            ts = []
            for i in range(args.per_worker):
                ts.append(torch.full((n,), float(i), device=dev))
                filler += [torch.empty(2 * MIB, dtype=torch.uint8, device=dev) for _ in range(7)]
            groups.append(ts)
        del filler  # all at once: freed one by one, the next tensor would reuse it
        torch.cuda.synchronize()
        stop = threading.Event()
        threads, adds, starts = [], [], []

        def request():
            nonlocal served
            try:
                big = torch.empty(args.big_mib * MIB, dtype=torch.uint8, device=dev)
                big.fill_(1)
                served += 1
                del big
            except torch.cuda.OutOfMemoryError as e:
                print(f"hazard: out of memory: {str(e).splitlines()[0][:300]}", file=sys.stderr)

        import gpumem as gm
        shape = gm.stats(0)
        print(f"hazard: stranded: reserved {shape['reserved'] >> 20} MiB, active {shape['active'] >> 20} MiB, "
              f"limit {shape['limit'] >> 20} MiB", file=sys.stderr)
        if args.quiet:
            request()
        for w in range(args.workers):
            a = [0] * args.per_worker
            s = torch.cuda.Stream()
            st = threading.Event()
            th = threading.Thread(target=worker, args=(groups[w], a, s, stop, st))
            th.start()
            threads.append(th)
            adds.append(a)
            starts.append(st)
        for st in starts:
            st.wait()
        if not args.quiet:
            request()
        stop.set()
        for th in threads:
            th.join()
        torch.cuda.synchronize()
        for w in range(args.workers):
            for i, t in enumerate(groups[w]):
                bad = int((t != float(i + adds[w][i])).sum())
                checked += 1
                if bad:
                    wrong += 1
                    wrong_elems += bad
        del groups
        torch.cuda.synchronize()
    st = gpumem.stats(0) if hasattr(gpumem, "stats") else {}
    print(json.dumps({"rounds": args.rounds, "tensors": checked, "wrong": wrong, "wrong_elements": wrong_elems,
                      "served": served, "splits": st.get("splits"), "gate_refusals": st.get("gate_refusals"),
                      "backend": torch.cuda.memory.get_allocator_backend()}))


if __name__ == "__main__":
    main()
