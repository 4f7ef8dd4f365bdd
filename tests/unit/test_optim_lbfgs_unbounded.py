"""aepar's L-BFGS (``--optimizer lbfgs``): the two-loop kernel against the NumPy reference, the
secant equation and, bit for bit, the documented order of its sums; minima of smooth
functions, and a paused run resumed from its state taking exactly the steps of an
uninterrupted one."""
from __future__ import annotations

import numpy as np
import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import optim
from aepar.kernels.nb import lbfgs as nb
from aepar.kernels.ref import lbfgs as ref


def _pairs(rng, n, m, count):
    """``count`` pairs of a convex quadratic (y = A s) stored in a ring of m rows."""
    q = rng.standard_normal((n, n))
    A = q @ q.T + n * np.eye(n)
    S, Y, rho = np.zeros((m, n)), np.zeros((m, n)), np.zeros(m)
    for k in range(count):
        s = rng.standard_normal(n)
        S[k % m], Y[k % m] = s, A @ s
        rho[k % m] = 1.0 / (S[k % m] @ Y[k % m])
    return S, Y, rho


@pytest.mark.parametrize("n, m, count", [(1, 3, 0), (13, 4, 2), (37, 10, 10), (101, 5, 17), (3289, 10, 23)])
def test_the_kernels_direction_is_the_references(n, m, count):
    rng = np.random.default_rng(n + count)
    S, Y, rho = _pairs(rng, n, m, count)
    g = rng.standard_normal(n)
    want, got = np.empty(n), np.full(n, np.nan)
    ref.two_loop(S, Y, rho, count, g, want)
    nb.two_loop(S, Y, rho, count, g, got)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    if count == 0:
        assert np.array_equal(got, -g)


def _ordered_dot(a, b):
    """Σ a_i b_i as the kernels add it: product i into partial sum i % 8, in order; the eight
    added ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)); then the last n % 8 products one by one."""
    full = a.size - a.size % 8
    sums = np.zeros(8)
    for row in (a[:full] * b[:full]).reshape(-1, 8):
        sums = sums + row
    total = ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]))
    for i in range(full, a.size):
        total += a[i] * b[i]
    return total


def _ordered_two_loop(S, Y, rho, count, g):
    """The reference's recursion with those sums (each product rounded before its sum)."""
    m = S.shape[0]
    rows = [(count - 1 - j) % m for j in range(min(count, m))]
    q, alpha = -g, []
    for r in rows:
        alpha.append(rho[r] * _ordered_dot(S[r], q))
        q = q - alpha[-1] * Y[r]
    if rows:
        q = q * (_ordered_dot(S[rows[0]], Y[rows[0]]) / _ordered_dot(Y[rows[0]], Y[rows[0]]))
    for a, r in reversed(list(zip(alpha, rows))):
        q = q + (a - rho[r] * _ordered_dot(Y[r], q)) * S[r]
    return q


@pytest.mark.parametrize("n", [3, 8, 9, 3289])
def test_the_sums_are_eight_partial_sums_in_a_fixed_tree_bit_for_bit(n):
    """The bits the optimiser's steps (and a resumed run's) depend on: the same on every
    vector width, and no FMA where the reference rounds the product first."""
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n), rng.standard_normal(n) * rng.uniform(0.1, 10.0, n)
    assert nb.dot(a, b) == _ordered_dot(a, b)
    for count in (1, 7, 23):
        S, Y = rng.standard_normal((10, n)), rng.standard_normal((10, n))
        rho, g, d = 1.0 / rng.uniform(0.5, 2.0, 10), rng.standard_normal(n), np.empty(n)
        nb.two_loop(S, Y, rho, count, g, d)
        assert np.array_equal(d, _ordered_two_loop(S, Y, rho, count, g)), f"count {count}"
    for _ in range(40):  # 1 / s·y hides a last bit of s·y now and then: many pairs
        t, x, g_new = rng.uniform(0.1, 2.0), rng.standard_normal(n), g + d * rng.uniform(0.5, 2.0, n)  # s·y > 0
        s, y = t * d, g_new - g
        assert nb.keep_pair(x, t, d, g, g_new, S, Y, rho, 23) == 24
        assert rho[3] == 1.0 / _ordered_dot(s, y) and np.array_equal(S[3], s) and np.array_equal(Y[3], y)


def test_the_largest_gradient_element_is_numpys_nan_included():
    g = np.random.default_rng(2).standard_normal(3289)
    assert nb.max_abs(g) == np.max(np.abs(g)) and nb.max_abs(-np.abs(g)) == np.max(np.abs(g))
    assert np.isnan(nb.max_abs(np.r_[g[:5], np.nan, g[5:]]))


@pytest.mark.parametrize("count", [0, 3, 12])
def test_one_call_starts_an_iteration_as_the_two_loop_and_its_slope_would(count):
    """``direction``: the largest |g_i|, d of the two-loop and g·d, bit for bit, the pairs
    kept; converged (the largest |g_i| at most gtol), d is left alone; a d that is no
    descent direction becomes -g with slope -g·g and no pairs."""
    rng = np.random.default_rng(count)
    S, Y, rho = _pairs(rng, 3289, 10, count)
    g = rng.standard_normal(3289)
    want, d = np.empty(3289), np.full(3289, np.nan)
    nb.two_loop(S, Y, rho, count, g, want)
    assert nb.direction(S, Y, rho, count, g, d, 1e-5) == (nb.max_abs(g), nb.dot(g, want), count)
    assert np.array_equal(d, want)
    d[:] = 7.0
    assert nb.direction(S, Y, rho, count, g, d, 10.0) == (nb.max_abs(g), 0.0, count) and np.all(d == 7.0)
    if count:  # the newest pair with s·y < 0 (y = -s, rho < 0): the two-loop gives d = 0
        newest = (count - 1) % 10
        S[newest], Y[newest], rho[newest] = g, -g, -1.0 / (g @ g)
        assert nb.direction(S, Y, rho, count, g, d, 1e-5) == (nb.max_abs(g), -nb.dot(g, g), 0)
        assert np.array_equal(d, -g)


