"""A jitted JAX MLP training loop with four batch shapes and eager ops between steps.

    XLA_PYTHON_CLIENT_ALLOCATOR=platform python3 tests/gpu/jax_steps.py [--steps N]

Prints `jax_steps steps=N step_ms=MEDIAN checksum=HEX`: the median step time (after a warm-up
that compiles every shape) and a checksum of the final loss, which must not depend on the
allocator. With the platform allocator every XLA buffer is a driver allocation.
"""
import argparse
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp

    sizes = [1024, 2048, 2048, 1024, 10]
    key = jax.random.PRNGKey(0)
    params = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        key, k = jax.random.split(key)
        params.append((jax.random.normal(k, (a, b)) * (1.0 / a) ** 0.5, jnp.zeros((b,))))

    def loss_fn(p, x, y):
        h = x
        for w, b in p[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = p[-1]
        logits = h @ w + b
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, axis=-1))

    @jax.jit
    def step(p, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        return [(w - 1e-3 * gw, b - 1e-3 * gb) for (w, b), (gw, gb) in zip(p, g)], loss

    batches = [64, 96, 128, 192]
    data = []
    for i, n in enumerate(batches):
        k = jax.random.PRNGKey(100 + i)
        x = jax.random.normal(k, (n, sizes[0]))
        y = jax.nn.one_hot(jnp.arange(n) % 10, 10)
        data.append((x, y))

    def one(i, p):
        x, y = data[i % len(data)]
        x = x * (1.0 + 0.01 * (i % 3))  # eager ops: buffers outside the jitted step
        p, loss = step(p, x, y)
        return p, loss

    for i in range(8):  # compiles every shape
        params, loss = one(i, params)
    loss.block_until_ready()
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        params, loss = one(i, params)
        loss.block_until_ready()
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"jax_steps steps={args.steps} step_ms={statistics.median(times):.3f} checksum={float(loss).hex()}")


if __name__ == "__main__":
    main()
