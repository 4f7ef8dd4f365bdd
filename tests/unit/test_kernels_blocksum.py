"""blocksum family: block_outer_sum, the blocks' weight products added in the fixed tree.

The reference against the definition (each block's product apart, then aepar.rows'
tree_sum: the postfix merges must be that tree), float64 central differences of its
linear map, the numba set against the oracle, and what the data-parallel trainer relies
on: one numba call over a node's blocks gives the same bits as the blocks' products one
call each added by NumPy in the tree (so a rank may add its blocks alone and send the
sum), in one call or in bands of rows, and no memory past ``out`` is written.
"""
import importlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import kernels
from aepar.rows import tree_merges, tree_sum, tree_top
from tests.conftest import CPU_FMA, gpu_rows, kernel_set_params
from tests.gradcheck import assert_grad_close, numerical_grad, to_host

REF = kernels.load("numpy")
NB = kernels.load("numba")


def problem(rng, sizes, m, n, dtype=np.float32):
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    A = rng.standard_normal((int(starts[-1]), m)).astype(dtype)
    D = rng.standard_normal((int(starts[-1]), n)).astype(dtype)
    alphas = list(rng.standard_normal(len(sizes)))
    return A, D, starts, alphas


def assert_sums_close(got, want, A, D, starts, alphas, name):
    """Each out[i, j] within the rounding its own terms allow: 8 eps sqrt(k) times
    Σ_b |α_b| Σ_r |A[r, i] D[r, j]| (float64), not times the sum itself, which may cancel
    to near zero while its terms stay large (a fixed rtol/atol then fails on a correct kernel)."""
    eps = np.finfo(A.dtype).eps
    absA, absD = np.abs(A.astype(np.float64)), np.abs(D.astype(np.float64))
    terms = sum(abs(a) * absA[s:e].T @ absD[s:e] for s, e, a in zip(starts[:-1], starts[1:], alphas))
    bound = 8 * eps * np.sqrt(max(A.shape[0], 1)) * terms
    err = np.abs(np.asarray(to_host(got), np.float64) - np.asarray(want, np.float64))
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else None
    assert np.all(err <= bound), f"{name}: |error| {err[worst]:.3e} > bound {bound[worst]:.3e} at {worst}"


def apart(K, A, D, starts, alphas):
    """Each block's product by its own call (one block: no merges)."""
    m, n = A.shape[1], D.shape[1]
    return [K.block_outer_sum(A[s:e], D[s:e], [0, e - s], [0], [a], np.empty((m, n), A.dtype))
            for s, e, a in zip(starts[:-1], starts[1:], alphas)]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_reference_is_the_tree_sum_of_the_blocks(count, rng):
    # magnitudes far apart, so that another order of additions would round differently
    A, D, starts, alphas = problem(rng, rng.integers(0, 6, count), 7, 9, np.float64)
    alphas = [a * 10.0 ** e for a, e in zip(alphas, rng.integers(-8, 8, count))]
    got = REF.block_outer_sum(A, D, starts, tree_merges(tree_top(count), 0, count), alphas, np.empty((7, 9)))
    assert np.array_equal(got, tree_sum(apart(REF, A, D, starts, alphas)))


def test_gradcheck_block_outer_sum(rng):
    """d <G, out> / dA and / dD in float64 by central differences (the map is bilinear)."""
    A, D, starts, alphas = problem(rng, [2, 0, 3], 4, 5, np.float64)
    G = rng.standard_normal((4, 5))
    merges = tree_merges(2, 0, 3)

    def objective():
        return float(np.sum(G * NB.block_outer_sum(A, D, starts, merges, alphas, np.empty((4, 5)))))
    rows = np.repeat(alphas, np.diff(starts))[:, None]
    assert_grad_close(rows * (D @ G.T), numerical_grad(objective, A), name="dA")
    assert_grad_close(rows * (A @ G), numerical_grad(objective, D), name="dD")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("sizes", [[13, 12, 13, 0, 12, 13, 12, 13], [98]], ids=["8-blocks", "one-block"])
@pytest.mark.parametrize("name", kernel_set_params())
def test_matches_reference_block_outer_sum(name, sizes, dtype, rng):
    K = kernels.load(name)
    xp = np
    if name == "cupy":
        import cupy as xp
    A, D, starts, alphas = problem(rng, sizes, 70, 100, dtype)
    if len(sizes) == 1:
        alphas = [1.0]  # a whole batch on one process: the GPU set writes its one product in place
    merges = tree_merges(tree_top(len(sizes)), 0, len(sizes))
    want = REF.block_outer_sum(A, D, starts, merges, alphas, np.empty((70, 100), dtype))
    got = K.block_outer_sum(xp.asarray(A), xp.asarray(D), starts, merges, alphas, xp.empty((70, 100), dtype))
    assert_sums_close(got, want, A, D, starts, alphas, "block_outer_sum")


@settings(max_examples=40, deadline=None)
@given(count=st.integers(1, 9), m=st.integers(1, 40), n=st.integers(1, 90), seed=st.integers(0, 2 ** 16),
       fold=st.booleans())
