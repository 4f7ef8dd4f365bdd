"""Fully connected layer a = act(x @ W + b), forward and backward, and a tied autoencoder
layer's whole step (Numba).

The products go to BLAS (numpy's matmul, and gemm with beta = 1 so that dW accumulates
without a temporary, both without holding the GIL); the element-wise work around them is one fused
pass each way: bias + activation in place on the matmul output, and
da * act'(a) together with the column sums that make db.
"""

import sys

import numpy as np
from numba import njit

from ..memory import empty
from ..ref.blocksum import check_blocks_tree, most_rows, offsets
from ..ref.dense import (_check_backward_shapes, _check_shapes, _check_starts, check_tied_ae,
                         tied_ae_factors_blocks_via, tied_ae_update_blocks_via, tied_ae_update_via)
# the scalar activations are activation.py's: the package keys Numba's cache on every file
# here (kernels/nb/__init__.py), so an edit there recompiles these kernels too
from .activation import IDENTITY, RELU, SIGMOID, act_code
from .activation import relu as _relu
from .activation import relu_grad as _relu_grad
from .activation import sigmoid as _sigmoid
from .blas import gemm
from .loss import _sq_diff_sums
from .rowprod import (LONG_ROWS, MAX_ROWS, _rows_times, _scratch, rows_times, rows_times_t, tables_sgd_step, thin,
                      w_panels, wt_panel)

__all__ = ["dense_forward", "dense_backward", "dense_backward_factors", "dense_forward_blocks",
           "dense_backward_blocks", "tied_ae_update", "tied_ae_factors_blocks", "tied_ae_update_blocks"]

@njit(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})
def _bias_act(z, b, code, one):
    """z = act(z + b) in place. Serial, as every pass here: aepar's own threads take whole
    groups of blocks (aepar.rows) and Numba runs one thread in each (aepar._threads), so a
    parallel region would only add its launch."""
    zero = one - one
    n, m = z.shape
    if code == SIGMOID:
        for i in range(n):
            for j in range(m):
                z[i, j] = _sigmoid(z[i, j] + b[j], one)
    elif code == RELU:
        for i in range(n):
            for j in range(m):
                z[i, j] = _relu(z[i, j] + b[j], zero)
    else:
        for i in range(n):
            for j in range(m):
                z[i, j] += b[j]


# row blocks of the bias gradient's column sums (a fixed split: the same sums on any threads)
COLSUM_BLOCKS = 4


@njit(cache=True, nogil=True)
def _act_grad_colsum(da, a, code, one, nblock, dz, db):
    """dz = da * act'(a) and db += column sums of dz, in one pass.

    Each of ``nblock`` (>= 1) blocks of rows sums into its own float64 row, then the rows
    are added: the order of the sums, which depends on the rows alone
    (:data:`COLSUM_BLOCKS`), never on threads (the loop was parallel once; kept so).
    """
    n, m = da.shape
    zero = one - one
    part = np.zeros((nblock, m), dtype=np.float64)
    for c in range(nblock):
        lo, hi = c * n // nblock, (c + 1) * n // nblock
        if code == SIGMOID:
            for i in range(lo, hi):
                for j in range(m):
                    g = da[i, j] * a[i, j] * (one - a[i, j])
                    dz[i, j] = g
                    part[c, j] += g
        else:
            for i in range(lo, hi):
                for j in range(m):
                    g = _relu_grad(da[i, j], a[i, j], zero)
                    dz[i, j] = g
                    part[c, j] += g
    for c in range(nblock):
        for j in range(m):
            db[j] += part[c, j]


def _add_xt_dz(x, dz, dW):
    """dW += x.T @ dz, with BLAS adding into dW where it lies (gemm, beta = 1).

    gemm works on Fortran-ordered matrices: a C-ordered dW is the Fortran-ordered
    (out, in) matrix dW.T, which receives dz.T @ x; a Fortran-ordered dW (a transposed
    view) receives x.T @ dz directly. Any other layout or mixed dtypes: a temporary.
    """
    if dW.dtype not in (np.float32, np.float64) or not dW.flags.writeable or not x.dtype == dz.dtype == dW.dtype:
        dW += x.T @ dz
    elif dW.flags.c_contiguous:
        gemm(1.0, dz.T, x.T, 1.0, dW.T, trans_b=1)
    elif dW.flags.f_contiguous:
        gemm(1.0, x.T, dz.T, 1.0, dW, trans_b=1)
    else:
        dW += x.T @ dz


