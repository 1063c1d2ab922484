"""jaxprobe.py: the launch gate under JAX (XLA launches from threads of
its own). Run under `gpumem run` with GPUMEM_PRELOAD_REPORT=1: a jitted
matmul loop and a host copy back; prints the gated calls made over it and
the result's checksum against numpy's."""
import ctypes
import json

import jax
import jax.numpy as jnp
import numpy as np


def main():
    gated = ctypes.CDLL(None).gpumem_preload_gated_calls
    gated.restype = ctypes.c_ulong

    @jax.jit
    def step(a, b):
        return jnp.tanh(a @ b) + 1

    a = jnp.ones((512, 512), jnp.float32) / 512
    b = jnp.eye(512, dtype=jnp.float32)
    a = step(a, b).block_until_ready()
    g0 = gated()
    for _ in range(200):
        a = step(a, b)
    host = np.asarray(a)
    g1 = gated()
    ref = np.ones((512, 512), np.float32) / 512
    for _ in range(201):
        ref = np.tanh(ref @ np.eye(512, dtype=np.float32)) + 1
    print(json.dumps({"gated": g1 - g0, "steps": 200, "max_error": float(np.abs(host - ref).max())}))


if __name__ == "__main__":
    main()