def test_one_call_is_the_blocks_apart_added_in_the_tree(count, m, n, seed, fold):
    """The bits the trainer needs: a node's blocks in one call, on one or two threads, are
    the blocks' own products added in the tree (or in order: the allreduce path)."""
    rng = np.random.default_rng(seed)
    A, D, starts, alphas = problem(rng, rng.integers(0, 30, count), m, n)
    merges = [0] + [1] * (count - 1) if fold else tree_merges(tree_top(count), 0, count)
    buf = np.full((m + 1, n), 7.0, np.float32)  # a row past out: must stay
    out = buf[:m]
    NB.block_outer_sum(A, D, starts, merges, alphas, out)
    leaves = apart(NB, A, D, starts, alphas)
    want = leaves[0].copy()
    if fold:
        for leaf in leaves[1:]:
            want += leaf
    else:
        want = tree_sum(leaves)
    assert np.array_equal(out, want)
    assert np.all(buf[m] == 7.0)
    # the trainer's threads take bands of rows (A's columns): the same bits as one call
    cut = m // 2
    bands = np.empty((m, n), np.float32)
    for lo, hi in ((0, cut), (cut, m)):
        NB.block_outer_sum(A[:, lo:hi], D, starts, merges, alphas, bands[lo:hi])
    assert np.array_equal(bands, out)
    # A in other layouts (read through its row stride, or copied first): the same bits
    wide = np.zeros((A.shape[0], 3 * m + 5), np.float32)
    wide[:, :2 * m:2], wide[:, 2 * m + 3:3 * m + 3] = A, A
    for other in (np.asfortranarray(A), wide[:, :2 * m:2], wide[:, 2 * m + 3:3 * m + 3]):
        got = np.full((m, n), np.nan, np.float32)
        NB.block_outer_sum(other, D, starts, merges, alphas, got)
        assert np.array_equal(got.view(np.int32), out.view(np.int32))
    exact = sum(np.float64(a) * (A[s:e].astype(np.float64).T @ D[s:e].astype(np.float64))
                for s, e, a in zip(starts[:-1], starts[1:], alphas))
    bound = (A.shape[0] + count + 2) * np.finfo(np.float32).eps * sum(
        abs(a) * (np.abs(A[s:e].astype(np.float64)).T @ np.abs(D[s:e].astype(np.float64)))
        for s, e, a in zip(starts[:-1], starts[1:], alphas))
    assert np.all(np.abs(out - exact) <= bound + 1e-30)


@pytest.mark.parametrize("K", [REF, NB], ids=["numpy", "numba"])
def test_refusals(K):
    A, D = np.zeros((4, 3), np.float32), np.zeros((4, 5), np.float32)
    out = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match="do not match"):
        K.block_outer_sum(A, D[:3], [0, 4], [0], [1.0], out)
    with pytest.raises(ValueError, match="starts"):
        K.block_outer_sum(A, D, [0, 3], [0], [1.0], out)
    with pytest.raises(ValueError, match="must rise"):  # offsets that go back
        K.block_outer_sum(A, D, [0, 3, 1, 4], [0, 1, 1], [1.0] * 3, out)
    with pytest.raises(ValueError, match="need 3 starts"):
        K.block_outer_sum(A, D, [0, 4], [0, 1], [1.0, 1.0], out)
    for merges in ([0, 2], [0, 0], [1, 0]):
        with pytest.raises(ValueError, match="postfix tree"):
            K.block_outer_sum(A, D, [0, 2, 4], merges, [1.0, 1.0], out)
    # offsets and trees are checked once and then looked up: the same ones with other
    # arrays are checked against those arrays again, and numbers that only round to them
    # are not taken for them
    K.block_outer_sum(A, D, [0, 2, 4], [0, 1], [1.0, 1.0], out)
    with pytest.raises(ValueError, match="must rise from 0 to 5"):
        K.block_outer_sum(np.zeros((5, 3), np.float32), np.zeros((5, 5), np.float32), [0, 2, 4], [0, 1],
                          [1.0, 1.0], out)
    with pytest.raises(ValueError, match=r"starts \[0.0, 2.5, 4.0\] must rise"):
        K.block_outer_sum(A, D, [0, 2.5, 4], [0, 1], [1.0, 1.0], out)
    with pytest.raises(ValueError, match="postfix tree"):
        K.block_outer_sum(A, D, [0, 2, 4], [0, 1.5], [1.0, 1.0], out)


def test_offsets_checked_once_are_checked_against_each_call():
    """check_starts keeps the offsets it has checked: the same offsets for another row count,
    or values that only round to them, are refused as the first time."""
    from aepar.kernels.ref.blocksum import check_starts, most_rows

    assert check_starts("t", 5, [0, 2, 5]).tolist() == [0, 2, 5] and most_rows([0, 2, 5]) == 3
    for rows, starts in ((6, [0, 2, 5]), (5, [0, 2.5, 5]), (5, [0, 3, 2, 5]), (5, [1, 2, 5]), (5, [5])):
        with pytest.raises(ValueError, match="do not split"):
            check_starts("t", rows, starts)


@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 5), m=st.integers(1, 40), n=st.integers(1, 90), seed=st.integers(0, 2 ** 16),
       fold=st.booleans(), data=st.data())
