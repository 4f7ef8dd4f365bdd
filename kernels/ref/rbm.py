"""Restricted Boltzmann machine: free energy, conditionals and CD-k (NumPy reference).

Bernoulli (logistic) visible units; hidden units are ``"bernoulli"`` (logistic) or
``"gaussian"`` (linear with unit-variance noise, Hinton & Salakhutdinov's code layer).
The CD-k recipe (docs/architecture.md, "Training recipes"): hidden *states* are sampled for the
negative phase, reconstructions use probabilities, and statistics use hidden
probabilities (or means). Noise comes from the caller, never from inside the kernel.
"""
import sys

import numpy as np

from .blocksum import check_blocks_tree, check_starts, write_column

__all__ = ["rbm_hidden", "rbm_visible", "rbm_free_energy", "rbm_cd_backward", "rbm_cd_factors",
           "rbm_cd_factors_blocks", "rbm_cd_update", "rbm_cd_update_blocks"]

HIDDEN = ("bernoulli", "gaussian")


def rbm_hidden(v, W, bh, hidden):
    """Hidden probabilities sigmoid(v @ W + bh) ("bernoulli") or means v @ W + bh ("gaussian").

    Parameters
    ----------
    v : ndarray (batch, n_visible)
    W : ndarray (n_visible, n_hidden)
    bh : ndarray (n_hidden,)
    hidden : {"bernoulli", "gaussian"}

    Returns
    -------
    ndarray (batch, n_hidden), a new array.
    """
    check_rbm(v, W, bh=bh, hidden=hidden)
    z = v @ W
    z += bh
    return _sigmoid(z) if hidden == "bernoulli" else z


def rbm_visible(h, W, bv):
    """Visible probabilities sigmoid(h @ W.T + bv), shape (batch, n_visible)."""
    if h.ndim != 2 or W.ndim != 2 or h.shape[1] != W.shape[1] or bv.shape != (W.shape[0],):
        raise ValueError(f"rbm_visible: h {h.shape}, W {W.shape}, bv {bv.shape} do not fit "
                         "(h: batch x n_hidden, W: n_visible x n_hidden, bv: n_visible)")
    z = h @ W.T
    z += bv
    return _sigmoid(z)


def rbm_free_energy(v, W, bv, bh, hidden):
    """Free energy F(v) per row, up to a constant.

    bernoulli hidden: F(v) = -v.bv - sum_j softplus((v W + bh)_j)
    gaussian hidden (unit variance): F(v) = -v.bv - sum_j (v W + bh)_j^2 / 2

    Returns
    -------
    ndarray (batch,)
    """
    check_rbm(v, W, bv=bv, bh=bh, hidden=hidden)
    z = v @ W + bh
    hid = np.logaddexp(0, z).sum(axis=1) if hidden == "bernoulli" else 0.5 * (z * z).sum(axis=1)
    return -(v @ bv) - hid