def dense_forward(x, W, b, act):
    """a = act(x @ W + b); bias and activation fused, in place on the matmul output.

    Parameters
    ----------
    x : ndarray (batch, in)
    W : ndarray (in, out)
    b : ndarray (out,)
    act : {"sigmoid", "relu", "identity"}

    Returns
    -------
    ndarray (batch, out), a new array.
    """
    code = act_code(act)
    _check_shapes(x, W, b)
    z = _times(x, W)
    _bias_act(z, np.ascontiguousarray(b, dtype=z.dtype), code, z.dtype.type(1))
    return z


def dense_backward(da, x, W, a, act, dW, db, need_dx=True):
    """Backward of :func:`dense_forward` from its output ``a``.

    Adds x.T @ dz into ``dW`` and the column sums of dz into ``db`` (caller-zeroed),
    with dz = da * act'(a). Returns dx = dz @ W.T, or None when ``need_dx`` is false.
    """
    _check_backward_shapes(da, x, W, a, dW, db)
    dx, dz = dense_backward_factors(da, x, W, a, act, db, need_dx)
    _add_xt_dz(x, dz, dW)
    return dx


def dense_backward_factors(da, x, W, a, act, db, need_dx=True):
    """:func:`dense_backward` without its weight product: adds the column sums of dz into
    ``db``, returns (dx or None, dz) with the W gradient x.T @ dz (see kernels.ref.dense)."""
    code = act_code(act)
    _check_backward_shapes(da, x, W, a, W, db)
    dz = _dz(da, a, code, [db], (0, da.shape[0]))
    if not need_dx:
        return None, dz
    return _times(dz, W.T), dz


def dense_forward_blocks(x, W, b, act, starts):
    """:func:`kernels.ref.dense.dense_forward_blocks`: every block's rows in one call of the
    row kernel when each block alone would take it (a row's sums do not depend on the other
    rows of the call; eight calls per layer are a sizeable part of a batch's fine-tuning
    passes), else block by block into its rows of the result (stacking the
    blocks' own results afterwards copied both layers' activations once more a step);
    the bias and activation are one pass (element by element: the same bits)."""
    _check_starts(x, starts)
    _check_shapes(x, W, b)
    z = blocks_times(x, W, empty((x.shape[0], W.shape[1]), np.result_type(x, W)), starts)
    _bias_act(z, np.ascontiguousarray(b, dtype=z.dtype), act_code(act), z.dtype.type(1))
    return z


def dense_backward_blocks(da, x, W, a, act, dbs, starts, need_dx=True):
    """:func:`kernels.ref.dense.dense_backward_blocks`: dz block by block (each block's
    column sums its own), dx in one call of the row kernel when each block alone would
    take it."""
    _check_starts(x, starts, dbs)
    code = act_code(act)
    for k, db in enumerate(dbs):  # the whole check once, then the shapes that differ
        if k == 0 or db.shape != dbs[0].shape:
            _check_backward_shapes(da, x, W, a, W, db)
    dz = _dz(da, a, code, dbs, starts)
    if not need_dx:
        return None, dz
    return blocks_times(dz, W.T, empty((dz.shape[0], W.shape[0]), np.result_type(dz, W)), starts), dz


def tied_ae_update(x, W, bv, bh, code_act, vW, vbv, vbh, lr, momentum, weight_cost):
    """:func:`kernels.ref.dense.tied_ae_update` with this set's kernels, in the blocked
    trainer's order: its bits, without the trainer's work around a step."""
    check_tied_ae(x, W, bv, bh, code_act, vW, vbv, vbh)
    return tied_ae_update_via(sys.modules[__package__], x, W, bv, bh, code_act, vW, vbv, vbh,
                              lr, momentum, weight_cost)


