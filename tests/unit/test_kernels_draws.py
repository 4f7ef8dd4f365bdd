"""draws family: uniform_rows, NumPy's PCG64 float32 uniforms block by block.

Every set must give the bits ``rng.random(dtype=np.float32)`` gives and leave each
generator where that call would, whatever the generator's buffered half-output. The GPU
set makes them on the device from the generators' states; its schedule (thread t jumps
to output t, then strides by the thread count) is replayed here in Python integers, so
the arithmetic it relies on is checked on any machine, and the set itself on a GPU.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import aepar  # noqa: F401
from aepar import kernels
from aepar.kernels.ref import draws
from tests.conftest import kernel_set_params

REF = kernels.load("numpy")


def generators(seed, count, lead):
    """``count`` PCG64 generators, the i-th having drawn lead[i] float32s (odd: a buffered half)."""
    out = []
    for i in range(count):
        g = np.random.default_rng((seed, i))
        g.random(lead[i], dtype=np.float32)
        out.append(g)
    return out


def expected(seed, sizes, width, lead):
    """Each block drawn by NumPy itself, and the generators afterwards."""
    gens = generators(seed, len(sizes), lead)
    blocks = [g.random((n, width), dtype=np.float32) for g, n in zip(gens, sizes)]
    return np.concatenate(blocks) if blocks else np.empty((0, width), np.float32), gens


def starts_of(sizes):
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def replay_gpu_schedule(state, inc, buffered, uinteger, count, threads):
    """The CUDA kernel of kernels/cp/draws.py for one stream, in Python integers."""
    out = np.full(count, np.nan, np.float32)
    if count <= 0:
        return out
    if buffered:
        out[0] = np.float32(uinteger >> 8) * np.float32(2.0 ** -24)
    fresh = count - buffered
    steps = (fresh + 1) // 2
    a_t, c_t = draws.jump(threads, inc)
    for t in range(min(threads, steps)):
        a, c = draws.jump(t + 1, inc)
        s = (a * state + c) & draws.MASK
        for k in range(t, steps, threads):
            v = draws.output(s)
            out[buffered + 2 * k] = np.float32((v & 0xFFFFFFFF) >> 8) * np.float32(2.0 ** -24)
            if 2 * k + 1 < fresh:
                out[buffered + 2 * k + 1] = np.float32(v >> 40) * np.float32(2.0 ** -24)
            s = (a_t * s + c_t) & draws.MASK
    return out


@settings(max_examples=40, deadline=None)
@given(lead=st.integers(0, 9), count=st.integers(0, 41), threads=st.integers(1, 7))
def test_the_gpu_schedule_replayed_gives_numpys_draws(lead, count, threads):
    g = np.random.default_rng(lead)
    g.random(lead, dtype=np.float32)
    state, inc, buffered, uinteger = draws.pcg64_state(g)
    got = replay_gpu_schedule(state, inc, buffered, uinteger, count, threads)
    assert np.array_equal(got, g.random(count, dtype=np.float32))


@settings(max_examples=40, deadline=None)
@given(lead=st.integers(0, 9), count=st.integers(0, 300))
def test_skipping_leaves_the_generator_where_drawing_would(lead, count):
    drawn, skipped, read = (np.random.default_rng(7) for _ in range(3))
    for g in (drawn, skipped, read):
        g.random(lead, dtype=np.float32)
    drawn.random(count, dtype=np.float32)
    draws.pcg64_skip(skipped, count)
    draws.pcg64_skip(read, count, draws.pcg64_state(read))  # as the GPU set: from the state read before
    assert skipped.bit_generator.state == drawn.bit_generator.state == read.bit_generator.state
    assert np.array_equal(skipped.random(5, dtype=np.float32), drawn.random(5, dtype=np.float32))


@pytest.mark.parametrize("views", [True, False])
def test_states_read_and_moved_through_the_views_or_the_dict_are_numpys(monkeypatch, views):
    """pcg64_state and pcg64_skip read and write NumPy's own words (checked once against the
    dict), or go through ``bit_generator.state`` where that check fails; either way the
    states are NumPy's. Few views kept: generators whose views were let go read again."""
    assert draws._views_match() is True, "this NumPy's PCG64 words are not where the views look"
    monkeypatch.setattr(draws, "_views_match", lambda: views)
    monkeypatch.setattr(draws, "_VIEWS", {})
    monkeypatch.setattr(draws, "KEEP_VIEWS", 2)
    gens = generators(5, 4, [3, 0, 1, 2])
    twins = generators(5, 4, [3, 0, 1, 2])
    for step in range(3):
        for i, (g, h) in enumerate(zip(gens, twins)):
            st = h.bit_generator.state
            assert draws.pcg64_state(g) == (st["state"]["state"], st["state"]["inc"], st["has_uint32"],
                                            st["uinteger"])
            count = 2 * i + step
            draws.pcg64_skip(g, count, draws.pcg64_state(g))
            h.random(count, dtype=np.float32)
            assert g.bit_generator.state == h.bit_generator.state
    assert len(draws._VIEWS) == (2 if views else 0)
    other = np.random.Generator(np.random.MT19937(1))
    assert draws.pcg64_state(other) is None and draws.pcg64_kept(other) is None