def test_long_blocks_in_stretches_are_the_whole_blocks_bits(count, m, n, seed, fold, data):
    """Blocks longer than LONG_ROWS are taken a stretch of rows at a time (every tile's
    sums kept on its stack between stretches, each stretch's rows of A copied transposed):
    the same bits as the kernel that takes each block whole, A's rows contiguous or
    strided, and nothing written past out."""
    from aepar.kernels.nb import rowprod

    most = rowprod.LONG_ROWS + 3 * rowprod.SEGMENT_ROWS
    sizes = data.draw(st.lists(st.integers(0, most), min_size=count, max_size=count))
    sizes[data.draw(st.integers(0, count - 1))] = data.draw(st.integers(rowprod.LONG_ROWS + 1, most))
    rng = np.random.default_rng(seed)
    A, D, starts, alphas = problem(rng, sizes, m, n)
    alphas[0] = 1.0  # the multiply is skipped for 1
    merges = np.array([0] + [1] * (count - 1) if fold else tree_merges(tree_top(count), 0, count), np.int64)
    buf = np.full((m + 1, n), 7.0, np.float32)  # a row past out: must stay
    NB.block_outer_sum(A, D, starts, merges, alphas, buf[:m])
    whole = np.empty((m, n), np.float32)
    rowprod._in_tiles(A, D, starts, merges, rowprod._scales(alphas), whole, rowprod._NO_PANEL, False)  # blocks whole
    assert np.array_equal(buf[:m].view(np.int32), whole.view(np.int32))
    assert np.all(buf[m] == 7.0)
    # A's rows read through their stride (a band of a wider array): the same bits
    wide = np.zeros((A.shape[0], m + 19), np.float32)
    wide[:, 3:m + 3] = A
    banded = np.full((m, n), np.nan, np.float32)
    NB.block_outer_sum(wide[:, 3:m + 3], D, starts, merges, alphas, banded)
    assert np.array_equal(banded.view(np.int32), whole.view(np.int32))
    assert_sums_close(buf[:m], REF.block_outer_sum(A, D, starts, merges, alphas, np.empty((m, n), np.float32)),
                      A, D, starts, alphas, "block_outer_sum in stretches")


@pytest.mark.parametrize("chain", ["stretch+1", "long", "long+1"])
def test_blocks_up_to_long_rows_whole_and_past_it_in_stretches_give_the_sums(chain):
    """Around the bounds of the whole-block tiles: a block one row longer than a stretch,
    one of LONG_ROWS rows (both whole, on the AVX2 path) and one of LONG_ROWS + 1 (in
    stretches) against the reference, beside short blocks; the step with the sum too."""
    from aepar.kernels.nb import rowprod

    rows = {"stretch+1": rowprod.SEGMENT_ROWS + 1, "long": rowprod.LONG_ROWS, "long+1": rowprod.LONG_ROWS + 1}[chain]
    rng = np.random.default_rng(rows)
    A, D, starts, alphas = problem(rng, [13, rows, 0, 12], 37, 45)
    merges = tree_merges(tree_top(4), 0, 4)
    got = NB.block_outer_sum(A, D, starts, merges, alphas, np.full((37, 45), np.nan, np.float32))
    assert_sums_close(got, REF.block_outer_sum(A, D, starts, merges, alphas, np.empty((37, 45), np.float32)),
                      A, D, starts, alphas, f"block_outer_sum, a block of {rows} rows")
    p, v = rng.standard_normal((2, 37, 45)).astype(np.float32)
    p2, v2 = p.copy(), v.copy()
    NB.block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, 0.1, 0.9, 2e-4)
    NB.sgd_momentum_update(p2, got, v2, 0.1, 0.9, 2e-4)
    assert p.tobytes() == p2.tobytes() and v.tobytes() == v2.tobytes()


@pytest.mark.parametrize("name", ["numpy", "numba"])
@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 8), m=st.integers(1, 40), n=st.integers(1, 90), seed=st.integers(0, 2 ** 16),
       decay=st.sampled_from([0.0, 2e-4, 0.3]), momentum=st.sampled_from([0.0, 0.5, 0.9]), long=st.booleans())
def test_the_step_with_the_sum_is_the_sum_then_the_step(name, count, m, n, seed, decay, momentum, long):
    """block_outer_sum_sgd: the bits of block_outer_sum and then sgd_momentum_update of the
    same set (the numba set steps p and v where each tile's sums end, the sum never written
    out), signed zeros included, and nothing written past p or v."""
    from aepar.kernels.nb import rowprod

    K = kernels.load(name)
    rng = np.random.default_rng(seed)
    sizes = list(rng.integers(0, 30, count))
    if long:  # a block the numba set takes in stretches: there the sum, then the step
        sizes[int(rng.integers(count))] = rowprod.LONG_ROWS + 1 + int(rng.integers(60))
    A, D, starts, alphas = problem(rng, sizes, m, n)
    A[: max(1, A.shape[0] // 3)] = 0  # some sums -0 or 0
    merges = tree_merges(tree_top(count), 0, count)
    p0 = rng.standard_normal((m + 1, n)).astype(np.float32)
    v0 = rng.standard_normal((m + 1, n)).astype(np.float32)
    p0[:m][rng.random((m, n)) < 0.2], v0[:m][rng.random((m, n)) < 0.2] = -0.0, 0.0
    p, v = p0.copy(), v0.copy()
    assert K.block_outer_sum_sgd(A, D, starts, merges, alphas, p[:m], v[:m], 0.1, momentum, decay) is None
    p2, v2 = p0[:m].copy(), v0[:m].copy()
    g = K.block_outer_sum(A, D, starts, merges, alphas, np.empty((m, n), np.float32))
    K.sgd_momentum_update(p2, g, v2, 0.1, momentum, decay)
    assert p[:m].tobytes() == p2.tobytes() and v[:m].tobytes() == v2.tobytes()
    assert p[m].tobytes() == p0[m].tobytes() and v[m].tobytes() == v0[m].tobytes()


def test_the_step_with_the_sum_refuses_a_velocity_of_another_shape():
    A, D, starts, alphas = problem(np.random.default_rng(0), [3, 4], 5, 6)
    p = np.zeros((5, 6), np.float32)
    for K in (REF, NB):
        with pytest.raises(ValueError):
            K.block_outer_sum_sgd(A, D, starts, [0, 1], alphas, p, np.zeros((5, 7), np.float32), 0.1, 0.9)


def assert_parts_are_the_chain(K, a_parts, d_parts, starts, merges, alphas, rng):
    """K's block_outer_sum of the parts has the bits of the interleaved arrays'
    (ref.blocksum.interleaved: each block's chain of rows in one array), and writes
    nothing past out; its step with the sum too."""
    from aepar.kernels.ref.blocksum import interleaved

    m, n = a_parts[0].shape[1], d_parts[0].shape[1]
    A, D, chain = interleaved(a_parts, d_parts, starts)
    want = K.block_outer_sum(A, D, chain, merges, alphas, np.empty((m, n), np.float32))
    got = np.full((m + 1, n), 7.0, np.float32)
    K.block_outer_sum(a_parts, d_parts, starts, merges, alphas, got[:m])
    assert np.array_equal(got[:m].view(np.int32), want.view(np.int32)) and np.all(got[m] == 7.0)
    p0, v0 = rng.standard_normal((2, m, n)).astype(np.float32)
    p, v, p2, v2 = p0.copy(), v0.copy(), p0.copy(), v0.copy()
    K.block_outer_sum_sgd(A, D, chain, merges, alphas, p, v, 0.1, 0.9, 2e-4)
    K.block_outer_sum_sgd(a_parts, d_parts, starts, merges, alphas, p2, v2, 0.1, 0.9, 2e-4)
    assert p.tobytes() == p2.tobytes() and v.tobytes() == v2.tobytes()


@pytest.mark.parametrize("name", ["numpy", "numba"])
@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 8), m=st.integers(1, 40), n=st.integers(1, 90), seed=st.integers(0, 2 ** 16),
       long=st.booleans(), banded=st.booleans())
