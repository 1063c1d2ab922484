#!/usr/bin/env python3
"""Synthetic allocation traces of five program shapes and one of none, to
check that a policy tuned on the six recorded traces holds on programs it was
not tuned on.

    python3 bench/synth/gen.py OUTDIR           # 45 traces (5 seeds x 9 families)
    python3 bench/synth/gen.py OUTDIR 105 10    # seeds 105-114: kv5..kv14, ...

A trace of seed S is named FAMILY{S-100}. Families (gpumem-trace v1,
deterministic seeds, 100-104 by default; one stream but prefetch and buckets):
  kv      autoregressive generation: a KV cache per layer regrown one token at a
          time (new = bigger, then the old freed), random batch and prompt
  varlen  transformer training with random sequence lengths: activations, attention
          scores, gradients freed in reverse
  cnn     convolutional training with fixed shapes per run
  sweep   build a random MLP, train a few steps, drop it; several times
  serve   generation serving: 4-32 requests at once, each regrowing its own KV
          cache, arriving and finishing at random (caches freed out of order)
  rand    no program's shape: log-uniform sizes (512 B to 512 MiB), frees in
          random order, about 8 GiB live, 60,000 events
  randx   rand at a scale drawn from the seed (2-20 GiB live, sizes up to
          64 MiB-2 GiB): random-free programs the churn guard was not sized on
  prefetch two streams sharing memory: a side stream (1) loads the next batch
          (random size) while the main stream (0) trains on the current one
          (activations sized by that batch); the main stream frees each batch
          after its step (a free of the side stream's memory)
  buckets  data-parallel training: gradient buckets allocated on a
          communication stream (2) while backward frees activations on the
          main stream (0)
Sizes follow the shapes of real layers and lifetimes the program's order,
except in rand.
"""
import gzip
import math
import os
import random
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else "."


def write(name, events):
    text = "# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US\n" + "".join(e + "\n" for e in events)
    # mtime=0 and no file name in the header: the same seed gives the same bytes.
    with open(os.path.join(OUT, f"{name}.trace.gz"), "wb") as raw:
        with gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f:
            f.write(text.encode())
class Trace:
    """Events in program order; a() returns the new request's ID."""

    def __init__(self):
        self.ev, self.nid, self.t = [], 0, 0

    def a(self, size, stream=0):
        self.ev.append(f"a {self.nid} {max(1, int(size))} {stream} {self.t}")
        self.nid += 1
        self.t += 1
        return self.nid - 1

    def f(self, i):
        self.ev.append(f"f {i} {self.t}")
        self.t += 1


def kv(seed):
    r = random.Random(seed)
    t = Trace()
    layers = r.choice([12, 24, 32])
    hidden = r.choice([768, 1024, 2048])
    for _ in range(layers * 4):  # weights, never freed
        t.a(hidden * hidden * 2 * r.choice([1, 3, 4]))
    for _ in range(r.randint(4, 10)):  # rounds of generation
        batch, prompt = r.randint(1, 16), r.randint(16, 256)
        cache = [t.a(batch * prompt * hidden * 2 * 2) for _ in range(layers)]
        for step in range(r.randint(32, 128)):
            length = prompt + step + 1
            for layer in range(layers):
                tmp = [t.a(batch * hidden * 2 * m) for m in (1, 4, 1)]
                new = t.a(batch * length * hidden * 2 * 2)  # torch.cat: new, then old freed
                t.f(cache[layer])
                cache[layer] = new
                for x in tmp:
                    t.f(x)
            t.f(t.a(batch * 50257 * 4))  # logits
        for c in cache:
            t.f(c)
    return t.ev


def varlen(seed):
    r = random.Random(seed)
    t = Trace()
    hidden = r.choice([512, 768, 1024, 1536])
    layers = r.choice([6, 12, 24])
    batch = r.choice([8, 16, 32])
    for _ in range(layers * 6):  # parameters
        t.a(hidden * hidden * 4 * r.choice([1, 4]))
    for _ in range(layers * 6):  # optimizer state
        t.a(hidden * hidden * 4 * 2)
    for _ in range(r.randint(15, 40)):  # steps
        length = r.randint(32, 1024)
        acts = []
        for _ in range(layers):
            for m in (1, 1, 4, 4, 1):
                acts.append(t.a(batch * length * hidden * m * 2))
            acts.append(t.a(batch * 12 * length * length * 2))  # attention scores
        for x in reversed(acts):  # backward
            g = t.a(r.uniform(0.2, 1.0) * batch * length * hidden * 2)
            t.f(x)
            t.f(g)
        grads = [t.a(hidden * hidden * 4) for _ in range(layers * 6)]
        for g in grads:
            t.f(g)
    return t.ev


