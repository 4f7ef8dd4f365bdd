"""Float64 central differences and dtype-derived tolerances shared by the kernel tests."""
import numpy as np


def numerical_grad(f, x, eps=1e-6):
    """d f() / d x by central differences; ``f`` reads ``x`` (perturbed in place)."""
    g = np.zeros_like(x, dtype=np.float64)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = to_host(f())  # a loss may be a 0-d array on the GPU
        flat[i] = old - eps
        down = to_host(f())
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return g


def assert_grad_close(analytic, numeric, rtol=1e-6, atol=1e-8, name=""):
    analytic = np.asarray(analytic, dtype=np.float64)
    err = np.max(np.abs(analytic - numeric)) if analytic.size else 0.0
    scale = max(np.max(np.abs(numeric)) if numeric.size else 0.0, 1.0)
    assert err <= atol + rtol * scale, f"{name}: max |analytic - numeric| = {err:.3e} (scale {scale:.3e})"


def tolerance(dtype, work=1):
    """Agreement to expect between two correct implementations in ``dtype``.

    ``work`` is the length of the longest sum involved: rounding grows ~ sqrt(work).
    """
    eps = np.finfo(dtype).eps
    rtol = 8 * eps * np.sqrt(max(work, 1))
    return dict(rtol=rtol, atol=rtol)


def to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def scalar_value(value) -> float:
    """A kernel's scalar (a loss, sq_err) as a float: the CPU sets return a Python float, the
    cupy set a 0-d float64 array left on the device (reading it waits for the GPU)."""
    if not isinstance(value, float):
        assert value.shape == () and value.dtype == np.float64, f"scalar: {type(value).__name__}"
        value = float(value)
    return value


def assert_close(actual, expected, dtype, work=1, name=""):
    actual, expected = to_host(actual), to_host(expected)
    np.testing.assert_allclose(actual, expected, err_msg=name, **tolerance(dtype, work))
