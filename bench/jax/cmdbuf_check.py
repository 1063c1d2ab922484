"""cmdbuf_check.py: a data check of XLA's command buffers (CUDA graphs that
XLA records by stream capture) on the allocator in use: run it under XLA's
own allocator and under `gpumem run --xla-command-buffers xla` (XLA's
default command buffers, which capture cuBLAS calls), and compare.

    python3 bench/jax/cmdbuf_check.py
    gpumem run --xla-command-buffers xla -- python3 bench/jax/cmdbuf_check.py

A jitted step with matmuls (cuBLAS, captured into command buffers) runs on
inputs of a few shapes in turn, so that XLA captures and replays its
command buffers over buffers the allocator hands out and takes back.
After every step:

- its output is checked against the same computation in float64 on the
  host (numpy): a replay that read or wrote the wrong memory gives wrong
  numbers;
- arrays made before the step, each filled with its own constant, are
  checked to still hold it: a replay that wrote memory the allocator had
  handed to them changes them.

Prints one JSON line (steps, the largest relative error, the arrays found
changed, the checksum of the last outputs) and exits 1 if any check
failed. The two runs' checksums must agree within the error bound."""

import json
import sys

import numpy as np


def main():
    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(x, w1, w2):
        h = jnp.tanh(x @ w1)
        return (h @ w2) * 0.5 + x.mean()

    rng = np.random.default_rng(0)
    d = 512
    w1 = rng.standard_normal((d, d)).astype(np.float32) / np.sqrt(d)
    w2 = rng.standard_normal((d, d)).astype(np.float32) / np.sqrt(d)
    jw1, jw2 = jnp.asarray(w1), jnp.asarray(w2)
    shapes = [64, 256, 128, 1024, 64, 512, 256, 1024]
    keep, worst, changed, checksum = [], 0.0, [], 0.0
    steps = 0
    for rnd in range(6):
        for i, n in enumerate(shapes):
            x = rng.standard_normal((n, d)).astype(np.float32)
            y = np.asarray(step(jnp.asarray(x), jw1, jw2))
            ref = (np.tanh(x.astype(np.float64) @ w1) @ w2) * 0.5 + x.astype(np.float64).mean()
            err = float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))
            worst = max(worst, err)
            checksum = float(y.astype(np.float64).sum())
            steps += 1
            # Arrays made between steps, each with its own value, checked
            # after every later step.
            keep.append((len(keep), jnp.full((n, 64), float(len(keep) + 1), jnp.float32)))
            for k, a in keep:
                if not bool(jnp.all(a == k + 1)):
                    changed.append((steps, k))
            if len(keep) > 24:
                keep.pop(0)
    ok = worst < 1e-3 and not changed
    print(json.dumps(dict(steps=steps, worst_error=worst, changed=changed[:20], checksum=checksum,
                          backend=jax.default_backend(), ok=ok)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