def test_two_parts_are_the_interleaved_arrays(name, count, m, n, seed, long, banded):
    """A and D given as two parts each (a tied autoencoder's (x, dz2) and (dz1, h)): the
    bits of one array each with every block's rows of the first part, then of the second
    (ref.blocksum.interleaved), the step with the sum too; A's parts read through their
    stride, blocks empty or long (taken in stretches), and nothing written past out."""
    from aepar.kernels.nb import rowprod

    K = kernels.load(name)
    rng = np.random.default_rng(seed)
    sizes = list(rng.integers(0, 16, count))
    if long:
        sizes[int(rng.integers(count))] = rowprod.LONG_ROWS // 2 + 1 + int(rng.integers(40))
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rows = int(starts[-1])
    wide = [rng.standard_normal((rows, m + extra)).astype(np.float32) for extra in (5, 9)]  # rows apart unlike
    a_parts = tuple(w[:, 2:m + 2] if banded else np.ascontiguousarray(w[:, :m]) for w in wide)
    d_parts = tuple(rng.standard_normal((2, rows, n)).astype(np.float32))
    alphas = list(rng.standard_normal(count))
    merges = tree_merges(tree_top(count), 0, count)
    assert_parts_are_the_chain(K, a_parts, d_parts, starts, merges, alphas, rng)


@pytest.mark.parametrize("sizes", [[13, 12, 0, 13], [25], [60, 64, 65, 100]],
                         ids=["blocks", "one-block", "either-side"])
@pytest.mark.parametrize("name", kernel_set_params())
def test_two_parts_on_every_set(name, sizes, rng, monkeypatch):
    """Every set takes two parts as the interleaved arrays, the one block's product written
    in place included. The GPU set hands them to its row kernels as they are where every
    block is small, and a block is small by the rows of both its parts (at most twice
    ``MAX_ROWS``, as the interleaved block's; the sizes are scaled to it)."""
    from aepar.kernels.ref.blocksum import as_parts, interleaved

    K = kernels.load(name)
    xp = np
    by_rows = []  # the GPU set: each block its row kernels summed, by its rows of all parts
    if name == "cupy":
        import cupy as xp
        gpu_blocksum = importlib.import_module("aepar.kernels.cp.blocksum")
        sizes, bound = gpu_rows(sizes)

        def spy(A, D, starts, merges, alphas, out, real=gpu_blocksum.rows_block_outer_sum):
            by_rows.extend((np.diff(starts) * len(as_parts(A))).tolist())
            return real(A, D, starts, merges, alphas, out)
        monkeypatch.setattr(gpu_blocksum, "rows_block_outer_sum", spy)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    a_parts = tuple(rng.standard_normal((int(starts[-1]), 30)).astype(np.float32) for _ in range(2))
    d_parts = tuple(rng.standard_normal((int(starts[-1]), 50)).astype(np.float32) for _ in range(2))
    alphas = [1.0] if len(sizes) == 1 else list(rng.standard_normal(len(sizes)))
    merges = tree_merges(tree_top(len(sizes)), 0, len(sizes))
    A, D, chain = interleaved(a_parts, d_parts, starts)
    want = K.block_outer_sum(xp.asarray(A), xp.asarray(D), chain, merges, alphas, xp.empty((30, 50), np.float32))
    by_rows.clear()
    got = K.block_outer_sum(tuple(xp.asarray(a) for a in a_parts), tuple(xp.asarray(d) for d in d_parts), starts,
                            merges, alphas, xp.empty((30, 50), np.float32))
    assert np.array_equal(to_host(got).view(np.int32), to_host(want).view(np.int32))
    if name == "cupy":
        assert by_rows == [2 * n for n in sizes if 2 * n <= 2 * bound]


