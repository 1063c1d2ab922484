"""frontcache_model.py K TRACE...: how many requests a front cache on the C
side of the library would serve without entering Go (docs/EXPERIMENTS.md,
"A front cache on the C side of the library").

The model: gpumem_free puts the block in a cache of at most K blocks (the
oldest leaves first), keyed by exact requested size and stream;
gpumem_alloc takes the newest cached block of its key (a hit) or goes to
Go (a miss). A miss first drains the cache into Go only when it would
raise Go's peak of active bytes (Go counts cached blocks as active), so
that the peaks Go reports stay the program's. Prints, per trace, the
requests, the share served by hits and the drains."""

import collections
import gzip
import sys


def rounded(n):
    return (n + 511) & ~511


def model(path, k):
    live = {}
    cache = collections.OrderedDict()  # key -> [ids], oldest key first
    n = cached = total = hits = drains = active = peak = 0
    with gzip.open(path, "rt") as f:
        for line in f:
            p = line.split()
            if not p or p[0] not in ("a", "f"):
                continue
            if p[0] == "a":
                size, key = int(p[2]), (int(p[2]), p[3])
                r = rounded(size)
                total += 1
                ids = cache.get(key)
                if ids:
                    ids.pop()
                    n, cached, hits = n - 1, cached - r, hits + 1
                    if not ids:
                        del cache[key]
                else:
                    if cached and active + cached + r > peak:
                        drains += 1
                        cache.clear()
                        n = cached = 0
                    peak = max(peak, active + cached + r)
                active += r
                live[p[1]] = (key, r)
            else:
                v = live.pop(p[1], None)
                if v is None:
                    continue
                key, r = v
                active -= r
                if n >= k:
                    old = next(iter(cache))
                    cache[old].pop(0)
                    n, cached = n - 1, cached - rounded(old[0])
                    if not cache[old]:
                        del cache[old]
                cache.setdefault(key, []).append(p[1])
                cache.move_to_end(key)
                n, cached = n + 1, cached + r
    return total, hits, drains


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    k = int(sys.argv[1])
    print(f"{'trace':24s} {'requests':>9s} {'hits':>7s} {'drains':>7s}")
    for path in sys.argv[2:]:
        total, hits, drains = model(path, k)
        name = path.rsplit("/", 1)[-1].split(".")[0]
        print(f"{name:24s} {total:9d} {hits / max(total, 1):7.1%} {drains:7d}")


if __name__ == "__main__":
    main()