def rbm_cd_backward(v0, W, bv, bh, noise, hidden, dW, dbv, dbh, scale=None):
    """One CD-k step, k = ``noise.shape[0]``; adds the negated CD update into dW, dbv, dbh.

    The chain: h0 = rbm_hidden(v0); for i < k: s = sample(h_i, noise[i]),
    v_{i+1} = rbm_visible(s), h_{i+1} = rbm_hidden(v_{i+1}). A bernoulli state is
    ``h > noise`` (uniforms in [0, 1)); a gaussian state is ``h + noise`` (standard normals).
    Adds the gradient of mean_batch(F(v0) - F(vk)) with vk held fixed:
    dW += (vk.T @ hk - v0.T @ h0) / batch, dbv += mean(vk - v0), dbh += mean(hk - h0),
    so a minimiser (SGD subtracting lr * grad) performs the CD ascent.

    Parameters
    ----------
    v0 : ndarray (batch, n_visible)
    W, bv, bh : the RBM's parameters
    noise : ndarray (k, batch, n_hidden)
    hidden : {"bernoulli", "gaussian"}
    dW, dbv, dbh : gradients to add into (caller-zeroed)
    scale : float, optional
        Multiplies the summed statistics (default 1/batch; a block of a larger batch
        passes 1/(global batch))

    Returns
    -------
    h0 : ndarray (batch, n_hidden), hidden probabilities/means of v0 (the next layer's input)
    vk : ndarray (batch, n_visible), the last reconstruction
    sq_err : float, sum over the batch of ||v1 - v0||^2 for the first reconstruction
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, dW, dbv, dbh)
    scale = 1.0 / v0.shape[0] if scale is None else float(scale)
    h0, v, h, sq_err = _cd_chain(v0, W, bv, bh, noise, hidden)
    dW += (v.T @ h - v0.T @ h0) * scale
    dbv += (v - v0).sum(axis=0) * scale
    dbh += (h - h0).sum(axis=0) * scale
    return h0, v, sq_err


def rbm_cd_factors(v0, W, bv, bh, noise, hidden, dbv, dbh, scale=None):
    """:func:`rbm_cd_backward` without its weight product, for a caller that adds many
    blocks' products at once (``block_outer_sum``): adds the bias gradients into dbv, dbh
    and returns (A, D, alpha, sq_err) such that the W gradient is ``alpha * A.T @ D``
    (here A = [v0; vk], D = [-h0; hk], alpha = scale; other sets may factor it otherwise).
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, W, dbv, dbh, ("W", "dbv", "dbh"), "rbm_cd_factors")
    scale = 1.0 / v0.shape[0] if scale is None else float(scale)
    h0, v, h, sq_err = _cd_chain(v0, W, bv, bh, noise, hidden)
    dbv += (v - v0).sum(axis=0) * scale
    dbh += (h - h0).sum(axis=0) * scale
    return np.concatenate([v0, v]), np.concatenate([-h0, h]), scale, sq_err


def rbm_cd_factors_blocks(v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale=None):
    """:func:`rbm_cd_factors` of each block of stacked rows v0[starts[b]:starts[b + 1]] (its
    noise the same rows of ``noise``), block b's bias gradients added into ``dbvs[b]``,
    ``dbhs[b]``, with the bits of the blocks one by one (a compiled set runs them in one
    call where its kernels' rows do not depend on one another).

    Returns (A, D, alpha, sq_errs): block b's factors are rows ``2 starts[b]`` to
    ``2 starts[b + 1]`` of A and D (its W gradient alpha * A_b.T @ D_b), its error
    ``sq_errs[b]``. ``scale`` defaults to 1 / all rows (the blocks make one batch).
    """
    return cd_factors_by_block(rbm_cd_factors, np, v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale)


def cd_factors_by_block(cd_factors, xp, v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale):
    """``cd_factors`` (a set's rbm_cd_factors) block by block, the factors stacked by ``xp``."""
    starts = check_cd_blocks(v0, noise, dbvs, dbhs, starts)
    scale = 1.0 / v0.shape[0] if scale is None else float(scale)
    parts = [cd_factors(v0[lo:hi], W, bv, bh, noise[:, lo:hi], hidden, dbv, dbh, scale)
             for lo, hi, dbv, dbh in zip(starts[:-1], starts[1:], dbvs, dbhs)]
    return (xp.concatenate([p[0] for p in parts]), xp.concatenate([p[1] for p in parts]), parts[0][2],
            [p[3] for p in parts])


def check_cd_blocks(v0, noise, dbvs, dbhs, starts):
    """The blocks' offsets (:func:`.blocksum.check_starts`, returned as int64), one pair of
    bias gradients per block, noise for every row."""
    s = check_starts("rbm_cd_factors_blocks", v0.shape[0], starts)
    if len(dbvs) != s.size - 1 or len(dbhs) != s.size - 1:
        raise ValueError(f"rbm_cd_factors_blocks: {len(dbvs)} and {len(dbhs)} bias gradients for "
                         f"{s.size - 1} blocks")
    if noise.ndim != 3 or noise.shape[1] != v0.shape[0]:
        raise ValueError(f"rbm_cd_factors_blocks: noise must be (k, {v0.shape[0]}, n_hidden), got {noise.shape}")
    return s