def runs_as_parts(rng, groups, parts, m, n, blocks_per_group, band=False):
    """Several threads' stacked blocks as block_outer_sum takes them (aepar.rows.factor_rows):
    A's and D's parts, each part's runs side by side (part after part), and a row of
    starts per part, block b's rows in its own run only. Returns (A parts, D parts,
    starts)."""
    sizes = [list(rng.integers(0, 14, blocks_per_group)) for _ in range(groups)]
    count = groups * blocks_per_group
    rows, first = [], 0
    for own in sizes:
        at = np.concatenate([[0], np.cumsum(own)]).tolist()
        rows.append([0] * first + at + [at[-1]] * (count - first - blocks_per_group))
        first += blocks_per_group
    wide = [rng.standard_normal((sum(own), m + 7)).astype(np.float32) for _ in range(parts) for own in sizes]
    a_parts = tuple(w[:, 3:m + 3] if band else np.ascontiguousarray(w[:, :m]) for w in wide)
    d_parts = tuple(rng.standard_normal((a.shape[0], n)).astype(np.float32) for a in a_parts)
    return a_parts, d_parts, np.array(rows * parts, np.int64)


@pytest.mark.parametrize("name", ["numpy", "numba"])
@settings(max_examples=30, deadline=None)
@given(groups=st.integers(1, 4), parts=st.integers(1, 2), per_group=st.integers(1, 3), m=st.integers(1, 40),
       n=st.integers(1, 70), seed=st.integers(0, 2 ** 16), band=st.booleans())
def test_a_row_of_starts_per_part_is_the_interleaved_arrays(name, groups, parts, per_group, m, n, seed, band):
    """Several threads' blocks read where they lie (parts of different rows, a row of
    starts per part): the bits of one array each with every block's chain of rows in
    order (ref.blocksum.interleaved), the step with the sum too, nothing written past out."""
    from aepar.kernels.ref.blocksum import interleaved

    K = kernels.load(name)
    rng = np.random.default_rng(seed)
    a_parts, d_parts, starts = runs_as_parts(rng, groups, parts, m, n, per_group, band)
    count = groups * per_group
    alphas, merges = list(rng.standard_normal(count)), tree_merges(tree_top(count), 0, count)
    chain = interleaved(a_parts, d_parts, starts)[2]
    assert chain.tolist() == np.concatenate([[0], np.cumsum(np.diff(starts, axis=1).sum(axis=0))]).tolist()
    assert_parts_are_the_chain(K, a_parts, d_parts, starts, merges, alphas, rng)


@pytest.mark.parametrize("name", kernel_set_params())
def test_a_row_of_starts_per_part_on_every_set(name, rng):
    """Every set takes two threads' runs of a tied autoencoder's two parts (four parts, a
    row of starts each) as the interleaved arrays: the sum and the step with it."""
    from aepar.kernels.ref.blocksum import interleaved

    K = kernels.load(name)
    xp = importlib.import_module("cupy") if name == "cupy" else np
    a_parts, d_parts, starts = runs_as_parts(rng, 2, 2, 30, 50, 4)
    alphas, merges = list(rng.standard_normal(8)), tree_merges(3, 0, 8)
    A, D, chain = interleaved(a_parts, d_parts, starts)
    want = K.block_outer_sum(xp.asarray(A), xp.asarray(D), chain, merges, alphas, xp.empty((30, 50), np.float32))
    got = K.block_outer_sum(tuple(map(xp.asarray, a_parts)), tuple(map(xp.asarray, d_parts)), starts, merges,
                            alphas, xp.empty((30, 50), np.float32))
    assert np.array_equal(to_host(got).view(np.int32), to_host(want).view(np.int32))
    p, v = (xp.asarray(a) for a in rng.standard_normal((2, 30, 50)).astype(np.float32))
    p2, v2 = p.copy(), v.copy()
    K.block_outer_sum_sgd(xp.asarray(A), xp.asarray(D), chain, merges, alphas, p, v, 0.1, 0.9, 2e-4)
    K.block_outer_sum_sgd(tuple(map(xp.asarray, a_parts)), tuple(map(xp.asarray, d_parts)), starts, merges,
                          alphas, p2, v2, 0.1, 0.9, 2e-4)
    assert to_host(p).tobytes() == to_host(p2).tobytes() and to_host(v).tobytes() == to_host(v2).tobytes()


def test_a_row_of_starts_per_part_refused_where_it_does_not_fit():
    """A row of starts per part: as many rows as parts, each as long as the blocks and
    rising to its part's rows, every part of A with its part of D's rows; each refusal
    names the kernel."""
    a_parts, d_parts, starts = runs_as_parts(np.random.default_rng(3), 2, 1, 4, 5, 2)
    out = np.zeros((4, 5), np.float32)
    wrong_top = starts.copy()
    wrong_top[1, -1] += 1
    ragged = [starts[0].tolist(), starts[1].tolist()[:-1]]  # a row short of the blocks
    for K in (REF, NB):
        for A, D, at in ((a_parts, d_parts, starts[:1]), (a_parts, d_parts, wrong_top),
                         (a_parts, (d_parts[0], d_parts[1][:0]), starts), (a_parts, d_parts, ragged)):
            with pytest.raises(ValueError, match="block_outer_sum"):
                K.block_outer_sum(A, D, at, [0, 1, 0, 2], [1.0] * 4, out)


