"""Teacher-forced analysis of CUDA's pool placement on the async_probe records.

    /usr/bin/python3 bench/peers/async_placement.py PROBEDIR [TRACE...] [--limit N] [--show I J]

PROBEDIR holds NAME.npz of bench/peers/async_probe.py (per event: kind, size,
addr, reserved, used, pass_). For each trace (all in PROBEDIR, or the names
given) this replays pass 0 while keeping the REAL pool's state: the real
addresses of all live blocks, hence the real free space and the heap's end
(the highest address the pool has handed out). Free space is kept as
fragments: each freed block, less what later requests took of it, with the
event that freed it (tf) and the event that last split it (tt); neighbouring
fragments are not merged, but a request may span a run of them.

At every allocation it lists the candidate places: the start of every
fragment from which the free run reaches far enough (room >= the request),
or which runs to the heap's end; it records which one the pool chose (or
'front': at the heap's end) and scores a set of rules by the share of
allocations on which the rule, given the real state, names the pool's choice.
It also reports whether later passes repeat earlier ones address for address
(the pool is deterministic and a freed-out pool behaves as a fresh one when
they do).

--limit N stops after N allocations of a trace (default 20000; the candidate
lists make it quadratic). --show I J prints the candidates of events I..J of
the first trace named, the chosen one marked ==>. Needs numpy.

--pending scores instead the rules of PENDING_RULES, which tell pending
frees from completed ones (docs/EXPERIMENTS.md, "cuda-async, third round"):
each rule keeps its own cut, the last event whose frees it counts as
completed, and moves it by its trigger; given the cut, free fragments merge
with contiguous fragments of the same state, and the rule places the
request by its preference (the real state is restored after each request,
as above). The cut is the only state a rule carries from one request to
the next.
"""

import bisect
import collections
import os
import sys

import numpy as np

ROUND = 512
GRANULE = 32 << 20


def rnd(x):
    return (max(int(x), 1) + ROUND - 1) // ROUND * ROUND


def take(frag, fkeys, a, n, i, front):
    """Takes [a, a+n) out of the free fragments (frag: start -> [size,
    event freed, event last split], fkeys its sorted starts) at event i, the
    pieces left on either side split at i; a request past the heap's front
    leaves the gap before it as a fragment. Returns the new front."""
    j = max(bisect.bisect_right(fkeys, a) - 1, 0)
    while j < len(fkeys) and fkeys[j] < a + n:
        f = fkeys[j]
        fn, tf, _ = frag[f]
        if f + fn <= a:
            j += 1
            continue
        del frag[f]
        fkeys.pop(j)
        if f < a:
            frag[f] = [a - f, tf, i]
            bisect.insort(fkeys, f)
            j += 1
        if f + fn > a + n:
            frag[a + n] = [f + fn - a - n, tf, i]
            bisect.insort(fkeys, a + n)
            j += 1
    if a + n > front:
        if a > front:
            frag[front] = [a - front, -1, -1]
            bisect.insort(fkeys, front)
        front = a + n
    return front


