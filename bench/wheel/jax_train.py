"""A JAX program run under `gpumem run` from the installed wheel alone
(scripts/gpu.sh wheel): linear regression by gradient descent. Prints the
losses; exits non-zero if it did not learn."""
import sys

import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (8192, 256))
w_true = jax.random.normal(jax.random.PRNGKey(1), (256,))
y = x @ w_true


@jax.jit
def step(w):
    loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - 0.1 * g, loss


w = jnp.zeros(256)
losses = []
for _ in range(300):
    w, loss = step(w)
    losses.append(float(loss))
print("devices", jax.devices())
print("loss first %.4f last %.6f" % (losses[0], losses[-1]))
if not losses[-1] < losses[0] * 0.01:
    sys.exit("loss did not fall")
print("ok")