def test_parts_refused_where_they_do_not_fit():
    x = np.zeros((4, 3), np.float32)
    d = np.zeros((4, 5), np.float32)
    out = np.zeros((3, 5), np.float32)
    for K in (REF, NB):
        # as many parts of each; A's columns; D's columns; A's rows (one row of starts);
        # every part 2-D; each part of A with its part of D's rows
        for A, D in (((x, x), (d,)), ((x, x[:, :2]), (d, d)), ((x, x), (d, d[:, :4])), ((x, x[:3]), (d, d[:3])),
                     ((x, x[0]), (d, d)), ((x, x), (d, d[:3]))):
            with pytest.raises(ValueError, match="do not match"):
                K.block_outer_sum(A, D, [0, 4], [0], [1.0], out)


def test_parts_laid_out_otherwise_take_the_reference(rng):
    """A part of D, or out and the velocity, whose rows are not C-contiguous (a view of
    every other column) are not read by the tiles (which take each row's elements as
    adjacent): the numba set's sums and steps are still the definition's, within rounding."""
    A, D, starts, alphas = problem(rng, [13, 12, 13, 12], 6, 10)
    merges = tree_merges(2, 0, 4)
    wide = np.zeros((D.shape[0], 20), np.float32)
    wide[:, ::2] = D
    strided = wide[:, ::2]  # D's values, each row's elements 8 bytes apart
    a_parts, d_parts = (A[:25], A[25:]), (D[:25], strided[25:])
    parts_starts = [[0, 13, 25, 25, 25], [0, 0, 0, 13, 25]]
    for d in (d_parts, strided):
        a = a_parts if isinstance(d, tuple) else A
        at = parts_starts if isinstance(d, tuple) else starts
        out = NB.block_outer_sum(a, d, at, merges, alphas, np.empty((6, 10), np.float32))
        assert_sums_close(out, sum(al * A[s:e].astype(np.float64).T @ D[s:e] for s, e, al in
                                   zip(starts[:-1], starts[1:], alphas)), A, D, starts, alphas, "strided D")
    p0 = rng.standard_normal((6, 10)).astype(np.float32)
    room = np.zeros((2, 6, 20), np.float32)
    p, v = room[0, :, ::2], room[1, :, ::2]  # out and the velocity every other column
    p[...] = p0
    NB.block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, 0.5, 0.9)
    g = sum(al * A[s:e].astype(np.float64).T @ D[s:e] for s, e, al in zip(starts[:-1], starts[1:], alphas))
    assert_sums_close(v, -0.5 * g, A, D, starts, [0.5 * a for a in alphas], "strided velocity")
    assert np.allclose(p, p0 + v, rtol=0, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_chain_rows_of_a_kept_table_are_its_longest_chain(parts, blocks, seed):
    """The longest chain (a block's rows of every part) of a table of starts that
    part_offsets keeps, found again by its identity, is the one NumPy finds in the table,
    and so is that of a table it does not keep."""
    from aepar.kernels.ref.blocksum import chain_rows, part_offsets
    rng = np.random.default_rng(seed)
    table = np.concatenate([np.zeros((parts, 1), np.int64),
                            np.cumsum(rng.integers(0, 40, (parts, blocks)), axis=1)], axis=1)
    want = int(np.diff(table, axis=1).sum(axis=0).max())
    kept = part_offsets(table, table[:, -1].tolist())
    assert kept is not None and kept is part_offsets(table.tolist(), table[:, -1].tolist())
    assert chain_rows((), kept) == want
    assert chain_rows((), table.copy()) == want


@pytest.mark.parametrize("sizes, one", [([13, 12, 0, 13], False), ([120, 129, 128, 200, 64], False),
                                        ([200, 300], False), ([100], True), ([300], True)],
                         ids=["small", "either-side", "large", "one-small", "one-large"])
@pytest.mark.parametrize("name", kernel_set_params()[1:])
def test_gpu_blocks_sum_each_blocks_own_product(name, sizes, one, rng, monkeypatch):
    """The GPU set takes each block's product by the block's own rows: its row kernels (the
    CPU's bits) up to twice ``MAX_ROWS`` rows (the sizes are scaled to it), cuBLAS above,
    all in one launch where every block is small. So a call's sum is the blocks' products
    alone added in the tree, on either side of that bound: what ranks sharing a batch rely
    on. Where the row kernels take every block, also in bands of columns (each element's sum
    is its own); cuBLAS picks its kernel by the product's shape, so a band of its product
    may differ in bits (seen on an H200: one 300-row block), and a GPU rank never cuts a
    product into bands (one thread: one band). Which blocks took the row kernels is checked
    too: the emulated GPU's cuBLAS sums small products in the row kernels' order, so its
    bits alone would not tell."""
    import cupy as cp

    gpu_blocksum = importlib.import_module("aepar.kernels.cp.blocksum")
    sizes, bound = gpu_rows(sizes)
    factor_rows = 2 * bound  # a block's factors stack two of its chains

    by_rows = []  # each block the row kernels summed, by its rows

    def spy(A, D, starts, merges, alphas, out, real=gpu_blocksum.rows_block_outer_sum):
        by_rows.extend(np.diff(starts).tolist())
        return real(A, D, starts, merges, alphas, out)
    monkeypatch.setattr(gpu_blocksum, "rows_block_outer_sum", spy)
    K = kernels.load(name)
    count = len(sizes)
    A, D, starts, alphas = problem(rng, sizes, 37, 45)
    alphas = [1.0] if one else alphas
    merges = tree_merges(tree_top(count), 0, count)
    out = cp.full((38, 45), 7.0, np.float32)  # a row past out: must stay
    K.block_outer_sum(cp.asarray(A), cp.asarray(D), starts, merges, alphas, out[:37])
    assert by_rows == [n for n in sizes if n <= factor_rows]
    leaves = [K.block_outer_sum(cp.asarray(A[s:e]), cp.asarray(D[s:e]), [0, e - s], [0], [a],
                                cp.empty((37, 45), np.float32)) for s, e, a in zip(starts[:-1], starts[1:], alphas)]
    assert np.array_equal(to_host(out[:37]), tree_sum([np.array(to_host(leaf)) for leaf in leaves]))  # (adds in place)
    assert np.all(to_host(out[37]) == 7.0)
    for (s, e), leaf, alpha in zip(zip(starts[:-1], starts[1:]), leaves, alphas):
        if e - s <= factor_rows and CPU_FMA:  # (a CPU without FMA rounds each product: other bits)
            cpu = NB.block_outer_sum(A[s:e], D[s:e], [0, e - s], [0], [alpha], np.empty((37, 45), np.float32))
            assert np.array_equal(to_host(leaf).view(np.int32), cpu.view(np.int32))
    if all(n <= factor_rows for n in sizes):  # bands of a cuBLAS product: see the docstring
        bands = cp.empty((37, 45), np.float32)
        for lo, hi in ((0, 20), (20, 37)):
            K.block_outer_sum(cp.asarray(A)[:, lo:hi], cp.asarray(D), starts, merges, alphas, bands[lo:hi])
        assert np.array_equal(to_host(bands), to_host(out[:37]))
    assert_sums_close(out[:37], REF.block_outer_sum(A, D, starts, merges, alphas, np.empty((37, 45), np.float32)),
                      A, D, starts, alphas, name)


@pytest.mark.parametrize("sizes, parts, fused", [([13, 12, 0, 13], 1, True), ([13, 12, 0, 13], 2, True),
                                                 ([60, 64, 65, 100], 1, True), ([60, 64, 65, 100], 2, False),
                                                 ([200, 30], 1, False), ([25], 1, True)],
                         ids=["small", "small-parts", "one-part-bound", "parts-either-side", "large", "one-block"])
@pytest.mark.parametrize("name", kernel_set_params()[1:])
def test_gpu_step_with_the_sum_is_the_sum_then_the_step(name, sizes, parts, fused, rng, monkeypatch):
    """The GPU set's block_outer_sum_sgd: where its row kernels take every block (of at most
    twice ``MAX_ROWS`` rows by all its parts; the sizes are scaled to it), the sum and the
    step in one launch; else the sum, then the step. Either way the bits of its
    block_outer_sum and then its sgd_momentum_update, signed zeros included, and nothing
    written past p or v."""
    import cupy as cp

    gpu_blocksum = importlib.import_module("aepar.kernels.cp.blocksum")
    sizes, _ = gpu_rows(sizes)
    launches = []

    def spy(*args, real=gpu_blocksum.rows_block_outer_sum_sgd):
        launches.append(1)
        return real(*args)
    monkeypatch.setattr(gpu_blocksum, "rows_block_outer_sum_sgd", spy)
    K = kernels.load(name)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    m, n = 37, 45
    A = tuple(cp.asarray(rng.standard_normal((int(starts[-1]), m)).astype(np.float32)) for _ in range(parts))
    D = tuple(cp.asarray(rng.standard_normal((int(starts[-1]), n)).astype(np.float32)) for _ in range(parts))
    A[0][: int(starts[-1]) // 3] = 0  # some sums -0 or 0
    A, D = (A[0], D[0]) if parts == 1 else (A, D)
    alphas = [1.0] if len(sizes) == 1 else list(rng.standard_normal(len(sizes)))
    merges = tree_merges(tree_top(len(sizes)), 0, len(sizes))
    p0 = rng.standard_normal((m + 1, n)).astype(np.float32)
    v0 = rng.standard_normal((m + 1, n)).astype(np.float32)
    p0[:m][rng.random((m, n)) < 0.2], v0[:m][rng.random((m, n)) < 0.2] = -0.0, 0.0
    p, v = cp.asarray(p0), cp.asarray(v0)
    assert K.block_outer_sum_sgd(A, D, starts, merges, alphas, p[:m], v[:m], 0.1, 0.9, 2e-4) is None
    assert len(launches) == int(fused)
    g = K.block_outer_sum(A, D, starts, merges, alphas, cp.empty((m, n), np.float32))
    p2, v2 = cp.asarray(p0[:m]), cp.asarray(v0[:m])
    K.sgd_momentum_update(p2, g, v2, 0.1, 0.9, 2e-4)
    assert to_host(p[:m]).tobytes() == to_host(p2).tobytes() and to_host(v[:m]).tobytes() == to_host(v2).tobytes()
    assert to_host(p[m]).tobytes() == p0[m].tobytes() and to_host(v[m]).tobytes() == v0[m].tobytes()
    with pytest.raises(ValueError):
        K.block_outer_sum_sgd(A, D, starts, merges, alphas, p[:m], v[:m, :n - 1], 0.1, 0.9)


@pytest.mark.parametrize("count, fold", [(1, False), (2, False), (5, False), (8, False), (8, True)])
@pytest.mark.parametrize("name", ["numpy"] + kernel_set_params())
def test_rows_tree_sum_is_the_rows_added_in_the_tree(name, count, fold, rng):
    """rows_tree_sum adds a strided 2-D view's rows (the trainer's blocks' filled slices)
    in the postfix tree, left + right, into its first row, the bits of NumPy's additions
    row by row (aepar.rows.tree_sum); nothing outside the view is written."""
    K = kernels.load(name)
    xp = np
    if name == "cupy":
        import cupy as xp
    merges = [0] + [1] * (count - 1) if fold else tree_merges(tree_top(count), 0, count)
    for dtype in (np.float32, np.float64):
        whole = rng.standard_normal((count, 50)).astype(dtype)
        want = whole[:, 20:47].copy()
        if fold:
            total = want[0].copy()
            for row in want[1:]:
                total += row
        else:
            total = tree_sum([row.copy() for row in want])
        rows = xp.asarray(whole)
        got = K.rows_tree_sum(rows[:, 20:47], merges)
        assert np.array_equal(to_host(got).view(np.uint8), total.view(np.uint8))
        after = to_host(rows)
        assert np.array_equal(after[:, :20], whole[:, :20]) and np.array_equal(after[:, 47:], whole[:, 47:])
    with pytest.raises(ValueError, match="postfix tree"):
        K.rows_tree_sum(xp.zeros((3, 4)), [0, 1])


@pytest.mark.parametrize("layout", ["c", "strided"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("count", [1, 3, 8])
@pytest.mark.parametrize("name", ["numpy"] + kernel_set_params())
def test_blocks_sgd_step_is_the_trainers_tree_and_step(name, count, dtype, layout, rng):
    """blocks_sgd_step: the bits of block_outer_sum_sgd for W, then rows_tree_sum of the
    bias rows (the columns after the biases' too, returned with the rest) and
    sgd_momentum_update of each bias with its columns of the sum (the data-parallel
    trainer's calls), signed zeros included; strided biases take the kernels one by one,
    with the same bits."""
    K = kernels.load(name)
    xp = np
    if name == "cupy":
        import cupy as xp
    A, D, starts, alphas = problem(rng, list(rng.integers(1, 20, count)), 30, 12, dtype)
    merges = tree_merges(tree_top(count), 0, count)
    rows = rng.standard_normal((count, 30 + 12 + 2)).astype(dtype)  # two more columns: sums added, not stepped
    rows[:, :5] = 0.0  # sums of +0
    params = [rng.standard_normal(s).astype(dtype) for s in ((30, 12), (30,), (12,))]
    velocities = [rng.standard_normal(p.shape).astype(dtype) for p in params]
    velocities[1][:4] = -0.0
    lr, momentum, decay = 0.1, 0.9, 2e-4

    def on_device(arrays):  # fresh copies; with "strided", the biases every second element of a longer array
        out = []
        for a in arrays:
            if layout == "strided" and a.ndim == 1:
                wide = xp.zeros((a.shape[0], 2), a.dtype)
                wide[:, 0] = xp.asarray(a)
                out.append(wide[:, 0])
            else:
                out.append(xp.array(a))
        return out

    (W, bv, bh), (vW, vbv, vbh) = on_device(params), on_device(velocities)
    got = K.blocks_sgd_step(xp.asarray(A), xp.asarray(D), starts, merges, alphas, W, vW, xp.array(rows), (bv, bh),
                            (vbv, vbh), lr, momentum, decay)
    (W2, bv2, bh2), (vW2, vbv2, vbh2) = on_device(params), on_device(velocities)
    K.block_outer_sum_sgd(xp.asarray(A), xp.asarray(D), starts, merges, alphas, W2, vW2, lr, momentum, decay)
    total = K.rows_tree_sum(xp.array(rows), merges)
    K.sgd_momentum_update(bv2, total[:30], vbv2, lr, momentum, 0.0)
    K.sgd_momentum_update(bh2, total[30:42], vbh2, lr, momentum, 0.0)
    assert to_host(got).tobytes() == to_host(total).tobytes()  # the rows' sum, the other sums with it
    for g, w in zip((W, bv, bh, vW, vbv, vbh), (W2, bv2, bh2, vW2, vbv2, vbh2)):
        assert to_host(g).tobytes() == to_host(w).tobytes()


@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_blocks_sgd_step_refuses_bias_rows_that_do_not_fit(name, rng):
    K = kernels.load(name)
    A, D, starts, alphas = problem(rng, [3, 4, 5], 6, 4)
    merges = tree_merges(tree_top(3), 0, 3)
    W, vW = np.zeros((6, 4), np.float32), np.zeros((6, 4), np.float32)
    bv, bh = np.zeros(6, np.float32), np.zeros(4, np.float32)
    for rows, biases, velocities, match in ((np.zeros((2, 10), np.float32), (bv, bh), (bv, bh), "a row per block"),
                                            (np.zeros((3, 9), np.float32), (bv, bh), (bv, bh), "a column per element"),
                                            (np.zeros(30, np.float32), (bv, bh), (bv, bh), "a row per block"),
                                            (np.zeros((3, 10), np.float32), (bv, bh), (bv,), "velocities"),
                                            (np.zeros((3, 10), np.float32), (bv, bh), (bv, bv), "velocities")):
        with pytest.raises(ValueError, match=match):
            K.blocks_sgd_step(A, D, starts, merges, alphas, W, vW, rows, biases, velocities, 0.1, 0.9)
    with pytest.raises(ValueError, match="postfix tree"):
        K.blocks_sgd_step(A, D, starts, [0, 1, 1, 0], alphas, W, vW, np.zeros((3, 10), np.float32), (bv, bh),
                          (bv, bh), 0.1, 0.9)