def cases(path, limit):
    """Yields (event, n, candidates, chosen, front) for each allocation of
    pass 0; chosen is an index into candidates, 'front' (at the heap's end),
    'beyond' (past it) or 'other' (none of the candidates)."""
    d = np.load(path)
    kind, size, addr, pass_ = d["kind"], d["size"], d["addr"], d["pass_"]
    live, frag, fkeys = {}, {}, []  # frag: addr -> [n, tf, tt]
    base = int(addr[0])
    front = base
    use = collections.Counter()  # live blocks per granule
    allocs = 0
    for i in range(len(kind)):
        if pass_[i] > 0 or allocs >= limit:
            return
        a = int(addr[i])
        if kind[i] == 0:
            n = live.pop(a)
            frag[a] = [n, i, i]
            bisect.insort(fkeys, a)
            for g in range((a - base) // GRANULE, (a - base + n - 1) // GRANULE + 1):
                use[g] -= 1
            continue
        allocs += 1
        n = rnd(size[i])
        runs = []
        for f in fkeys:
            fn, tf, tt = frag[f]
            if runs and runs[-1][-1][0] + runs[-1][-1][1] == f:
                runs[-1].append((f, fn, tf, tt))
            else:
                runs.append([(f, fn, tf, tt)])
        cands = []
        for r in runs:
            gend = r[-1][0] + r[-1][1]
            atend = gend == front
            for k, (f, fn, tf, tt) in enumerate(r):
                room = gend - f
                if room >= n or atend:
                    cands.append(dict(
                        addr=f - base, size=fn, room=room, gsize=gend - r[0][0], tf=tf, tt=tt,
                        first=k == 0, atend=atend, fits=room >= n,
                        gmax=max(x[2] for x in r), gmin=min(x[2] for x in r),
                        newg=sum(1 for g in range((f - base) // GRANULE, (f - base + n - 1) // GRANULE + 1)
                                 if use[g] == 0)))
        ch = next((j for j, c in enumerate(cands) if c["addr"] == a - base), None)
        if ch is None:
            ch = "front" if a == front else ("beyond" if a > front else "other")
        yield i, n, cands, ch, front - base
        front = take(frag, fkeys, a, n, i, front)
        for g in range((a - base) // GRANULE, (a - base + n - 1) // GRANULE + 1):
            use[g] += 1
        live[a] = n


def pick(cands, key):
    """The candidate a rule names: the one of highest key among those that
    fit; with none, the free run at the heap's end, or the end itself."""
    fit = [j for j, c in enumerate(cands) if c["fits"]]
    if not fit:
        end = [j for j, c in enumerate(cands) if c["atend"] and c["first"]]
        return end[0] if end else "front"
    return max(fit, key=lambda j: key(cands[j]))


# Each rule: a key, highest wins, among the candidates that fit.
RULES = {
    "latest freed fragment": lambda c: (c["tf"], -c["addr"]),
    "latest touched fragment": lambda c: (c["tt"], -c["addr"]),
    "latest freed run (its newest fragment)": lambda c: (c["first"], c["gmax"], -c["addr"]),
    "latest freed run (its oldest fragment)": lambda c: (c["gmin"], c["tf"], -c["addr"]),
    "oldest freed fragment": lambda c: (-c["tf"],),
    "best fit, fragment by its room": lambda c: (-c["room"], -c["addr"]),
    "best fit, fragment by its own size": lambda c: (-(c["size"] if c["size"] >= 0 else 1 << 62), -c["room"]),
    "best fit, whole run": lambda c: (c["first"], -c["gsize"], -c["addr"]),
    "lowest address": lambda c: (-c["addr"],),
    "fewest new granules, then latest freed": lambda c: (-c["newg"], c["tf"]),
    "fewest new granules, then best fit": lambda c: (-c["newg"], -c["room"]),
    "fewest new granules, then lowest": lambda c: (-c["newg"], -c["addr"]),
}


def states(path, limit):
    """Yields (event, n, frags, addr, front, grew) for each allocation of pass
    0: frags the free fragments [addr, size, tf, tt] in address order (tf
    the event that freed it, tt the last that split it), addr the pool's
    choice, grew whether the pool's reserved bytes rose at this event."""
    d = np.load(path)
    kind, size, addr, pass_ = d["kind"], d["size"], d["addr"], d["pass_"]
    res = d["reserved"].astype(np.int64)
    live, frag, fkeys = {}, {}, []
    front = int(addr[0])
    allocs = 0
    for i in range(len(kind)):
        if pass_[i] > 0 or allocs >= limit:
            return
        a = int(addr[i])
        if kind[i] == 0:
            frag[a] = [live.pop(a), i, i]
            bisect.insort(fkeys, a)
            continue
        allocs += 1
        n = rnd(size[i])
        yield i, n, [(f,) + tuple(frag[f]) for f in fkeys], a, front, i > 0 and res[i] > res[i - 1]
        front = take(frag, fkeys, a, n, i, front)
        live[a] = n


def blocks(frags, cut, merge_pending=True):
    """The free blocks given the cut: contiguous fragments of one state
    merged, [addr, size, pending, first freed, last freed, last split]."""
    out = []
    for f, s, tf, tt in frags:
        p = tf > cut
        if out and out[-1][0] + out[-1][1] == f and out[-1][2] == p and (merge_pending or not p):
            b = out[-1]
            b[1] += s
            b[3], b[4], b[5] = min(b[3], tf), max(b[4], tf), max(b[5], tt)
        else:
            out.append([f, s, p, tf, tf, tt])
    return out


def place(bl, n, front, tie, pending_first, end_last=True):
    """Best fit (pending blocks first if pending_first), ties by tie; with
    no fit, the free block at the heap's end or the end itself; and
    whether anything fitted. end_last: a completed block at the heap's end
    is not in the best fit (the end takes the request when nothing fits)."""
    fits = [b for b in bl if b[1] >= n and not (end_last and not b[2] and b[0] + b[1] == front)]
    if pending_first and any(b[2] for b in fits):
        fits = [b for b in fits if b[2]]
    if fits:
        return min(fits, key=lambda b: (b[1], tie(b)))[0], True
    if bl and bl[-1][0] + bl[-1][1] == front:
        return bl[-1][0], False
    return front, False


TIES = {
    "stamped first (freed, merged or split)": lambda b: max(b[4], b[5]),
    "oldest free in the block": lambda b: b[3],
    "latest free in the block": lambda b: -b[4],
    "lowest address": lambda b: b[0],
}

# Each rule: (trigger, pending_first, tie, merge_pending, end_last). trigger says
# when every free so far completes: "always" (round two: no pending),
# "nofit" (when nothing fits; then the request is placed anew), "grow"
# (nofit, or when the pool's reserved rose at this request: before it is
# placed), "never".
ST = "stamped first (freed, merged or split)"
PENDING_RULES = {
    "all completed, best fit": ("always", False, ST, True, True),
    "  the same, the end block in the best fit (round two)": ("always", False, ST, True, False),
    "never completed, best fit": ("never", False, ST, True, True),
    "pending first, completed at no fit": ("nofit", True, ST, True, True),
    "pending first, completed at no fit or growth (kept)": ("grow", True, ST, True, True),
    "  the same, ties: oldest free": ("grow", True, "oldest free in the block", True, True),
    "  the same, ties: latest free": ("grow", True, "latest free in the block", True, True),
    "  the same, ties: lowest address": ("grow", True, "lowest address", True, True),
    "  the same, pending blocks not merged": ("grow", True, ST, False, True),
    "  the same, a completed end block in the best fit": ("grow", True, ST, True, False),
    "no preference, completed at no fit or growth": ("grow", False, ST, True, True),
}


def score_pending(path, limit):
    rules = list(PENDING_RULES.items())
    cuts = [-2] * len(rules)
    ok = [0] * len(rules)
    total = 0
    for i, n, frags, a, front, grew in states(path, limit):
        total += 1
        for k, (_, (trig, pf, tie, mp, el)) in enumerate(rules):
            if trig == "always" or trig == "grow" and grew:
                cuts[k] = i
            got, fitted = place(blocks(frags, cuts[k], mp), n, front, TIES[tie], pf, el)
            if not fitted and trig in ("nofit", "grow"):
                cuts[k] = i
                got, _ = place(blocks(frags, i, mp), n, front, TIES[tie], pf, el)
            ok[k] += got == a
    return total, [(name, ok[k]) for k, (name, _) in enumerate(rules)]


def passes_repeat(path):
    """Whether pass k gives the same addresses as pass k-1, per pass: the
    first differing event (relative to the pass), or None."""
    d = np.load(path)
    addr, pass_ = d["addr"], d["pass_"]
    out = []
    for k in range(1, int(pass_.max()) + 1):
        a, b = addr[pass_ == k - 1], addr[pass_ == k]
        n = min(len(a), len(b))
        diff = np.nonzero(a[:n] != b[:n])[0]
        out.append(int(diff[0]) if len(diff) else None)
    return out


def main(argv):
    limit = 20000
    show = None
    if "--limit" in argv:
        j = argv.index("--limit")
        limit = int(argv[j + 1])
        del argv[j:j + 2]
    pending = "--pending" in argv
    if pending:
        argv.remove("--pending")
    if "--show" in argv:
        j = argv.index("--show")
        show = (int(argv[j + 1]), int(argv[j + 2]))
        del argv[j:j + 3]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    d = argv[0]
    names = argv[1:] or sorted(f[:-4] for f in os.listdir(d) if f.endswith(".npz"))
    if show:
        for i, n, cands, ch, front in cases(os.path.join(d, names[0] + ".npz"), 1 << 62):
            if i < show[0]:
                continue
            if i >= show[1]:
                break
            print(i, "n=%d" % n, "front", front, "chose", ch if isinstance(ch, str) else cands[ch]["addr"])
            for j, c in enumerate(cands):
                print("   %s %11d size %10d room %10d tf %6d tt %6d %s%s newg %d" % (
                    "==>" if j == ch else "   ", c["addr"], c["size"], c["room"], c["tf"], c["tt"],
                    "F" if c["first"] else "-", "E" if c["atend"] else "-", c["newg"]))
        return 0
    for name in names:
        path = os.path.join(d, name + ".npz")
        if pending:
            total, scores = score_pending(path, limit)
            print("%s: %d allocations of pass 0" % (name, total))
            for rule, ok in scores:
                print("    %5.1f%%  %s" % (100 * ok / max(total, 1), rule))
            sys.stdout.flush()
            continue
        all_ = list(cases(path, limit))
        where = collections.Counter("hole" if not isinstance(ch, str) else ch for _, _, _, ch, _ in all_)
        print("%s: %d allocations of pass 0; chosen: %s; later passes first differ at %s" % (
            name, len(all_), dict(where), passes_repeat(path)))
        for rule, key in RULES.items():
            ok = sum(1 for _, _, cands, ch, _ in all_ if pick(cands, key) == ch)
            print("    %5.1f%%  %s" % (100 * ok / max(len(all_), 1), rule))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
