"""The L-BFGS driver survives a scipy whose private ``setulb`` changed: it falls back to
the public interface (same minimum, memory restarted on resume) with one note, never exit 1."""
from __future__ import annotations

import numpy as np

from aepar import optim


def _quadratic(x):
    d = x - np.arange(x.size)
    return float(d @ d), 2.0 * d


def test_a_setulb_with_another_signature_falls_back_to_the_public_driver(monkeypatch, capsys):
    def changed(*args):  # e.g. a scipy that dropped or added an argument
        raise TypeError(f"setulb() takes 18 positional arguments but {len(args)} were given")

    monkeypatch.setattr(optim, "_setulb", lambda: changed)
    optim._say_once.cache_clear()
    solver = optim.LBFGSB(_quadratic, np.zeros(5), 50)
    result = solver.run()
    assert result.success and np.allclose(result.x, np.arange(5), atol=1e-5)
    assert solver.exact_resume is False
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "setulb takes other arguments" in err[0]


def test_the_private_driver_and_the_public_one_reach_the_same_minimum(monkeypatch):
    exact = optim.LBFGSB(_quadratic, np.zeros(5), 50).run()
    monkeypatch.setattr(optim, "_setulb", lambda: None)
    public = optim.LBFGSB(_quadratic, np.zeros(5), 50).run()
    assert exact.success and public.success and np.allclose(exact.x, public.x, atol=1e-6)