def tied_ae_update_blocks(x, W, bv, bh, code_act, starts, merges, vW, vbv, vbh, lr, momentum, weight_cost, scale):
    """The blocks' step of a tied autoencoder layer, in place; see
    :func:`kernels.ref.dense.tied_ae_update_blocks`. Where every block takes the row kernels
    (as :func:`tied_ae_factors_blocks`' one call) and the parameters are float32, C-ordered
    and writeable, as :func:`kernels.nb.rbm.rbm_cd_update_blocks` takes CD-1: the blocks'
    pass in one compiled call (:func:`_tied_ae_blocks`, the bias gradients into two tables,
    a row a block), W's tree and step in another (``block_outer_sum_sgd``'s tiles), each
    bias's tree and step in one more (:func:`.rowprod.tables_sgd_step`). The bits of
    ``tied_ae_update_blocks_via``, without its table of views, each kernel's checks and the
    Python around each call (most of a narrow layer's step). Anything else: that."""
    check_tied_ae(x, W, bv, bh, code_act, vW, vbv, vbh)
    starts, merges = check_blocks_tree("tied_ae_update_blocks", x.shape[0], starts, merges)
    found = _one_call_blocks(x, W, bv, bh, code_act, starts)
    if found is None or 2 * found.most_rows > LONG_ROWS or not all(
            a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable for a in (W, bv, bh, vW, vbv, vbh)):
        return tied_ae_update_blocks_via(sys.modules[__package__], np, x, W, bv, bh, code_act, starts, merges, vW,
                                         vbv, vbh, lr, momentum, weight_cost, scale)
    s, blocks = found.array, found.array.size - 1
    # each block's bias gradients summed into its zeroed row, as into the trainer's rows
    gv, gh = np.zeros((blocks, W.shape[0]), np.float32), np.zeros((blocks, W.shape[1]), np.float32)
    sums, dz2, dz1, h = _factors_in_one_call(x, W, bv, bh, code_act, gv, gh, s, scale)
    return tables_sgd_step((x, dz2), (dz1, h), s, merges, W, vW, (gv, gh), (bv, bh), (vbv, vbh), sums, lr, momentum,
                           weight_cost)


def tied_ae_factors_blocks(x, W, bv, bh, code_act, dbvs, dbhs, starts, scale):
    """:func:`kernels.ref.dense.tied_ae_factors_blocks`. Where every block takes the row
    kernels (float32, C-contiguous, at most MAX_ROWS rows a block, sigmoid or identity
    code units, each block's bias gradients of one type), the whole pass is one compiled
    call (:func:`_tied_ae_blocks`) of the kernels the block kernels call, in their
    order: the same bits, without the Python between five kernel calls (which a second
    thread's group waits for, under the interpreter lock) and with W's column panels
    copied once for its two products. Anything else: the block kernels one by one."""
    dbvs, dbhs = tuple(dbvs), tuple(dbhs)
    found = _one_call_blocks(x, W, bv, bh, code_act, starts)
    if found is None or not _bias_rows_fit(found, dbvs, dbhs, W.shape):
        return tied_ae_factors_blocks_via(sys.modules[__package__], x, W, bv, bh, code_act, dbvs, dbhs, starts, scale)
    sums, dz2, dz1, h = _factors_in_one_call(x, W, bv, bh, code_act, dbvs, dbhs, found.array, scale)
    return [2.0 * 0.5 * float(total) for total in sums.tolist()], dz2, dz1, h  # as mse_forward_blocks(scale=2.0)


def _factors_in_one_call(x, W, bv, bh, code_act, dbvs, dbhs, s, scale):
    """:func:`_tied_ae_blocks` on arrays :func:`_one_call_blocks` took, the blocks'
    offsets ``s``: block k's bias gradients added into ``dbvs[k]`` and ``dbhs[k]`` (a
    tuple of arrays or the rows of one). Returns (each block's Σ‖x̂ − x‖² as float64 sums,
    dz2, dz1, h)."""
    (m, n_in), n_out = x.shape, W.shape[1]
    h, dz2, dz1 = empty((m, n_out), np.float32), empty((m, n_in), np.float32), empty((m, n_out), np.float32)
    # what no result refers to: this thread's scratch
    y, dy, dh = (_scratch(f"tied ae {name}", m * n).reshape(m, n) for name, n in (("y", n_in), ("dy", n_in),
                                                                                   ("dh", n_out)))
    panel, keeps = w_panels(m, W, True)
    sums = np.empty(s.size - 1)
    _tied_ae_blocks(x, W, bv, bh, act_code(code_act), s, s * n_in, float(scale), dbvs, dbhs, h, y, dy, dz2, dh, dz1,
                    sums, panel, keeps, wt_panel(W))
    return sums, dz2, dz1, h