def _cd_chain(v0, W, bv, bh, noise, hidden):
    """(h0, vk, hk, sq_err) of the CD-k chain (see :func:`rbm_cd_backward`)."""
    h0 = rbm_hidden(v0, W, bh, hidden)
    h, sq_err = h0, 0.0
    for i in range(noise.shape[0]):
        u = noise[i]
        state = (h > u).astype(h.dtype) if hidden == "bernoulli" else h + u.astype(h.dtype)
        v = rbm_visible(state, W, bv)
        if i == 0:
            sq_err = float(np.sum((v - v0) ** 2, dtype=np.float64))
        h = rbm_hidden(v, W, bh, hidden)
    return h0, v, h, sq_err


def rbm_cd_update(v0, W, bv, bh, noise, hidden, vW, vbv, vbh, lr, momentum, weight_cost):
    """One CD-k training step of one process, in place: the CD update with an L2 weight cost
    on W, applied by SGD with momentum.

    The same as zeroing dW, dbv, dbh, calling :func:`rbm_cd_backward`, adding
    ``weight_cost * W`` to dW, then for (p, g, v) in (W, dW, vW), (bv, dbv, vbv), (bh, dbh, vbh):
    ``v = momentum * v - lr * g; p += v`` (:func:`kernels.ref.update.sgd_momentum_update`).
    Compiled sets fuse it: the velocity update is the statistics GEMM itself and W is
    read once more for the weight cost and the step, with no gradient array.

    Parameters
    ----------
    v0, W, bv, bh, noise, hidden : as for :func:`rbm_cd_backward`; W, bv, bh are updated
    vW, vbv, vbh : the velocities (shapes of W, bv, bh), updated
    lr, momentum, weight_cost : float

    Returns
    -------
    sq_err : float, as returned by :func:`rbm_cd_backward`
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, vW, vbv, vbh, names=("vW", "vbv", "vbh"))
    return cd_update_via(rbm_cd_backward, v0, W, bv, bh, noise, hidden, vW, vbv, vbh,
                         lr, momentum, weight_cost)


def cd_update_via(cd_backward, v0, W, bv, bh, noise, hidden, vW, vbv, vbh, lr, momentum, weight_cost):
    """rbm_cd_update spelled out with a set's own ``cd_backward`` (also the compiled sets'
    fallback for layouts their fused step does not take). ``zeros_like`` keeps the
    gradients on the parameters' device (CuPy arrays dispatch it to CuPy)."""
    dW, dbv, dbh = (np.zeros_like(W, dtype=vW.dtype), np.zeros_like(bv, dtype=vbv.dtype),
                    np.zeros_like(bh, dtype=vbh.dtype))
    _, _, sq_err = cd_backward(v0, W, bv, bh, noise, hidden, dW, dbv, dbh)
    dW += weight_cost * W
    for p, g, v in ((W, dW, vW), (bv, dbv, vbv), (bh, dbh, vbh)):
        v *= momentum
        v -= lr * g
        p += v
    return sq_err


def rbm_cd_update_blocks(v0, W, bv, bh, noise, hidden, starts, merges, vW, vbv, vbh, lr, momentum, weight_cost,
                         scale=None):
    """One training step of CD-k on blocks of stacked rows, in place: each block's
    gradient as :func:`rbm_cd_factors_blocks` gives it (block b: rows
    v0[starts[b]:starts[b + 1]], their noise the same rows of ``noise``; ``scale``
    defaults to 1 / all rows), the blocks' gradients added in the postfix tree ``merges``
    and applied with ``weight_cost`` on W by :func:`.blocksum.blocks_sgd_step`. Returns the
    blocks' sq_errs added in that tree in the parameters' dtype (a NumPy scalar; on the
    cupy set a 0-d device array). The bits of those kernels one after another (the
    data-parallel trainer's, its step sums too, for a step whose every block one process
    holds), in one call: the numba set takes CD-1 in three compiled calls, without the
    Python between them."""
    return cd_update_blocks_via(sys.modules[__package__], np, v0, W, bv, bh, noise, hidden, starts, merges,
                                vW, vbv, vbh, lr, momentum, weight_cost, scale)