def test_jump_composes_like_steps():
    inc = np.random.default_rng(3).bit_generator.state["state"]["inc"]
    s = 12345
    for n in (1, 2, 3, 64, 1000):
        a, c = draws.jump(n, inc)
        t = s
        for _ in range(n):
            t = (draws.MULT * t + inc) & draws.MASK
        assert (a * s + c) & draws.MASK == t


@pytest.mark.parametrize("kernel_set", ["numpy"] + [p for p in kernel_set_params()])
@pytest.mark.parametrize("sizes,width,lead", [([3], 5, [0]), ([2, 0, 3, 1], 7, [1, 0, 3, 2]), ([25] * 8, 1000, [0] * 8),
                                              ([1, 1], 1, [1, 1])])
def test_uniform_rows_match_numpy(kernel_set, sizes, width, lead):
    K = kernels.load(kernel_set)
    want, after = expected(11, sizes, width, lead)
    gens = generators(11, len(sizes), lead)
    rows = int(sum(sizes))
    if kernel_set == "cupy":
        import cupy as cp

        out = cp.full((rows, width), cp.nan, dtype=cp.float32)
        got = cp.asnumpy(K.uniform_rows(gens, starts_of(sizes), out))
    else:
        got = K.uniform_rows(gens, starts_of(sizes), np.full((rows, width), np.nan, np.float32))
    assert np.array_equal(got, want)
    for g, h in zip(gens, after):  # each generator moved on as NumPy's own draw moves it
        assert g.bit_generator.state == h.bit_generator.state


def test_uniform_rows_refuses_what_does_not_fit():
    g = [np.random.default_rng(0)]
    with pytest.raises(ValueError, match="float32"):
        REF.uniform_rows(g, [0, 2], np.empty((2, 3)))
    with pytest.raises(ValueError, match="do not split"):
        REF.uniform_rows(g, [0, 1], np.empty((2, 3), np.float32))


def _numba_draws():
    return pytest.importorskip("aepar.kernels.nb.draws")


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=5), width=st.integers(1, 9),
       leads=st.lists(st.integers(0, 3), min_size=5, max_size=5), seed=st.integers(0, 2 ** 32 - 1))
def test_the_compiled_draws_are_numpys(sizes, width, leads, seed):
    """The Numba set's own PCG64 loop (two generators side by side, a last one alone): NumPy's
    numbers and states for any block sizes, widths and buffered halves."""
    nb_draws = _numba_draws()
    want, after = expected(seed, sizes, width, leads)
    gens = generators(seed, len(sizes), leads)
    got = nb_draws.uniform_rows(gens, starts_of(sizes), np.full((int(sum(sizes)), width), np.nan, np.float32))
    assert nb_draws._CHECKED == [True], "drawn through NumPy: the compiled loop failed its check"
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert [g.bit_generator.state for g in gens] == [h.bit_generator.state for h in after]


def test_the_compiled_draws_run_where_numpy_keeps_the_state_as_read(monkeypatch):
    """On this NumPy the layout check passes, so the tests above ran the compiled loop, not
    the fallback; and the check refuses a loop that gets the numbers or the states wrong."""
    import ctypes

    nb_draws = _numba_draws()
    assert nb_draws.same_as_numpy()
    real = nb_draws._fill_rows

    def numbers_off(out, starts, addresses):
        real(out, starts, addresses)
        out[-1, -1] = np.nextafter(out[-1, -1], np.float32(1))

    def states_not_moved(out, starts, addresses):  # the right numbers, the 128-bit states put back
        pcgs = [ctypes.c_uint64.from_address(int(a)).value for a in addresses]  # each one's state and increment
        saved = [ctypes.string_at(p, 16) for p in pcgs]
        real(out, starts, addresses)
        for p, state in zip(pcgs, saved):
            ctypes.memmove(p, state, 16)

    for planted in (numbers_off, states_not_moved):
        monkeypatch.setattr(nb_draws, "_fill_rows", planted)
        assert not nb_draws.same_as_numpy(), planted.__name__


def test_other_generators_and_a_failed_check_draw_through_numpy(monkeypatch):
    nb_draws = _numba_draws()
    sizes, width = [3, 4], 5
    philox = [np.random.Generator(np.random.Philox(i)) for i in range(2)]
    twins = [np.random.Generator(np.random.Philox(i)) for i in range(2)]
    got = nb_draws.uniform_rows(philox, starts_of(sizes), np.empty((7, width), np.float32))
    assert np.array_equal(got, np.concatenate([g.random((n, width), dtype=np.float32) for g, n in zip(twins, sizes)]))
    monkeypatch.setattr(nb_draws, "_CHECKED", [False])
    monkeypatch.setattr(nb_draws, "_fill_rows", lambda *a: pytest.fail("the compiled loop ran after a failed check"))
    want, after = expected(5, sizes, width, [1, 0])
    gens = generators(5, 2, [1, 0])
    assert np.array_equal(nb_draws.uniform_rows(gens, starts_of(sizes), np.empty((7, width), np.float32)), want)
    assert [g.bit_generator.state for g in gens] == [h.bit_generator.state for h in after]