def _one_call_blocks(x, W, bv, bh, code_act, starts):
    """The blocks' offsets (:func:`kernels.ref.blocksum.offsets`: ``.array``, int64, and
    ``.most_rows``) where the layer's pass is one compiled call (:func:`_tied_ae_blocks`),
    else None (the block kernels then check the arguments and raise)."""
    arrays = (x, W, bv, bh)
    if code_act not in ("sigmoid", "identity") or not all(isinstance(a, np.ndarray) and a.dtype == np.float32
                                                          and a.flags.c_contiguous for a in arrays):
        return None
    if x.ndim != 2 or W.ndim != 2 or x.shape[1] != W.shape[0] or 0 in x.shape:
        return None
    if bv.shape != (W.shape[0],) or bh.shape != (W.shape[1],):
        return None
    found = offsets(starts)
    if found is None or found.rows != x.shape[0] or found.most_rows > MAX_ROWS:
        return None
    return found


def _bias_rows_fit(found, dbvs, dbhs, shape) -> bool:
    """Whether each tuple of bias gradients holds one array a block, all of one Numba type
    (a tuple of them is then one type), float32 and of the bias's shape."""
    for dbs, n in ((dbvs, shape[0]), (dbhs, shape[1])):
        kinds = {(type(db), db.dtype, db.shape, db.flags.c_contiguous, db.flags.writeable, db.flags.aligned)
                 for db in dbs}
        if len(dbs) != found.array.size - 1 or len(kinds) != 1 \
                or next(iter(kinds))[:3] != (np.ndarray, np.dtype(np.float32), (n,)):
            return False
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def _tied_ae_blocks(x, W, bv, bh, code, starts, bounds, scale, dbvs, dbhs, h, y, dy, dz2, dh, dz1, sums, panel, keeps,
                    tpanel):
    """The blocks' pass of :func:`tied_ae_factors_blocks` in one call: what
    dense_forward_blocks (encoder, decoder), mse_forward_blocks, mse_backward and
    dense_backward_blocks (decoder, then encoder without dx) run, in that order, with
    ``code`` units (SIGMOID or IDENTITY). ``panel`` is W's column panels' room for x @ W
    and dz2 @ W (:func:`kernels.nb.rowprod.w_panels`: with ``keeps`` the second reads what
    the first copied), ``tpanel`` W.T's for h @ W.T; y, dy and dh are scratch."""
    one = np.float32(1)
    _rows_times(x, W, h, panel, False, False)
    _bias_act(h, bh, code, one)
    _rows_times(h, W, y, tpanel, True, False)
    _bias_act(y, bv, SIGMOID, one)
    yf, xf, df = y.reshape(-1), x.reshape(-1), dy.reshape(-1)
    _sq_diff_sums(yf, xf, bounds, sums)
    for i in range(yf.size):  # mse_backward's scaled difference
        df[i] = scale * (yf[i] - xf[i])
    _act_grad_colsum_blocks(dy, y, SIGMOID, one, starts, dz2, dbvs)
    if code == IDENTITY:  # act' = 1: dz1 is dz2 @ W itself, and _dz's column sums
        _rows_times(dz2, W, dz1, panel, False, keeps)
        _colsum64_blocks(dz1, starts, dbhs)
    else:
        _rows_times(dz2, W, dh, panel, False, keeps)
        _act_grad_colsum_blocks(dh, h, code, one, starts, dz1, dbhs)


