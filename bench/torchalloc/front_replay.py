"""front_replay.py TRACE...: replays allocation traces through the C
library's own entry points (gpumem_alloc and gpumem_free, PyTorch's), on
the device GPUMEM_CONFIG names (the simulated one by default), with the
front cache (clib/front.c) on and then off (GPUMEM_FRONT=0), each in a
process of its own, and prints per trace: the share of requests the front
served without entering Go, and the peaks of active and requested bytes
and of reserved memory of both runs. The two peaks of the program must be
equal; reserved may differ, the front having changed where Go placed
things. No timing: the trace's gaps are not waited, and no stream ever
waits for another, so the reserved figures of traces with several streams
model nothing real (prefetch_two_stream: 19 GB without the front for
4.1 GB live; `gpumem replay`, which keeps the trace's time, holds 4.1).

    PYTHONPATH=python python3 bench/torchalloc/front_replay.py testdata/traces/*.trace.gz

(docs/EXPERIMENTS.md, "A front cache on the C side of the library".)"""

import gzip
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def replay(path):
    """In this process: the trace through the library; returns its stats."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import gpumem
    lib = gpumem.library()
    c = lib.c
    live = {}
    with gzip.open(path, "rt") as f:
        for n, line in enumerate(f, 1):
            p = line.split()
            if not p or p[0] not in ("a", "f", "t"):
                continue
            if p[0] == "t":  # the program's empty_cache
                lib.trim(0)
            elif p[0] == "a":
                size, stream = int(p[2]), int(p[3])
                ptr = c.gpumem_alloc(size, 0, stream)
                if not ptr:
                    sys.exit(f"{path}:{n}: gpumem_alloc({size}) failed: {lib.last_error()}")
                live[p[1]] = (ptr, size, stream)
            elif p[1] in live:
                ptr, size, stream = live.pop(p[1])
                c.gpumem_free(ptr, size, 0, stream)
    return lib.stats(0).as_dict()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(replay(sys.argv[2])))
        return
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(f"{'trace':26s} {'served':>7s} {'peak active':>14s} {'peak requested':>15s} {'reserved on':>13s} {'reserved off':>13s}")
    for path in sys.argv[1:]:
        runs = {}
        for front in ("1", "0"):
            env = dict(os.environ, GPUMEM_FRONT=front)
            env.setdefault("GPUMEM_CONFIG", "device=sim,capacity=80GiB")
            out = subprocess.run([sys.executable, __file__, "--one", path], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{path}: {out.stderr.strip()}")
            runs[front] = json.loads(out.stdout)
        on, off = runs["1"], runs["0"]
        same = on["peak_active"] == off["peak_active"] and on["peak_allocated"] == off["peak_allocated"]
        name = os.path.basename(path).split(".")[0]
        print(f"{name:26s} {on['reused'] / max(on['allocs'], 1):7.1%} {on['peak_active']:14d} {on['peak_allocated']:15d} "
              f"{on['peak_reserved']:13d} {off['peak_reserved']:13d}" + ("" if same else "  PEAKS DIFFER"))
        if not same:
            print(f"  front off: peak active {off['peak_active']}, requested {off['peak_allocated']}")


if __name__ == "__main__":
    main()
