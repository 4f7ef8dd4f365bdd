"""Hand-written forward/backward kernels: math only (no MPI, no files).

Installed as ``aepar.kernels``. Three kernel sets expose the same names:

====== ===================== ================================================
name   module                what
====== ===================== ================================================
numpy  aepar.kernels.ref     the reference oracle, plain NumPy
numba  aepar.kernels.nb      CPU, @njit(cache=True), parallel where it pays
cupy   aepar.kernels.cp      GPU, ElementwiseKernel/RawKernel + cuBLAS matmul
====== ===================== ================================================

Conventions (every set):

- Row-major batches: a dense input ``x`` is (batch, in), ``W`` is (in, out), ``b`` (out,).
  Images are NCHW.
- ``*_forward`` returns outputs; ``*_backward`` takes the upstream gradient, *adds*
  parameter gradients into arrays the caller zeroed (``dW += ...``), and returns the
  gradient with respect to the input (a new array) when there is one.
- Activations are given by name: ``"sigmoid"``, ``"relu"``, ``"identity"``; their
  derivatives are computed from the activation output ``a``.
- Any layout works; the numba set runs fastest on C-contiguous arrays that start on a
  64-byte line (``aepar.kernels.memory``), as the CPU backend allocates parameters and buffers.
- Random numbers are never drawn inside a compute kernel: the caller passes them in, so a
  seed gives the same result on every kernel set. The caller makes them with the draws
  family, which gives NumPy's own bits on every set (the GPU set computes them there).

Families (module: functions):

- dense: ``dense_forward(x, W, b, act) -> a``;
  ``dense_backward(da, x, W, a, act, dW, db, need_dx=True) -> dx | None``;
  ``tied_ae_update(x, W, bv, bh, code_act, vW, vbv, vbh, lr, momentum, weight_cost) -> sq_err``
  is one whole step of a tied-weight autoencoder layer in place (h = code_act(x W + bh),
  x̂ = sigmoid(h Wᵀ + bv), the gradient of ½ Σ(x̂ − x)² / batch plus ``weight_cost * W``,
  SGD with momentum on W, bv, bh); sq_err = Σ‖x̂ − x‖² before it (a float; on the cupy
  set a 0-d float64 device array, as below);
  ``tied_ae_factors_blocks(x, W, bv, bh, code_act, dbvs, dbhs, starts, scale) -> ([sq_err],
  dz2, dz1, h)`` is that layer's forward and backward pass over the blocks of stacked rows
  ``starts[k]:starts[k+1]``, each with its own bits: block k's bias gradients of
  ``scale`` * ½ Σ(x̂ − x)² added into ``dbvs[k]``, ``dbhs[k]``, W's left as its factors
  x.T @ dz1 + dz2.T @ h (the numba set in one compiled call where every block takes its
  row kernels; the others, and the rest, the block kernels below one after another);
  ``tied_ae_update_blocks(x, W, bv, bh, code_act, starts, merges, vW, vbv, vbh, lr,
  momentum, weight_cost, scale) -> sq_err`` is that pass's step: the blocks' gradients
  added in the postfix tree ``merges`` and applied by blocks_sgd_step, the bits of the two
  kernels in one call; sq_err is the blocks' added in that tree, in the parameters' dtype
- activation: ``sigmoid_forward(z)``, ``relu_forward(z)``, ``identity_forward(z)``;
  ``sigmoid_backward(da, a)``, ``relu_backward(da, a)``, ``identity_backward(da, a)`` -> dz
- loss: ``mse_forward(y, t, scale=None) -> loss`` = scale * 0.5 * sum((y - t)**2),
  scale defaulting to 1/batch; ``mse_forward_blocks(y, t, starts, scale=None) -> [loss]``,
  mse_forward of each block of rows starts[b]:starts[b+1], the bits of a call per block
  (the numba set adds four blocks' sums side by side); ``mse_backward(y, t, scale=None) -> dy``;
  ``softmax_xent_forward(z, labels, scale=None) -> (loss, probs)`` (labels are ints,
  loss = -scale * sum log p[label]); ``softmax_xent_backward(probs, labels, scale=None) -> dz``;
  ``sigmoid_xent_forward(z, t, scale=None) -> (loss, y)`` (pixel cross-entropy from logits,
  y = sigmoid(z)); ``sigmoid_xent_forward_blocks(z, t, starts, scale=None) -> ([loss], y)``,
  its loss per block of rows with the bits of a call per block, y of every row;
  ``sigmoid_xent_backward(y, t, scale=None) -> dz``. A loss is a float
  on the CPU sets; the cupy set leaves it on the GPU as a 0-d float64 array, as the rbm
  family's sq_err (a training step must not wait for its GPU work): ``float()`` reads it.
- sparsity: ``kl_sparsity_forward(rho_hat, rho, beta) -> float`` = beta * sum KL(rho||rho_hat);
  ``kl_sparsity_backward(rho_hat, rho, beta) -> d/d rho_hat``;
  ``weight_decay_forward(W, lam) -> lam/2 * ||W||^2``; ``weight_decay_backward(W, lam, dW)``
- rbm: ``rbm_free_energy(v, W, bv, bh, hidden) -> (batch,)``;
  ``rbm_hidden(v, W, bh, hidden) -> probabilities (bernoulli) or means (gaussian)``;
  ``rbm_visible(h, W, bv) -> probabilities``;
  ``rbm_cd_backward(v0, W, bv, bh, noise, hidden, dW, dbv, dbh) -> (h0, vk, sq_err)``
  runs CD-k with k = noise.shape[0] (noise: uniforms for bernoulli hidden units, standard
  normals for gaussian), adds the gradient of mean(F(v0) - F(vk)) with vk held fixed
  (the negated CD update) into dW, dbv, dbh; h0 = hidden probabilities/means of v0,
  sq_err = sum over the batch of squared error of the first reconstruction (a float; the
  cupy set leaves it on the GPU as a 0-d float64 array: ``float()`` reads it and waits).
  ``rbm_cd_update(v0, W, bv, bh, noise, hidden, vW, vbv, vbh, lr, momentum, weight_cost) -> sq_err``
  is one whole CD-k step in place: that gradient plus ``weight_cost * W``, applied as
  ``v = momentum*v - lr*g; p += v`` to W, bv, bh (the numba set stores float32
  probabilities below 2**-100 as 0: subnormals take a slow path on x86).
  ``rbm_cd_update_blocks(v0, W, bv, bh, noise, hidden, starts, merges, vW, vbv, vbh, lr,
  momentum, weight_cost, scale=None) -> sq_err`` is that step for blocks of stacked rows:
  each block's gradient as rbm_cd_factors_blocks gives it, added in the postfix tree
  ``merges`` and applied by blocks_sgd_step, those kernels' bits in one call (the numba set's
  CD-1 in three compiled calls); sq_err is the blocks' added in that tree, in the
  parameters' dtype.
- conv: ``conv2d_forward(x, W, b, stride=1, pad=0) -> y`` (W: Cout, Cin, kh, kw);
  ``conv2d_backward(dy, x, W, stride, pad, dW, db, need_dx=True) -> dx`` (None without
  ``need_dx``: a network's first layer, whose input gradient every set then skips);
  ``conv2d_transpose_forward(x, W, b, stride=1, pad=0) -> y`` (W: Cin, Cout, kh, kw,
  output (H-1)*stride - 2*pad + kh); ``conv2d_transpose_backward(dy, x, W, stride, pad, dW, db) -> dx``;
  ``maxpool2x2_forward(x) -> (y, argmax)``; ``maxpool2x2_backward(dy, argmax, x_shape) -> dx``;
  ``conv2d_forward_blocks(x, W, b, stride, pad, starts)``,
  ``conv2d_backward_blocks(dy, x, W, stride, pad, dWs, dbs, starts, need_dx=True)`` and the two
  ``conv2d_transpose_*_blocks`` take the blocks of images ``starts[k]:starts[k+1]``
  stacked, block k's gradients into ``dWs[k]``, ``dbs[k]``, each block's results the
  bits of the same call on that block alone (the numba set in one call; the cupy set's
  blocks of at most ``kernels.cp.conv.MAX_IMAGES`` float32 images in one launch a
  product, its row kernels; the others block by block)
- blocksum: ``block_outer_sum(A, D, starts, merges, alphas, out)``: out = Σ alphas[b]
  A_b.T @ D_b over the blocks of rows ``starts[b]:starts[b+1]``, added in the postfix tree
  ``merges`` (aepar.rows.tree_merges): a batch's weight gradient from its blocks, the same
  bits as each block's product added in that tree. A and D may also be tuples of parts
  (a tied autoencoder's (x, dz2) and (dz1, h)): block b's rows are then its rows of each
  part, one part after another, without the parts copied into one array first.
  ``block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay=0.0)``
  is ``sgd_momentum_update(p, g, v, lr, momentum, weight_decay)`` with that sum as g, the
  same bits (the numba set steps p and v where each tile of g ends, g never written out).
  ``rows_tree_sum(rows, merges) -> rows[0]`` adds the rows of a 2-D array (the blocks'
  bias gradients and step sums) in that tree, in place, the sum in ``rows[0]`` (the cupy
  set in one launch, the bits of NumPy's additions row by row).
  ``blocks_sgd_step(A, D, starts, merges, alphas, W, vW, bias_rows, biases, velocities, lr,
  momentum, weight_cost=0.0) -> bias_rows[0]`` is a layer's whole step from its blocks:
  block_outer_sum_sgd for W, rows_tree_sum of ``bias_rows`` (a row per block, the biases'
  columns one after another, then any other sums, added but not stepped) and
  sgd_momentum_update of each bias with its columns of the sum, the same bits (the numba
  set's tree and biases in one compiled call).
  ``rbm_cd_factors(v0, W, bv, bh, noise,
  hidden, dbv, dbh, scale) -> (A, D, alpha, sq_err)`` is rbm_cd_backward with its W
  gradient left as alpha * A.T @ D for it; ``rbm_cd_factors_blocks(v0, W, bv, bh, noise,
  hidden, dbvs, dbhs, starts, scale) -> (A, D, alpha, sq_errs)`` does so for each block of
  stacked rows, with each block's own bits (block b's factors: rows 2 starts[b] to
  2 starts[b+1] of A and D).
- draws: ``uniform_rows(rngs, starts, out)``: rows ``starts[i]:starts[i+1]`` of the float32
  matrix ``out`` get ``rngs[i].random(dtype=np.float32)`` (NumPy Generators on PCG64), each
  generator left where that call leaves it; the numpy set draws through NumPy, the numba
  set steps PCG64 in compiled code on the host (through NumPy where its check of NumPy's
  state layout fails, or for other bit generators), the cupy set jumps each PCG64 stream
  ahead on the GPU (no host draws, no copy).
- update: ``sgd_momentum_update(p, g, v, lr, momentum, weight_decay=0.0)``
  (v = momentum*v - lr*(g + weight_decay*p); p += v);
  ``sgd_momentum_update_many(ps, gs, vs, lrs, momentum, weight_decays=None)``: it on each
  parameter of the three lists at its own rate, the same bits (the cupy set in one launch
  for every four);
  ``adam_update(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8)``: in place;
  ``adam_update_many(ps, gs, ms, vs, t, lr, ...)``: adam_update on each parameter of the
  four lists, the same bits (the cupy set in one launch).
"""
import importlib

KERNEL_SETS = {"numpy": "aepar.kernels.ref", "numba": "aepar.kernels.nb", "cupy": "aepar.kernels.cp"}


def load(name: str):
    """The kernel set ``name`` (numpy | numba | cupy) as a module of functions."""
    try:
        return importlib.import_module(KERNEL_SETS[name])
    except KeyError:
        raise ValueError(f"unknown kernel set {name!r}; choose from {', '.join(KERNEL_SETS)}") from None