def cd_update_blocks_via(K, xp, v0, W, bv, bh, noise, hidden, starts, merges, vW, vbv, vbh, lr, momentum,
                         weight_cost, scale):
    """:func:`rbm_cd_update_blocks` with the kernel set ``K``'s kernels, its table made by
    ``xp`` (the numpy and cupy sets', and the numba set's where its compiled step does not
    take the arrays): row b holds block b's gradients of bv and bh, then its sq_err."""
    starts, merges = check_cd_update_blocks(v0, W, noise, vW, vbv, vbh, starts, merges)
    nv, n = W.shape[0], W.shape[0] + W.shape[1]
    rows = xp.zeros((merges.size, n + 1), dtype=vbv.dtype)
    A, D, alpha, sq_errs = K.rbm_cd_factors_blocks(v0, W, bv, bh, noise, hidden, [r[:nv] for r in rows],
                                                   [r[nv:n] for r in rows], starts, scale)
    write_column(xp, sq_errs, rows[:, n])
    return K.blocks_sgd_step(A, D, 2 * starts, merges, [alpha] * merges.size, W, vW, rows, (bv, bh), (vbv, vbh), lr,
                             momentum, weight_cost)[n]


def check_cd_update_blocks(v0, W, noise, vW, vbv, vbh, starts, merges):
    """:func:`rbm_cd_update_blocks`' shapes, blocks and tree (every set's check); returns
    (starts, merges) as int64 arrays (kept: read, never written)."""
    check_cd(v0, W, noise, vW, vbv, vbh, ("vW", "vbv", "vbh"), "rbm_cd_update_blocks")
    return check_blocks_tree("rbm_cd_update_blocks", v0.shape[0], starts, merges)


def _sigmoid(z):
    # exp of a negative argument only: no overflow warnings for large |z|
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


# ---- shape checks shared with the numba and cupy sets ----------------------------------

def check_rbm(v, W, bv=None, bh=None, hidden="bernoulli"):
    if hidden not in HIDDEN:
        raise ValueError(f"hidden units must be one of {', '.join(HIDDEN)}, not {hidden!r}")
    if v.ndim != 2 or W.ndim != 2 or v.shape[1] != W.shape[0]:
        raise ValueError(f"rbm: v {v.shape} and W {W.shape} do not fit (v: batch x n_visible, "
                         "W: n_visible x n_hidden)")
    if bv is not None and bv.shape != (W.shape[0],):
        raise ValueError(f"rbm: bv must have shape ({W.shape[0]},), got {bv.shape}")
    if bh is not None and bh.shape != (W.shape[1],):
        raise ValueError(f"rbm: bh must have shape ({W.shape[1]},), got {bh.shape}")


def check_cd(v0, W, noise, dW, dbv, dbh, names=("dW", "dbv", "dbh"), what=None):
    """Shapes of a CD step's noise and of the arrays it adds into (``names`` and ``what``
    for the message)."""
    what = what or ("rbm_cd_backward" if names[0] == "dW" else "rbm_cd_update")
    if noise.ndim != 3 or noise.shape[0] < 1 or noise.shape[1:] != (v0.shape[0], W.shape[1]):
        raise ValueError(f"{what}: noise must be (k >= 1, batch, n_hidden) = "
                         f"(k, {v0.shape[0]}, {W.shape[1]}), got {noise.shape}")
    if dW.shape != W.shape or dbv.shape != (W.shape[0],) or dbh.shape != (W.shape[1],):
        raise ValueError(f"{what}: {names[0]} {dW.shape}, {names[1]} {dbv.shape}, {names[2]} {dbh.shape} "
                         f"must match W {W.shape}")
