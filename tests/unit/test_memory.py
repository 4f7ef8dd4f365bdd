"""Arrays on a cache line's boundary: aepar.kernels.memory, the CPU backend's parameters
and buffers, the data-parallel gradient rows, and the numba kernels' vector operands.

Alignment never changes a result (the bits are checked by the kernels' and trainers' own
tests); these check that the arrays the kernels load as vectors start on a 64-byte line."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import backend
from aepar.kernels import memory
from aepar.models.rbm import RBM
from aepar.models.stacked import StackedAutoencoder
from aepar.optim import SGD, Adam
from aepar.parallel.data_parallel import train_epoch
from aepar.rows import Shard

DTYPES = [np.float32, np.float64, np.int32, np.uint8, np.complex128]


def _line(a) -> bool:
    return a.ctypes.data % 64 == 0


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple), dtype=st.sampled_from(DTYPES),
       zeros=st.booleans())
def test_empty_and_zeros_are_c_arrays_of_the_shape_on_a_line(shape, dtype, zeros):
    a = (memory.zeros if zeros else memory.empty)(shape, dtype)
    assert a.shape == shape and a.dtype == dtype
    assert a.flags.c_contiguous and a.flags.writeable
    assert _line(a) or a.size == 0
    if zeros:
        assert not a.any()
    a[...] = 1  # writable over its whole extent
    assert a.sum() == a.size


def test_an_int_shape_is_one_dimension():
    assert memory.empty(7, np.float32).shape == (7,)
    assert memory.zeros(np.int64(3)).shape == (3,)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 9), offset=st.integers(0, 15), step=st.sampled_from([1, 2]),
       dtype=st.sampled_from([None, np.float32, np.float64]))
def test_aligned_copies_only_what_is_not_a_c_array_on_a_line(rows, cols, offset, step, dtype):
    base = np.arange(offset + rows * cols * step, dtype=np.float64)
    a = base[offset:offset + rows * cols * step:step].reshape(rows, cols)
    out = memory.aligned(a, dtype)
    assert _line(out) and out.flags.c_contiguous
    assert out.dtype == (a.dtype if dtype is None else dtype)
    np.testing.assert_array_equal(out, a.astype(out.dtype))
    # one element taken with a step is still a C array: numpy calls it contiguous
    same = a.flags.c_contiguous and _line(a) and out.dtype == a.dtype
    assert (out is a) == same
    assert memory.aligned(out) is out


def test_the_cpu_backend_gives_arrays_on_a_line():
    be = backend.select("cpu", "numba", "float32")
    misplaced = np.zeros(17, np.float32)[1:]  # 4 bytes past a line at best
    assert not _line(misplaced)
    for a in (be.zeros((3, 5)), be.zeros(9, np.float64), be.asarray(misplaced), be.asarray([[1, 2], [3, 4]])):
        assert _line(a) and a.flags.c_contiguous
    assert be.asarray(misplaced).dtype == np.float32
    good = be.zeros((4, 4))
    assert be.asarray(good) is good  # no copy of an array that is already right


@pytest.mark.parametrize("kind", ["rbm", "stacked"])
def test_models_optimisers_and_gradient_rows_start_on_a_line(kind):
    """The weights, the optimisers' state, and every gradient in every block's row of the
    data-parallel buffers (the rows the kernels write the weight gradients into)."""
    be = backend.select("cpu", "numba", "float32")
    x = (np.random.default_rng(0).random((64, 30)) < 0.3).astype(np.float32)
    model = RBM(be, 30, 20, batch=16) if kind == "rbm" else StackedAutoencoder(be, [30, 20, 10], batch=16)
    for p in model.params.values():
        assert _line(p)
    for opt in (SGD(be, model.params, 0.1, 0.5), Adam(be, model.params)):
        for state in opt.state().values():
            if isinstance(state, np.ndarray) and state.ndim:
                assert _line(state)
    train_epoch(model, Shard.of(be, x, 4), 0, optimizer=Adam(be, model.params) if kind == "stacked" else None)
    buf = model._dp_buffers
    for row in list(buf.leaves) + [buf.total]:
        for name, g in buf.views(row).items():
            assert _line(g), name


def test_numba_kernels_hand_their_vector_operands_aligned():
    """rbm_cd_factors' factors and dense_backward_factors' dz: block_outer_sum and
    rows_times_t load them as vectors."""
    be = backend.select("cpu", "numba", "float32")
    rng = np.random.default_rng(1)
    x = rng.random((13, 784), dtype=np.float32)
    W = be.asarray(0.1 * rng.standard_normal((784, 1000)))
    bv, bh = be.zeros(784), be.zeros(1000)
    noise = rng.random((1, 13, 1000), dtype=np.float32)
    vs, hs, _, _ = be.K.rbm_cd_factors(x, W, bv, bh, noise, "bernoulli", be.zeros(784), be.zeros(1000), 1 / 13)
    assert _line(vs) and _line(hs)
    a = rng.random((13, 1000), dtype=np.float32)
    _, dz = be.K.dense_backward_factors(rng.random((13, 1000), dtype=np.float32), x, W, a, "sigmoid",
                                        be.zeros(1000))
    assert _line(dz)