def cnn(seed):
    r = random.Random(seed)
    t = Trace()
    batch = r.choice([16, 32, 64, 128])
    res = r.choice([128, 224, 256])
    for c in (64, 128, 256, 512):  # parameters
        for _ in range(8):
            t.a(r.choice([1, 4, 9]) * c * c * 4)
    for _ in range(10):  # steps
        acts = []
        h = res
        for c in (64, 128, 256, 512):
            for _ in range(r.randint(2, 6)):
                for _ in range(3):
                    acts.append(t.a(batch * c * h * h * 2 * r.choice([1, 4]) // 4))
            h //= 2
        for x in reversed(acts):
            g = t.a(batch * 64 * 64 * 2)
            t.f(x)
            t.f(g)
    return t.ev


def sweep(seed):
    r = random.Random(seed)
    t = Trace()
    for _ in range(r.randint(6, 14)):  # models
        width = r.choice([1024, 2048, 3072, 4096, 6144, 8192])
        depth = r.randint(2, 16)
        weights = [t.a(width * width * 4) for _ in range(depth * 4)]
        for _ in range(5):  # training steps
            acts = [t.a(r.choice([64, 128, 256]) * width * 4) for _ in range(depth * 2)]
            for x in reversed(acts):
                t.f(x)
        for w in weights:
            t.f(w)
    return t.ev


def serve(seed):
    """Many requests generating at once, each with its own KV cache, arriving
    and finishing at random: caches are freed out of the order they were made."""
    r = random.Random(seed)
    t = Trace()
    layers = r.choice([12, 24])
    hidden = r.choice([768, 1024, 2048])
    for _ in range(layers * 4):  # weights
        t.a(hidden * hidden * 2 * r.choice([1, 3, 4]))
    active = {}  # request -> [remaining tokens, length, caches]
    for step in range(r.randint(300, 600)):
        while len(active) < r.randint(4, 32):  # arrivals
            prompt = r.randint(16, 512)
            active[t.nid] = [r.randint(16, 256), prompt,
                             [t.a(prompt * hidden * 2 * 2) for _ in range(layers)]]
        for req in list(active):  # one token for every active request
            left, length, caches = active[req]
            length += 1
            for layer in range(layers):
                new = t.a(length * hidden * 2 * 2)
                t.f(caches[layer])
                caches[layer] = new
            t.f(t.a(50257 * 4))
            if left == 1:
                for c in caches:
                    t.f(c)
                del active[req]
            else:
                active[req] = [left - 1, length, caches]
    return t.ev


def rand(seed):
    """No program's shape: sizes log-uniform from 512 B to 512 MiB, freed in
    random order, about 8 GiB live once warm. The family on which policies
    that help ordered growth (training, generation) show what they cost
    programs that free at random."""
    return random_free(random.Random(seed), 8 << 30, 512, 512 << 20)


def random_free(r, target, smallest, largest):
    """60,000 events: requests of sizes log-uniform in [smallest, largest]
    while about target bytes are live (up to a tenth more), frees of a
    random live request once there."""
    t = Trace()
    live, cur = [], 0
    lo, hi = math.log(smallest), math.log(largest)
    while len(t.ev) < 60000:
        if cur < target or (r.random() < 0.5 and cur < target * 1.1):
            size = int(math.exp(r.uniform(lo, hi)))
            live.append((t.a(size), size))
            cur += size
        else:
            k = r.randrange(len(live))
            (i, size), live[k] = live[k], live[-1]
            live.pop()
            t.f(i)
            cur -= size
    return t.ev


def randx(seed):
    """rand's shape with its scale drawn from the seed: about 2, 4, 8 or 20
    GiB live, sizes log-uniform from 512 B or 4 KiB up to 64 MiB, 128 MiB,
    512 MiB or 2 GiB. rand is the family the churn guard (churn.go) was
    sized on; these are programs of the same kind it has not seen."""
    r = random.Random(seed * 7919)
    target = r.choice([2, 4, 8, 20]) << 30
    largest = r.choice([64, 128, 512, 2048]) << 20
    return random_free(r, target, r.choice([512, 4096]), largest)


def prefetch(seed):
    """A two-stream prefetch pipeline: the side stream (1) allocates batch
    i+1 (and its staging copies, freed at once) while the main stream (0)
    runs step i; batch i is freed when step i is done. Batch sizes vary, so
    memory freed on one stream is what the other needs next."""
    r = random.Random(seed)
    t = Trace()
    hidden = r.choice([768, 1024, 2048])
    layers = r.choice([6, 12, 24])
    for _ in range(layers * 4):  # parameters, main stream
        t.a(hidden * hidden * 4 * r.choice([1, 4]))

    def load():
        n = r.randint(8, 64) * r.choice([1, 2, 4])  # samples in the batch
        batch = [t.a(n * 224 * 224 * 3 * r.choice([1, 2]), 1), t.a(n * 8, 1)]
        for _ in range(r.randint(1, 4)):  # staging copies
            t.f(t.a(n * 224 * 224 * 3 // r.choice([1, 2, 4]), 1))
        return n, batch

    cur = load()
    for _ in range(r.randint(20, 60)):  # steps
        n, batch = cur
        acts = []
        for _ in range(layers):
            for m in (1, 4, 1):
                acts.append(t.a(n * 196 * hidden * m * 2))
            if r.random() < 0.3 and len(acts) > 2:  # a temporary freed early
                t.f(acts.pop(r.randrange(len(acts))))
        cur = load()  # the next batch, on the side stream, overlapping
        for x in reversed(acts):  # backward
            g = t.a(r.uniform(0.3, 1.0) * n * 196 * hidden * 2)
            t.f(x)
            t.f(g)
        for b in batch:  # the batch was used by the main stream: freed after its step
            t.f(b)
    return t.ev


def buckets(seed):
    """Data-parallel training with gradient buckets on a communication
    stream (2): backward on the main stream (0) frees activations while the
    communication stream allocates a flat bucket per group of layers, reduces
    it and frees it; the optimizer's temporaries follow on the main stream."""
    r = random.Random(seed)
    t = Trace()
    hidden = r.choice([768, 1024, 2048])
    layers = r.choice([12, 24])
    batch = r.choice([4, 8, 16])
    per = r.choice([2, 3, 4])  # layers per bucket
    for _ in range(layers * 4):  # parameters and optimizer state
        t.a(hidden * hidden * 4 * 4)
    for _ in range(r.randint(15, 40)):  # steps
        length = r.randint(64, 1024)
        acts = []
        for _ in range(layers):
            for m in (1, 4, 1):
                acts.append(t.a(batch * length * hidden * m * 2))
            acts.append(t.a(batch * 12 * length * min(length, 512) * 2))
        inflight = []
        for layer in range(layers):  # backward, last layer first
            for _ in range(4):
                g = t.a(r.uniform(0.3, 1.0) * batch * length * hidden * 2)
                t.f(acts.pop())
                t.f(g)
            if (layer + 1) % per == 0:  # a bucket of per layers' gradients
                b = t.a(per * hidden * hidden * 4 * 4, 2)
                inflight.append(b)
                if len(inflight) > 2:  # the oldest reduction is done
                    t.f(inflight.pop(0))
        for b in inflight:
            t.f(b)
        for _ in range(r.randint(2, 6)):  # optimizer temporaries
            t.f(t.a(hidden * hidden * 4 * r.choice([1, 4])))
    return t.ev


if __name__ == "__main__":
    if OUT.startswith("-"):  # -h, --help, or a mistyped option: not a directory to fill
        print(__doc__.strip().split("\n\n")[1] if "\n\n" in __doc__ else __doc__, file=sys.stderr)
        sys.exit(0 if OUT in ("-h", "--help") else 2)
    os.makedirs(OUT, exist_ok=True)
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    gens = {"kv": kv, "varlen": varlen, "cnn": cnn, "sweep": sweep, "serve": serve, "rand": rand, "randx": randx, "prefetch": prefetch, "buckets": buckets}
    for name, g in gens.items():
        for seed in range(first, first + count):
            write(f"{name}{seed - 100}", g(seed))
