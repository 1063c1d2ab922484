"""JAX programs for gpumem run, each measured under every JAX allocator mode
(suite.py). Pure JAX (no Flax or Optax), models built with random weights.

    mlp      the 8-layer 4096-wide MLP with momentum of the issue, trained 12
             steps at each of batch 512, 2048 and 8192
    lm       a transformer language model (6 layers, width 1024) trained with
             variable sequence lengths (128..1024 in four buckets, random
             order)
    rebuild  build a model, train it, delete it, build a larger one (what a
             notebook user does), five sizes

Each function takes log(phase, loss) called after every step (run.py times
the steps by phase) and returns nothing; it keeps no model after it returns.
"""

import random

import jax
import jax.numpy as jnp


def _mlp_init(key, width, depth, n_in, n_out):
    params = []
    dims = [n_in] + [width] * depth + [n_out]
    for i in range(len(dims) - 1):
        key, k = jax.random.split(key)
        params.append((jax.random.normal(k, (dims[i], dims[i + 1]), jnp.float32) / jnp.sqrt(dims[i]),
                       jnp.zeros((dims[i + 1],), jnp.float32)))
    return params


def _mlp_apply(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def _momentum_step(loss_fn, lr=1e-3, mu=0.9):
    @jax.jit
    def step(params, velocity, *batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        velocity = jax.tree_util.tree_map(lambda v, g: mu * v + g, velocity, grads)
        params = jax.tree_util.tree_map(lambda p, v: p - lr * v, params, velocity)
        return params, velocity, loss
    return step


def _xent(logits, y):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def mlp(log, steps=12):
    key = jax.random.PRNGKey(0)
    params = _mlp_init(key, 4096, 8, 1024, 10)
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    step = _momentum_step(lambda p, x, y: _xent(_mlp_apply(p, x), y))
    for batch in (512, 2048, 8192):
        for i in range(steps):
            k1, k2 = jax.random.split(jax.random.PRNGKey(batch * 1000 + i))
            x = jax.random.normal(k1, (batch, 1024), jnp.float32)
            y = jax.random.randint(k2, (batch,), 0, 10)
            params, velocity, loss = step(params, velocity, x, y)
            log(f"batch{batch}", loss)
    del params, velocity


def _lm_init(key, vocab, width, layers, heads):
    def dense(k, a, b):
        return jax.random.normal(k, (a, b), jnp.float32) / jnp.sqrt(a)
    keys = jax.random.split(key, 2 + 4 * layers)
    p = {"embed": jax.random.normal(keys[0], (vocab, width)) * 0.02, "out": dense(keys[1], width, vocab), "layers": []}
    for i in range(layers):
        k = keys[2 + 4 * i: 6 + 4 * i]
        p["layers"].append({"qkv": dense(k[0], width, 3 * width), "proj": dense(k[1], width, width),
                            "up": dense(k[2], width, 4 * width), "down": dense(k[3], 4 * width, width)})
    return p


def _lm_loss(p, tokens, heads=16):
    x = p["embed"][tokens[:, :-1]]
    b, n, d = x.shape
    mask = jnp.tril(jnp.ones((n, n), bool))
    for layer in p["layers"]:
        h = x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-6) * jnp.sqrt(d)
        q, k, v = jnp.split((h @ layer["qkv"]).reshape(b, n, 3 * heads, d // heads), 3, axis=2)
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // heads)
        att = jax.nn.softmax(jnp.where(mask, att, -1e9), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, n, d) @ layer["proj"]
        h = x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-6) * jnp.sqrt(d)
        x = x + jax.nn.gelu(h @ layer["up"]) @ layer["down"]
    logits = x @ p["out"]
    y = tokens[:, 1:]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], axis=-1))


def lm(log, steps=32):
    params = _lm_init(jax.random.PRNGKey(0), 32000, 1024, 6, 16)
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    step = _momentum_step(_lm_loss, lr=1e-4)
    rng = random.Random("jax-lm")
    for i in range(steps):
        n = rng.choice([128, 256, 512, 1024])
        tokens = jax.random.randint(jax.random.PRNGKey(i), (16, n + 1), 0, 32000)
        params, velocity, loss = step(params, velocity, tokens)
        log(f"len{n}", loss)
    del params, velocity


def rebuild(log, steps=6):
    for width in (1024, 2048, 3072, 4096, 6144):
        params = _mlp_init(jax.random.PRNGKey(width), width, 6, 1024, 10)
        velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
        step = _momentum_step(lambda p, x, y: _xent(_mlp_apply(p, x), y))
        for i in range(steps):
            k1, k2 = jax.random.split(jax.random.PRNGKey(i))
            x = jax.random.normal(k1, (4096, 1024), jnp.float32)
            y = jax.random.randint(k2, (4096,), 0, 10)
            params, velocity, loss = step(params, velocity, x, y)
            log(f"width{width}", loss)
        del params, velocity, step


PROGRAMS = {"mlp": mlp, "lm": lm, "rebuild": rebuild}