@njit(cache=True, nogil=True)
def _colsum64_blocks(dz, starts, dbs):
    """dbs[k] += the column sums of block k's rows of dz (the bias gradient of identity
    units): the rows added one after another in float64 (as NumPy's ``sum(axis=0,
    dtype=float64)``, which these bits were before), then added into dbs[k] (rounded
    once to its dtype)."""
    total = np.empty(dz.shape[1])
    for k in range(starts.size - 1):
        total[:] = 0.0
        for i in range(starts[k], starts[k + 1]):
            for j in range(dz.shape[1]):
                total[j] += np.float64(dz[i, j])
        db = dbs[k]
        for j in range(dz.shape[1]):
            db[j] = np.float64(db[j]) + total[j]


def _dz(da, a, code, dbs, starts):
    """dz = da * act'(a), the column sums of block k's rows of dz added into ``dbs[k]``."""
    bounds = zip(starts[:-1], starts[1:], dbs)
    if code == IDENTITY:
        dz = np.ascontiguousarray(da)  # act' = 1: no copy of da needed
        for lo, hi, db in bounds:  # a call per block: the dbs may differ in type
            _colsum64_blocks(dz, np.array([lo, hi], np.int64), (db,))
        return dz
    dtype = np.result_type(da, a)
    dz = empty(da.shape, dtype)  # rows_times_t and block_outer_sum load it as vectors
    da, a = np.ascontiguousarray(da, dtype=dtype), np.ascontiguousarray(a, dtype=dtype)
    dbs = tuple(dbs)
    # every block in one call, where the dbs are of one Numba type (a tuple of them is then one type)
    if len({(db.dtype, db.ndim, db.flags.c_contiguous, db.flags.writeable, db.flags.aligned) for db in dbs}) == 1:
        _act_grad_colsum_blocks(da, a, code, dtype.type(1), np.asarray(starts, np.int64), dz, dbs)
        return dz
    for lo, hi, db in bounds:
        _act_grad_colsum(da[lo:hi], a[lo:hi], code, dtype.type(1), max(1, min(COLSUM_BLOCKS, hi - lo)),
                         dz[lo:hi], db)
    return dz


@njit(cache=True, nogil=True)
def _act_grad_colsum_blocks(da, a, code, one, starts, dz, dbs):
    """:func:`_act_grad_colsum` of each block of rows ``starts[k]:starts[k + 1]`` into
    ``dbs[k]`` (a tuple of arrays of one type, or the rows of a 2-D array), as a call per
    block would."""
    for k in range(starts.size - 1):
        lo, hi = starts[k], starts[k + 1]
        _act_grad_colsum(da[lo:hi], a[lo:hi], code, one, max(1, min(COLSUM_BLOCKS, hi - lo)), dz[lo:hi], dbs[k])


def _row_product(a, W, out, rows=None):
    """out = a @ W by a row kernel of :mod:`.rowprod` when one takes it (see ``thin``), else
    None. W C-contiguous takes rows_times; W a transposed view of a C-contiguous array (a
    tied decoder's weight, or W.T in dx = dz @ W.T) takes rows_times_t on that array, with
    no copy."""
    if thin(a, W, out, rows):
        return rows_times(a, W, out)
    if W.ndim == 2 and thin(a, W.T, out, rows):
        return rows_times_t(a, W.T, out)
    return None


def _times(x, W):
    """x @ W as a new array (:func:`_times_into`), on a 64-byte boundary like every product
    result here: the row kernels store whole vectors into it, and the next layer's
    h @ W.T loads its rows as vectors (unaligned, the AVX2 path's epochs ran slower)."""
    return _times_into(x, W, empty((x.shape[0], W.shape[1]), np.result_type(x, W)))


def _times_into(x, W, out):
    """out = x @ W: a block's few float32 rows through :mod:`.rowprod`, else BLAS."""
    if _row_product(x, W, out) is None:
        np.matmul(x, W, out=out)
    return out


def blocks_times(x, W, out, starts):
    """out = x @ W with each block of rows x[starts[k]:starts[k + 1]] its own bits: all in
    one call of a row kernel when each block alone would take it (a row's sums do not
    depend on the other rows of the call), else block by block into its rows of ``out``."""
    if _row_product(x, W, out, most_rows(starts)) is None:
        for lo, hi in zip(starts[:-1], starts[1:]):
            _times_into(x[lo:hi], W, out[lo:hi])
    return out
