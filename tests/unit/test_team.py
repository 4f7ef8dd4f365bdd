"""aepar.kernels.nb.team: helpers waiting in compiled code run each share as the caller's
thread would, hand back what a share raised, and wake from parking."""
import threading
import time

import aepar  # noqa: F401  (first: threads before numpy)
import numpy as np
import pytest
from numba import njit

from aepar.kernels.nb import team

SHARE = 20_000  # elements a share sums, many times over


@njit(nogil=True)
def _job(op, a, lo, hi, out, i):
    """Share i: a sum over a[lo:hi] (op times over), into out[i]; op 7 raises in share 1
    (the first helper's), op 8 in share 0 (the caller's)."""
    if (op == 7 and i == 1) or (op == 8 and i == 0):
        raise ValueError("share asked to fail")
    s = 0.0
    for _ in range(op):
        for j in range(lo, hi):
            s += a[j] * 1.0000001
    out[i] = s


@njit(nogil=True)
def _serve(ctrl, k, budget, a, lo, hi, out, i):
    while True:
        op = team.wait_for_work(ctrl, k, budget)
        if op <= 0:
            return op
        _job(op, a, lo, hi, out, i)
        team.finish(ctrl, k)


def _shares(a, out, size):
    """(lo, hi) per share; the helpers' shares are twice the caller's, so that a caller that
    did not wait for them would read their slots before they are written."""
    n = SHARE
    bounds = [(0, n)] + [(n + 2 * n * k, n + 2 * n * (k + 1)) for k in range(size)]
    return [(a, lo, hi, out, i) for i, (lo, hi) in enumerate(bounds)]


def _expected(a, size, op):
    want = np.zeros(size + 1)
    for args in _shares(a, want, size):
        _job(op, *args)
    return want


def _in_time(fn, seconds=60):
    """fn() on a thread of its own, failed if it has not ended in ``seconds`` (a lost
    wake-up would leave a round spinning for ever)."""
    raised = []

    def body():
        try:
            fn()
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "a round never ended"
    if raised:
        raise raised[0]


def _team(size, budget=None):
    t = team.Team(size, _serve, _job)
    if budget is not None:
        t.budget = budget
    return t


@pytest.mark.parametrize("budget", [None, 0, 2_000])  # spinning, always parked, parking often
def test_every_round_gives_the_bits_of_the_shares_run_one_after_another(rng, budget):
    size = 2
    a = rng.random(SHARE * (1 + 2 * size))
    out = np.zeros(size + 1)
    helpers = _team(size, budget)
    shares = _shares(a, out, size)

    def rounds():
        helpers.bind(shares[1:])
        for op in (1, 3, 2, 1, 5):
            out[:] = np.nan
            helpers.run(op, shares[0])
            np.testing.assert_array_equal(out, _expected(a, size, op))
        helpers.close()

    _in_time(rounds)


def test_a_parked_helper_wakes_and_a_rebind_takes_new_arrays(rng):
    """After idling past its spin (parked) a helper still takes the next round, and after
    bind() it works on the new arrays, not the ones it held."""
    size = 1
    helpers = _team(size, budget=1_000)
    a, b = rng.random(SHARE * 3), rng.random(SHARE * 3)
    out, other = np.zeros(2), np.zeros(2)

    def rounds():
        helpers.bind(_shares(a, out, size)[1:])
        helpers.run(1, _shares(a, out, size)[0])
        time.sleep(0.05)  # parked now
        assert helpers.ctrl[team.STATE] == team.PARKED
        helpers.run(2, _shares(a, out, size)[0])
        np.testing.assert_array_equal(out, _expected(a, size, 2))
        helpers.bind(_shares(b, other, size)[1:])
        helpers.run(1, _shares(b, other, size)[0])
        np.testing.assert_array_equal(other, _expected(b, size, 1))
        np.testing.assert_array_equal(out, _expected(a, size, 2))  # the old arrays left alone
        helpers.close()

    _in_time(rounds)


def test_posting_races_with_parking_without_a_lost_round(rng):
    """Rounds posted just as helpers give up spinning (a budget of about a microsecond and
    pauses around it): every round ends, with the right sums."""
    size = 2
    a = rng.random(SHARE * (1 + 2 * size))
    out = np.zeros(size + 1)
    want = _expected(a, size, 1)
    helpers = _team(size, budget=3_000)

    def rounds():
        shares = _shares(a, out, size)
        helpers.bind(shares[1:])
        for r in range(600):
            out[:] = np.nan
            helpers.run(1, shares[0])
            np.testing.assert_array_equal(out, want, err_msg=f"round {r}")
            if r % 3:
                time.sleep(1e-6 * (r % 7))
        helpers.close()

    _in_time(rounds)


@pytest.mark.parametrize("who", ["helper", "caller"])
def test_a_share_that_raises_is_raised_once_every_share_ended(rng, who):
    size = 2
    a = rng.random(SHARE * (1 + 2 * size))
    out = np.zeros(size + 1)
    helpers = _team(size)
    shares = _shares(a, out, size)

    def rounds():
        helpers.bind(shares[1:])
        with pytest.raises(ValueError, match="asked to fail"):
            helpers.run(7 if who == "helper" else 8, shares[0])
        helpers.run(1, shares[0])  # the team carries on
        np.testing.assert_array_equal(out, _expected(a, size, 1))
        helpers.close()

    _in_time(rounds)


def test_close_ends_the_helpers():
    helpers = _team(2)
    helpers.bind([(np.zeros(1), 0, 0, np.zeros(3), k) for k in (1, 2)])
    helpers.close()
    for t in helpers.threads:
        t.join(10)
    assert not any(t.is_alive() for t in helpers.threads)


def test_a_team_closed_before_any_bind_ends_and_one_never_bound_refuses_to_run():
    helpers = _team(2)
    with pytest.raises(RuntimeError, match="bind"):
        helpers.run(1, (np.zeros(1), 0, 0, np.zeros(3), 0))
    helpers.close()
    for t in helpers.threads:
        t.join(10)
    assert not any(t.is_alive() for t in helpers.threads)


def test_no_spinning_where_the_threads_outnumber_the_cores(monkeypatch):
    monkeypatch.setattr(team, "_usable_cores", lambda: 2)
    crowded, fits = _team(2), _team(1)
    try:
        assert crowded.budget == 0 and fits.budget == team.SPIN_NS
    finally:
        crowded.close()
        fits.close()
