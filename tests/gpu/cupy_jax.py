"""Small CuPy and JAX workloads whose results must not change under cudalloc.

    python3 tests/gpu/cupy_jax.py cupy   # CuPy with its memory pool off: every array is a cudaMalloc
    python3 tests/gpu/cupy_jax.py jax    # run with XLA_PYTHON_CLIENT_ALLOCATOR=platform
    python3 tests/gpu/cupy_jax.py cupy-time   # the CuPy work timed: median ms per round of it
"""
import sys


def cupy_work():
    import cupy as cp
    cp.cuda.set_allocator(None)
    acc = 0.0
    for i in range(200):
        a = cp.arange(1000 + 997 * i, dtype=cp.float64)
        b = cp.sin(a) * cp.cos(a / 3.0)
        acc += float((b * b).sum())
        m = cp.ones((64 + i % 7, 64), dtype=cp.float32) @ cp.ones((64, 32), dtype=cp.float32)
        acc += float(m.sum())
    return acc


def jax_work():
    import jax
    import jax.numpy as jnp
    key = jax.random.PRNGKey(0)
    acc = 0.0
    for i in range(50):
        key, sub = jax.random.split(key)
        x = jax.random.normal(sub, (256 + 8 * (i % 5), 256))
        acc += float(jnp.tanh(x @ x.T).sum())
    return acc


def cupy_timed(rounds=7):
    """Median wall time of cupy_work() (after one warm-up round), and its result."""
    import statistics
    import time
    import cupy as cp
    acc = cupy_work()
    times = []
    for _ in range(rounds):
        cp.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        acc = cupy_work()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), acc


if __name__ == "__main__":
    which = sys.argv[1]
    if which == "cupy-time":
        ms, acc = cupy_timed()
        print(f"cupy_steps round_ms={ms:.3f} checksum={acc.hex()}")
    else:
        print(f"{which} {(cupy_work() if which == 'cupy' else jax_work()).hex()}")