@pytest.mark.parametrize("count", [1, 3, 12])
def test_the_direction_meets_the_newest_secant_equation(count):
    """H y = s for the newest pair (s, y), whatever came before: d(g = y) = -s."""
    rng = np.random.default_rng(count)
    S, Y, rho = _pairs(rng, 9, 4, count)
    newest = (count - 1) % 4
    for two_loop in (ref.two_loop, nb.two_loop):
        d = np.empty(9)
        two_loop(S, Y, rho, count, Y[newest].copy(), d)
        np.testing.assert_allclose(d, -S[newest], rtol=1e-10, atol=1e-12)


def test_a_step_moves_to_the_point_evaluated_and_keeps_its_pair_only_with_curvature():
    rng = np.random.default_rng(5)
    n, m = 21, 4
    x0, d, g, g_new = (rng.standard_normal(n) for _ in range(4))
    g_new = g + 0.5 * d  # s·y = 0.5 t |d|² > 0
    S, Y, rho = np.zeros((m, n)), np.zeros((m, n)), np.zeros(m)
    x, g_now, trial = x0.copy(), g.copy(), np.empty(n)
    nb.step_to(x0, 0.3, d, trial)
    assert np.array_equal(trial, x0 + 0.3 * d)
    assert nb.keep_pair(x, 0.3, d, g_now, g_new, S, Y, rho, 6) == 7
    assert np.array_equal(x, trial) and np.array_equal(g_now, g_new)  # the point evaluated, bit for bit
    assert np.array_equal(S[2], 0.3 * d) and np.array_equal(Y[2], g_new - g)  # pair 6 in row 6 % 4
    assert rho[2] == 1.0 / _ordered_dot(0.3 * d, g_new - g)
    kept = S.copy()
    assert nb.keep_pair(x, 0.3, d, g_now, g_now.copy(), S, Y, rho, 7) == 7  # y = 0: dropped
    assert np.array_equal(S, kept) and np.array_equal(x, trial + 0.3 * d)


def test_impossible_shapes_are_refused():
    with pytest.raises(ValueError, match="two_loop"):
        nb.two_loop(np.zeros((3, 5)), np.zeros((3, 4)), np.zeros(3), 1, np.zeros(5), np.zeros(5))


def _rosenbrock(x):
    a, b = x[:-1], x[1:]
    f = float(np.sum(100.0 * (b - a * a) ** 2 + (1.0 - a) ** 2))
    g = np.zeros_like(x)
    g[:-1] = -400.0 * a * (b - a * a) - 2.0 * (1.0 - a)
    g[1:] += 200.0 * (b - a * a)
    return f, g


def test_it_finds_the_minimum_of_a_quadratic_and_of_rosenbrocks_valley():
    centre = np.arange(7.0)
    res = optim.LBFGS(lambda x: (float((x - centre) @ (x - centre)), 2.0 * (x - centre)), np.zeros(7), 100).run()
    assert res.success and res.message.startswith("CONVERGENCE") and np.allclose(res.x, centre, atol=1e-5)
    res = optim.LBFGS(_rosenbrock, np.full(6, -1.2), 500).run()
    assert res.success and np.allclose(res.x, 1.0, atol=1e-4), (res.x, res.message)
    assert res.nfev <= 2 * res.nit + 20


def test_a_paused_run_resumed_from_its_state_takes_the_same_steps():
    x0 = np.linspace(-1.5, 1.0, 8)
    whole = optim.LBFGS(_rosenbrock, x0, 40).run()
    first = optim.LBFGS(_rosenbrock, x0, 40)
    paused = first.run(callback=lambda it, f, x: it == 13)
    assert paused.paused and paused.nit == 13 and not paused.success
    state = {k: np.array(v) for k, v in first.state().items()}  # as a checkpoint stores them
    then = optim.LBFGS(_rosenbrock, np.zeros(8), 40)
    then.load_state(state)
    rest = then.run()
    assert rest.nit == whole.nit and rest.nfev == whole.nfev and np.array_equal(rest.x, whole.x)
    with pytest.raises(ValueError, match="shape"):
        optim.LBFGS(_rosenbrock, np.zeros(5), 40).load_state(state)


def test_the_callback_sees_every_iteration_the_last_included():
    seen = []
    res = optim.LBFGS(_rosenbrock, np.full(4, 0.5), 30).run(callback=lambda it, f, x: seen.append(it))
    assert seen == list(range(1, res.nit + 1))


def test_the_warm_up_loads_every_kernel_the_iterations_call():
    """In a process of its own (cached kernels load once per process): after LBFGS.warm_up
    every compiled function that LBFGS.run calls from Python has a signature, so a run's
    first iteration loads none of them inside its timed iterations."""
    import subprocess
    import sys

    code = ("from aepar.optim import LBFGS; LBFGS.warm_up(); "
            "from aepar.kernels.nb import lbfgs as k; "
            "print(sorted(n for n in ('direction', 'dot', 'step_to', 'keep_pair') if not getattr(k, n).signatures))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
