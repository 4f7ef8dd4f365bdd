"""Fully connected layer a = act(x @ W + b), forward and backward, and a tied autoencoder
layer's whole step (NumPy reference)."""
import sys

import numpy as np

from .activation import BACKWARD, FORWARD, check_act
from .blocksum import check_blocks_tree, check_starts, write_column

__all__ = ["dense_forward", "dense_backward", "dense_backward_factors", "dense_forward_blocks",
           "dense_backward_blocks", "tied_ae_update", "tied_ae_factors_blocks", "tied_ae_update_blocks"]


def dense_forward(x, W, b, act):
    """a = act(x @ W + b).

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
    check_act(act)
    _check_shapes(x, W, b)
    z = x @ W
    z += b
    return FORWARD[act](z)


def dense_backward(da, x, W, a, act, dW, db, need_dx=True):
    """Backward of :func:`dense_forward` from its output ``a``.

    Adds x.T @ dz into ``dW`` and the column sums of dz into ``db`` (arrays the caller
    zeroed), where dz = da * act'(a).

    Returns
    -------
    ndarray (batch, in) or None
        dx = dz @ W.T, or None when ``need_dx`` is false (the first layer).
    """
    _check_backward_shapes(da, x, W, a, dW, db)
    dx, dz = dense_backward_factors(da, x, W, a, act, db, need_dx)
    dW += x.T @ dz
    return dx


def dense_backward_factors(da, x, W, a, act, db, need_dx=True):
    """:func:`dense_backward` without its weight product, for a caller that adds many
    blocks' products at once (``block_outer_sum``): adds the column sums of dz into ``db``
    and returns (dx or None, dz), the W gradient being x.T @ dz."""
    check_act(act)
    _check_backward_shapes(da, x, W, a, W, db)
    dz = BACKWARD[act](da, a)
    db += dz.sum(axis=0, dtype=np.float64)
    return (dz @ W.T if need_dx else None), dz


def dense_forward_blocks(x, W, b, act, starts):
    """:func:`dense_forward` of each block of rows x[starts[k]:starts[k + 1]], returned
    stacked as one array with the bits of the blocks one by one (a compiled set runs them
    in one call where its kernel's rows do not depend on one another)."""
    return forward_by_block(dense_forward, np, x, W, b, act, starts)


def dense_backward_blocks(da, x, W, a, act, dbs, starts, need_dx=True):
    """:func:`dense_backward_factors` of each block of stacked rows (as
    :func:`dense_forward_blocks`), block k's column sums of dz added into ``dbs[k]``.
    Returns (dx or None, dz), both stacked."""
    return backward_by_block(dense_backward_factors, np, da, x, W, a, act, dbs, starts, need_dx)


def tied_ae_update(x, W, bv, bh, code_act, vW, vbv, vbh, lr, momentum, weight_cost):
    """One training step of a tied-weight autoencoder layer on one batch, in place.

    h = code_act(x @ W + bh), x̂ = sigmoid(h @ W.T + bv); the gradient g of
    ½ Σ(x̂ − x)² / batch (W's from the encoder and the decoder, x.T @ dz1 + dz2.T @ h),
    ``weight_cost * W`` added to W's, applied as ``v = momentum * v - lr * g; p += v`` to
    W, bv and bh (:func:`kernels.ref.update.sgd_momentum_update`). Returns Σ‖x̂ − x‖² of
    the batch before the step. It is the blocked trainer's step of a single block (the
    same kernels in the same order: :func:`tied_ae_update_via`), which the GPU set fuses.

    Parameters
    ----------
    x : (batch, n_in); W : (n_in, n_out); bv : (n_in,); bh : (n_out,)
    code_act : {"sigmoid", "identity"}
    vW, vbv, vbh : the velocities, shaped as W, bv, bh; updated with them
    lr, momentum, weight_cost : float
    """
    check_tied_ae(x, W, bv, bh, code_act, vW, vbv, vbh)
    return tied_ae_update_via(sys.modules[__package__], x, W, bv, bh, code_act, vW, vbv, vbh,
                              lr, momentum, weight_cost)


def tied_ae_factors_blocks(x, W, bv, bh, code_act, dbvs, dbhs, starts, scale):
    """A tied-weight autoencoder layer's forward and backward pass over blocks of stacked
    rows x[starts[k]:starts[k + 1]], each block with the bits it would have alone.

    h = code_act(x @ W + bh), x̂ = sigmoid(h @ W.T + bv); the gradient of
    ``scale`` * ½ Σ(x̂ − x)²: block k's bias gradients added into ``dbvs[k]`` and
    ``dbhs[k]``, W's left as its factors, x.T @ dz1 + dz2.T @ h over each block's rows (the
    data-parallel trainer adds them in its tree). Returns ([Σ‖x̂ − x‖² per block], dz2,
    dz1, h), the arrays stacked. The set's own block kernels one after another
    (:func:`tied_ae_factors_blocks_via`); the numba set runs them in one compiled call
    where every block takes its row kernels."""
    return tied_ae_factors_blocks_via(sys.modules[__package__], x, W, bv, bh, code_act, dbvs, dbhs, starts, scale)


def tied_ae_factors_blocks_via(K, x, W, bv, bh, code_act, dbvs, dbhs, starts, scale):
    """:func:`tied_ae_factors_blocks` with a kernel set ``K``'s dense and loss block kernels."""
    Wt = W.T  # the tied decoder's weight, a view: the kernels take it as it is
    h = K.dense_forward_blocks(x, W, bh, code_act, starts)
    y = K.dense_forward_blocks(h, Wt, bv, "sigmoid", starts)
    sq_errs = K.mse_forward_blocks(y, x, starts, scale=2.0)
    dh, dz2 = K.dense_backward_blocks(K.mse_backward(y, x, scale=scale), h, Wt, y, "sigmoid", dbvs, starts)
    _, dz1 = K.dense_backward_blocks(dh, x, W, h, code_act, dbhs, starts, need_dx=False)
    return sq_errs, dz2, dz1, h


def tied_ae_update_blocks(x, W, bv, bh, code_act, starts, merges, vW, vbv, vbh, lr, momentum, weight_cost, scale):
    """One training step of a tied-weight autoencoder layer on blocks of stacked rows, in
    place: each block's gradient as :func:`tied_ae_factors_blocks` gives it (block k: rows
    x[starts[k]:starts[k + 1]], ``scale`` times), the blocks' gradients added in the
    postfix tree ``merges`` and applied with ``weight_cost`` on W by
    :func:`.blocksum.blocks_sgd_step`. Returns the blocks' Σ‖x̂ − x‖² added in that tree in
    the parameters' dtype (a NumPy scalar; on the cupy set a 0-d device array). The bits
    of those two kernels one after the other (the data-parallel trainer's, its step sums
    too, for a step whose every block one process holds), in one call."""
    return tied_ae_update_blocks_via(sys.modules[__package__], np, x, W, bv, bh, code_act, starts, merges, vW, vbv,
                                     vbh, lr, momentum, weight_cost, scale)


def tied_ae_update_blocks_via(K, xp, x, W, bv, bh, code_act, starts, merges, vW, vbv, vbh, lr, momentum, weight_cost,
                              scale):
    """:func:`tied_ae_update_blocks` with the kernel set ``K``'s kernels, its table made by
    ``xp``: row k holds block k's gradients of bv and bh, then its error."""
    check_tied_ae(x, W, bv, bh, code_act, vW, vbv, vbh)
    starts, merges = check_blocks_tree("tied_ae_update_blocks", x.shape[0], starts, merges)
    n_in, n, blocks = W.shape[0], W.shape[0] + W.shape[1], starts.size - 1
    rows = xp.zeros((blocks, n + 1), dtype=vbv.dtype)
    sq_errs, dz2, dz1, h = K.tied_ae_factors_blocks(x, W, bv, bh, code_act, [r[:n_in] for r in rows],
                                                    [r[n_in:n] for r in rows], starts, scale)
    write_column(xp, sq_errs, rows[:, n])
    return K.blocks_sgd_step((x, dz2), (dz1, h), starts, merges, [1.0] * blocks, W, vW, rows, (bv, bh), (vbv, vbh),
                             lr, momentum, weight_cost)[n]


def tied_ae_update_via(K, x, W, bv, bh, code_act, vW, vbv, vbh, lr, momentum, weight_cost):
    """:func:`tied_ae_update` spelled out with a kernel set ``K``'s own dense, loss and
    update kernels and the array library's product (the CPU sets' step; the GPU set's for
    odd layouts). ``zeros_like``, ``concatenate`` and ``@`` keep the arrays on the
    parameters' device."""
    batch = x.shape[0]
    Wt = W.T  # the tied decoder's weight, a view
    h = K.dense_forward(x, W, bh, code_act)
    y = K.dense_forward(h, Wt, bv, "sigmoid")
    sq_err = K.mse_forward(y, x, scale=2.0)
    gbv, gbh = np.zeros_like(bv), np.zeros_like(bh)
    dh, dz2 = K.dense_backward_factors(K.mse_backward(y, x, scale=1.0 / batch), h, Wt, y, "sigmoid", gbv)
    _, dz1 = K.dense_backward_factors(dh, x, W, h, code_act, gbh, need_dx=False)
    # W's two parts in one BLAS product: [x; dz2].T @ [dz1; h] = x.T @ dz1 + dz2.T @ h
    gW = np.concatenate([x, dz2]).T @ np.concatenate([dz1, h])
    K.sgd_momentum_update(W, gW, vW, lr, momentum, weight_cost)
    K.sgd_momentum_update(bv, gbv, vbv, lr, momentum, 0.0)
    K.sgd_momentum_update(bh, gbh, vbh, lr, momentum, 0.0)
    return sq_err


def check_tied_ae(x, W, bv, bh, code_act, vW, vbv, vbh):
    """Shapes and the code units of :func:`tied_ae_update` (shared by every set)."""
    if code_act not in ("sigmoid", "identity"):
        raise ValueError(f"tied_ae_update: code units must be sigmoid or identity, not {code_act!r}")
    if x.ndim != 2 or W.ndim != 2 or x.shape[1] != W.shape[0] or x.shape[0] < 1:
        raise ValueError(f"tied_ae_update: x {x.shape} and W {W.shape} do not fit (x: batch >= 1 x n_in, "
                         "W: n_in x n_out)")
    for name, a, want in (("bv", bv, (W.shape[0],)), ("bh", bh, (W.shape[1],)), ("vW", vW, W.shape),
                          ("vbv", vbv, (W.shape[0],)), ("vbh", vbh, (W.shape[1],))):
        if a.shape != want:
            raise ValueError(f"tied_ae_update: {name} must have shape {want}, got {a.shape}")


def forward_by_block(forward, xp, x, W, b, act, starts):
    """``forward`` (a set's dense_forward) block by block, the results stacked by ``xp``."""
    _check_starts(x, starts)
    if len(starts) == 2:
        return forward(x, W, b, act)
    return xp.concatenate([forward(x[lo:hi], W, b, act) for lo, hi in zip(starts[:-1], starts[1:])])


def backward_by_block(backward_factors, xp, da, x, W, a, act, dbs, starts, need_dx):
    """``backward_factors`` (a set's dense_backward_factors) block by block, stacked."""
    _check_starts(x, starts, dbs)
    if len(starts) == 2:
        return backward_factors(da, x, W, a, act, dbs[0], need_dx)
    parts = [backward_factors(da[lo:hi], x[lo:hi], W, a[lo:hi], act, db, need_dx)
             for lo, hi, db in zip(starts[:-1], starts[1:], dbs)]
    dz = xp.concatenate([p[1] for p in parts])
    return (xp.concatenate([p[0] for p in parts]) if need_dx else None), dz


def _check_starts(x, starts, dbs=None):
    """The blocks' offsets must run from 0 to every row of ``x``, never back; one bias
    gradient per block."""
    s = check_starts("dense blocks", x.shape[0], starts)
    if dbs is not None and len(dbs) != s.size - 1:
        raise ValueError(f"dense blocks: {len(dbs)} bias gradients for {s.size - 1} blocks")


def _check_shapes(x, W, b):
    if x.ndim != 2 or W.ndim != 2 or x.shape[1] != W.shape[0]:
        raise ValueError(f"dense: x {x.shape} and W {W.shape} do not chain as (batch, in) @ (in, out)")
    if b.shape != (W.shape[1],):
        raise ValueError(f"dense: b has shape {b.shape}, expected ({W.shape[1]},)")


def _check_backward_shapes(da, x, W, a, dW, db):
    """Shared by every kernel set (the compiled ones index without bounds checks)."""
    _check_shapes(x, W, db)
    want = (x.shape[0], W.shape[1])
    if da.shape != want or a.shape != want:
        raise ValueError(f"dense_backward: da {da.shape} and a {a.shape} must both be {want}")
    if dW.shape != W.shape:
        raise ValueError(f"dense_backward: dW has shape {dW.shape}, expected {W.shape}")
