"""The kernel cases bench.kernels checks and times: every kernel at the models' shapes.

Each :class:`Case` is one kernel at one shape: how to make its inputs, how to call it in
any kernel set, its FLOPs and bytes (the formulas are in :mod:`bench.kernels`' docstring),
and what it updates in place. :func:`catalog` lists them all, at the models' shapes or at
tiny ones (``quick``: the tests, ``--warm``).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

__all__ = ["FAMILIES", "Case", "catalog", "case_rng"]

FAMILIES = ("dense", "activation", "loss", "sparsity", "rbm", "conv", "update", "blocksum", "sparse_ae")

@dataclass
class Case:
    """One kernel at one shape: how to make its inputs and call it.

    ``make(rng)`` returns a dict of host inputs (arrays and scalars); ``run(K, a)`` calls
    the kernel of set ``K`` on the (device) inputs ``a`` and returns the outputs to check,
    arrays updated in place included, named by ``outs``; ``prep(K, a)`` adds set-specific
    state (a workspace) once before the calls. The inputs named in ``mutates`` are updated
    in place and restored before every timed sample, so that thousands of calls do not
    walk the parameters out of the regime the model runs in (overflow, subnormals).
    """

    family: str
    kernel: str
    shape: str
    dtype: str
    flops: float
    bytes: float
    work: int
    outs: tuple
    make: Callable
    run: Callable
    prep: Callable | None = None
    mutates: tuple = ()
    canon: Callable | None = None  # host outputs -> what is compared, where sets may factor a result otherwise

    @property
    def name(self):
        return f"{self.kernel} {self.shape} {self.dtype}"


FLOP_ACT = {"sigmoid": 3, "relu": 1, "identity": 0}


def case_rng(name):
    """The generator of a case's inputs: seeded by its name, the same in every run."""
    import numpy as np
    return np.random.default_rng(zlib.crc32(name.encode()))


def _dense_cases(shapes, dt):
    import numpy as np
    from aepar.kernels import ref
    s = np.dtype(dt).itemsize
    cases = []
    for B, I, O, act, need_dx in shapes:
        shape = f"{B}x{I}x{O} {act}"

        def make_fwd(rng, B=B, I=I, O=O):
            return {"x": rng.random((B, I), dtype=dt), "W": (rng.standard_normal((I, O)) / math.sqrt(I)).astype(dt),
                    "b": (0.1 * rng.standard_normal(O)).astype(dt)}
        cases.append(Case("dense", "dense_forward", shape, dt, 2 * B * I * O + (1 + FLOP_ACT[act]) * B * O,
                          s * (B * I + I * O + O + B * O), I, ("a",), make_fwd,
                          lambda K, a, act=act: [K.dense_forward(a["x"], a["W"], a["b"], act)]))
        bshape = shape + ("" if need_dx else " no-dx")

        def make_bwd(rng, make_fwd=make_fwd, act=act, O=O, B=B):
            a = make_fwd(rng)
            a["a"] = ref.dense_forward(a["x"], a["W"], a["b"], act)
            a["da"] = (0.01 * rng.standard_normal((B, O))).astype(dt)
            a["dW"], a["db"] = np.zeros_like(a["W"]), np.zeros_like(a["b"])
            return a

        def run_bwd(K, a, act=act, need_dx=need_dx):
            dx = K.dense_backward(a["da"], a["x"], a["W"], a["a"], act, a["dW"], a["db"], need_dx)
            return ([dx] if need_dx else []) + [a["dW"], a["db"]]
        g_act = FLOP_ACT[act]
        flops = g_act * B * O + 2 * B * I * O + I * O + B * O + (2 * B * I * O if need_dx else 0)
        nbytes = s * (2 * B * O + B * I + 2 * I * O + 2 * O + ((I * O + B * I) if need_dx else 0))
        cases.append(Case("dense", "dense_backward", bshape, dt, flops, nbytes, max(B, I, O),
                          (("dx",) if need_dx else ()) + ("dW", "db"), make_bwd, run_bwd, mutates=("dW", "db")))
    return cases


def _dense_blocks_cases(shapes, dt):
    """dense_forward_blocks / dense_backward_blocks: a batch as the trainer's blocks of
    rows, stacked (the Numba set's one call against the reference's call per block)."""
    import numpy as np
    from aepar.kernels import ref
    from aepar.rows import block_bounds
    s = np.dtype(dt).itemsize
    cases = []
    for B, I, O, act, count in shapes:
        shape, starts = f"{B}x{I}x{O} {act} {count} blocks", block_bounds(B, count)

        def make(rng, B=B, I=I, O=O, act=act, count=count):
            a = {"x": rng.random((B, I), dtype=dt), "W": (rng.standard_normal((I, O)) / math.sqrt(I)).astype(dt),
                 "b": (0.1 * rng.standard_normal(O)).astype(dt)}
            a["a"] = ref.dense_forward(a["x"], a["W"], a["b"], act)
            a["da"] = (0.01 * rng.standard_normal((B, O))).astype(dt)
            a["db"] = np.zeros((count, O), dt)  # block k's bias gradient: row k
            return a
        cases.append(Case("dense", "dense_forward_blocks", shape, dt, 2 * B * I * O + (1 + FLOP_ACT[act]) * B * O,
                          s * (B * I + I * O + O + B * O), I, ("a",), make,
                          lambda K, a, act=act, starts=starts: [K.dense_forward_blocks(a["x"], a["W"], a["b"], act,
                                                                                       starts)]))

        def run_bwd(K, a, act=act, starts=starts):
            dx, dz = K.dense_backward_blocks(a["da"], a["x"], a["W"], a["a"], act, list(a["db"]), starts)
            return [dx, dz, a["db"]]
        cases.append(Case("dense", "dense_backward_blocks", shape, dt,
                          FLOP_ACT[act] * B * O + B * O + 2 * B * I * O, s * (3 * B * O + I * O + B * I + count * O),
                          max(B, I, O), ("dx", "dz", "db"), make, run_bwd, mutates=("db",)))
    return cases


def _tied_ae_cases(shapes, dt):
    """tied_ae_update: a whole step of the tied autoencoder layer, with momentum and weight cost."""
    import numpy as np
    s = np.dtype(dt).itemsize
    cases = []
    for B, I, O, act in shapes:
        def make(rng, B=B, I=I, O=O):
            a = {"x": rng.random((B, I), dtype=dt), "W": (0.1 * rng.standard_normal((I, O))).astype(dt),
                 "bv": (0.1 * rng.standard_normal(I)).astype(dt), "bh": (0.1 * rng.standard_normal(O)).astype(dt)}
            for p in ("W", "bv", "bh"):
                a["v" + p] = (0.001 * rng.standard_normal(a[p].shape)).astype(dt)
            return a

        def run(K, a, act=act):
            err = K.tied_ae_update(a["x"], a["W"], a["bv"], a["bh"], act, a["vW"], a["vbv"], a["vbh"], 0.1, 0.5, 2e-4)
            return [err, a["W"], a["bv"], a["bh"], a["vW"], a["vbv"], a["vbh"]]
        flops = (10 * B * I * O + (2 + 2 * FLOP_ACT[act]) * B * O + 13 * B * I + 7 * I * O + 4 * (I + O))
        cases.append(Case("dense", "tied_ae_update", f"{B}x{I}x{O} {act}", dt, flops,
                          s * (B * I + 4 * I * O + 4 * (I + O)), 2 * B, ("sq_err", "W", "bv", "bh", "vW", "vbv", "vbh"),
                          make, run, mutates=("W", "bv", "bh", "vW", "vbv", "vbh")))
    return cases


def _activation_cases(sig_shape, relu_shape, dt):
    import numpy as np
    from aepar.kernels import ref
    s = np.dtype(dt).itemsize
    cases = []
    for act, shape in (("sigmoid", sig_shape), ("relu", relu_shape)):
        n = int(np.prod(shape))
        label = "x".join(map(str, shape))

        def make(rng, shape=shape, act=act):
            z = (2 * rng.standard_normal(shape)).astype(dt)
            a = getattr(ref, f"{act}_forward")(z)
            return {"z": z, "a": a, "da": rng.standard_normal(shape).astype(dt)}
        f = FLOP_ACT[act]
        cases.append(Case("activation", f"{act}_forward", label, dt, f * n, 2 * n * s, 1, ("a",), make,
                          lambda K, a, act=act: [getattr(K, f"{act}_forward")(a["z"])]))
        cases.append(Case("activation", f"{act}_backward", label, dt, f * n, 3 * n * s, 1, ("dz",), make,
                          lambda K, a, act=act: [getattr(K, f"{act}_backward")(a["da"], a["a"])]))
    return cases


def _loss_cases(img_shape, cls_shape, dt):
    import numpy as np
    from aepar.kernels import ref
    s = np.dtype(dt).itemsize
    n = int(np.prod(img_shape))
    label = "x".join(map(str, img_shape))

    def make_img(rng):
        z = (2 * rng.standard_normal(img_shape)).astype(dt)
        return {"y": rng.random(img_shape, dtype=dt), "t": rng.random(img_shape, dtype=dt), "z": z,
                "sy": ref.sigmoid_forward(z)}
    B, C = cls_shape
    cl = f"{B}x{C}"

    def make_cls(rng):
        z = (2 * rng.standard_normal(cls_shape)).astype(dt)
        labels = rng.integers(0, C, B)
        return {"z": z, "labels": labels, "probs": ref.softmax_xent_forward(z, labels)[1]}
    li = 8  # int64 labels
    return [
        Case("loss", "mse_forward", label, dt, 3 * n, 2 * n * s, n, ("loss",), make_img,
             lambda K, a: [K.mse_forward(a["y"], a["t"])]),
        Case("loss", "mse_backward", label, dt, 2 * n, 3 * n * s, 1, ("dy",), make_img,
             lambda K, a: [K.mse_backward(a["y"], a["t"])]),
        Case("loss", "sigmoid_xent_forward", label, dt, 10 * n, 3 * n * s, n, ("loss", "y"), make_img,
             lambda K, a: list(K.sigmoid_xent_forward(a["z"], a["t"]))),
        Case("loss", "sigmoid_xent_backward", label, dt, 2 * n, 3 * n * s, 1, ("dz",), make_img,
             lambda K, a: [K.sigmoid_xent_backward(a["sy"], a["t"])]),
        Case("loss", "softmax_xent_forward", cl, dt, 5 * B * C + 3 * B, 2 * B * C * s + B * li, B * C,
             ("loss", "probs"), make_cls, lambda K, a: list(K.softmax_xent_forward(a["z"], a["labels"]))),
        Case("loss", "softmax_xent_backward", cl, dt, B * C + B, 2 * B * C * s + B * li, 1, ("dz",), make_cls,
             lambda K, a: [K.softmax_xent_backward(a["probs"], a["labels"])]),
    ]


def _sparsity_cases(h, w_shape, wdt):
    import numpy as np
    dt = "float64"

    def make_kl(rng):
        return {"r": rng.uniform(0.01, 0.2, h).astype(dt)}
    n = int(np.prod(w_shape))
    ws = np.dtype(wdt).itemsize

    def make_w(rng):
        W = (0.1 * rng.standard_normal(w_shape)).astype(wdt)
        return {"W": W, "dW": (0.01 * rng.standard_normal(w_shape)).astype(wdt)}
    wl = "x".join(map(str, w_shape))
    return [
        Case("sparsity", "kl_sparsity_forward", f"{h}", dt, 9 * h, 8 * h, h, ("kl",), make_kl,
             lambda K, a: [K.kl_sparsity_forward(a["r"], 0.01, 3.0)]),
        Case("sparsity", "kl_sparsity_backward", f"{h}", dt, 5 * h, 16 * h, 1, ("dr",), make_kl,
             lambda K, a: [K.kl_sparsity_backward(a["r"], 0.01, 3.0)]),
        Case("sparsity", "weight_decay_forward", wl, wdt, 2 * n, n * ws, n, ("decay",), make_w,
             lambda K, a: [K.weight_decay_forward(a["W"], 2e-4)]),
        Case("sparsity", "weight_decay_backward", wl, wdt, 2 * n, 3 * n * ws, 1, ("dW",), make_w, _run_decay_bwd,
             mutates=("dW",)),
    ]


def _run_decay_bwd(K, a):
    K.weight_decay_backward(a["W"], 2e-4, a["dW"])
    return [a["dW"]]


def _safe_noise(v0, W, bh, noise, hidden, margin=1e-3):
    """Uniforms within ``margin`` of h0 moved ``margin`` away (CD-1 compares only h0 with
    noise[0]): rounding in another set must not flip a sampled state."""
    import numpy as np
    from aepar.kernels import ref
    if hidden != "bernoulli":
        return noise
    h0 = ref.rbm_hidden(v0, W, bh, hidden)
    u = noise[0]
    close = np.abs(h0 - u) < margin
    u[close] = np.where(h0[close] > 0.5, h0[close] - margin, h0[close] + margin)
    return noise


def _rbm_make(B, V, H, hidden, dt):
    import numpy as np

    def make(rng):
        v0 = rng.random((B, V), dtype=dt)
        W = (0.1 * rng.standard_normal((V, H))).astype(dt)
        bv, bh = (0.1 * rng.standard_normal(V)).astype(dt), (0.1 * rng.standard_normal(H)).astype(dt)
        noise = (rng.random((1, B, H), dtype=np.float32) if hidden == "bernoulli"
                 else rng.standard_normal((1, B, H), dtype=np.float32))
        a = {"v0": v0, "W": W, "bv": bv, "bh": bh, "noise": _safe_noise(v0, W, bh, noise, hidden),
             "h": rng.random((B, H), dtype=dt)}
        for p in ("W", "bv", "bh"):
            a["d" + p] = np.zeros_like(a[p])
            a["v" + p] = (0.001 * rng.standard_normal(a[p].shape)).astype(dt)
        return a
    return make


def _rbm_cases(first, layers, dt):
    import numpy as np
    from aepar.rows import block_bounds
    s = np.dtype(dt).itemsize
    B, V, H, hidden = first
    make = _rbm_make(B, V, H, hidden, dt)
    lab = f"{B}x{V}x{H} {hidden}"
    fh = 4 if hidden == "bernoulli" else 1
    cases = [
        Case("rbm", "rbm_hidden", lab, dt, 2 * B * V * H + fh * B * H, s * (B * V + V * H + H + B * H), V, ("h",),
             make, lambda K, a: [K.rbm_hidden(a["v0"], a["W"], a["bh"], hidden)]),
        Case("rbm", "rbm_visible", lab, dt, 2 * B * V * H + 4 * B * V, s * (B * H + V * H + V + B * V), H, ("v",),
             make, lambda K, a: [K.rbm_visible(a["h"], a["W"], a["bv"])]),
        Case("rbm", "rbm_free_energy", lab, dt, 2 * B * V * H + (1 + fh) * B * H + 2 * B * V + B,
             s * (B * V + V * H + V + H + B), max(V, H), ("F",), make,
             lambda K, a: [K.rbm_free_energy(a["v0"], a["W"], a["bv"], a["bh"], hidden)]),
    ]

    def run_cd(K, a, hidden=hidden):
        h0, vk, err = K.rbm_cd_backward(a["v0"], a["W"], a["bv"], a["bh"], a["noise"], hidden,
                                        a["dW"], a["dbv"], a["dbh"])
        return [h0, vk, err, a["dW"], a["dbv"], a["dbh"]]
    cases.append(Case("rbm", "rbm_cd_backward", lab, dt,
                      10 * B * V * H + (2 * fh + 3) * B * H + 9 * B * V + 3 * V * H + 2 * V + 2 * H,
                      s * (B * V + 3 * V * H + 3 * V + 3 * H + B * H + B * V) + 4 * B * H, max(B, V, H),
                      ("h0", "vk", "sq_err", "dW", "dbv", "dbh"), make, run_cd, mutates=("dW", "dbv", "dbh")))
    # the trainer's 8 blocks of a batch, their chains stacked (the Numba set's one call of
    # each row kernel against the reference's calls block by block); compared as each
    # block's W gradient alpha A_b.T @ D_b, since the sets order and sign the factors
    # differently (the reference [v0; vk], [-h0; hk]; the CuPy set [vk; v0], [hk; -h0])
    def make_blocks(rng, V=V, H=H):
        a = make(rng)
        a["dbvs"], a["dbhs"] = np.zeros((8, V), dt), np.zeros((8, H), dt)
        return a

    def run_blocks(K, a, hidden=hidden, B=B):
        A, D, alpha, errs = K.rbm_cd_factors_blocks(a["v0"], a["W"], a["bv"], a["bh"], a["noise"], hidden,
                                                    list(a["dbvs"]), list(a["dbhs"]), block_bounds(B, 8), 1.0 / B)
        return [A, alpha * D, np.array([float(e) for e in errs]), a["dbvs"], a["dbhs"]]

    def block_gradients(outs, B=B):
        A, aD, *rest = outs
        s = 2 * np.asarray(block_bounds(B, 8))
        grads = np.stack([A[lo:hi].astype(np.float64).T @ aD[lo:hi].astype(np.float64) for lo, hi in zip(s[:-1], s[1:])])
        return [grads, *rest]
    cases.append(Case("rbm", "rbm_cd_factors_blocks", f"{lab} 8 blocks", dt,
                      6 * B * V * H + (2 * fh + 4) * B * H + 6 * B * V,
                      s * (B * V + V * H + V + H + 4 * B * V + 4 * B * H) + 4 * B * H, max(B, V, H),
                      ("W gradient of each block", "sq_errs", "dbvs", "dbhs"), make_blocks, run_blocks,
                      mutates=("dbvs", "dbhs"), canon=block_gradients))
    for B, V, H, hidden in layers:
        fh = 4 if hidden == "bernoulli" else 1

        def run_up(K, a, hidden=hidden):
            lr = 0.1 if hidden == "bernoulli" else 0.001  # the recipe's: linear code units learn slower
            err = K.rbm_cd_update(a["v0"], a["W"], a["bv"], a["bh"], a["noise"], hidden, a["vW"], a["vbv"],
                                  a["vbh"], lr, 0.5, 2e-4)
            return [err, a["W"], a["bv"], a["bh"], a["vW"], a["vbv"], a["vbh"]]
        cases.append(Case("rbm", "rbm_cd_update", f"{B}x{V}x{H} {hidden}", dt,
                          10 * B * V * H + (2 * fh + 3) * B * H + 9 * B * V + 8 * V * H + 8 * (V + H),
                          s * (B * V + 4 * V * H + 4 * (V + H)) + 4 * B * H, max(B, V, H),
                          ("sq_err", "W", "bv", "bh", "vW", "vbv", "vbh"), _rbm_make(B, V, H, hidden, dt),
                          run_up, mutates=("W", "bv", "bh", "vW", "vbv", "vbh")))
    return cases


def _taps(n_out, n_in, k, stride, pad):
    """Kernel taps of a 1-D conv that land inside the input, summed over the outputs."""
    return sum(1 for o in range(n_out) for i in range(k) if 0 <= o * stride - pad + i < n_in)


def _conv_arrays(rng, dt, xs, wsh, ys, bias_len):
    """Inputs of a conv or transposed-conv case: x, PyTorch-style uniform W and b (bound
    1/sqrt(fan-in) from W's last three sides), an upstream gradient dy, zeroed dW and db."""
    import numpy as np
    bound = 1 / math.sqrt(wsh[1] * wsh[2] * wsh[3])
    return {"x": rng.random(xs, dtype=dt), "W": rng.uniform(-bound, bound, wsh).astype(dt),
            "b": rng.uniform(-bound, bound, bias_len).astype(dt), "dy": rng.standard_normal(ys).astype(dt),
            "dW": np.zeros(wsh, dt), "db": np.zeros(bias_len, dt)}


def _conv_cases(convs, tconvs, pools, dt):
    import numpy as np
    from aepar.kernels import ref
    s = np.dtype(dt).itemsize
    cases = []
    for (N, C, H, Wd), (Co, _, k, _), stride, pad in convs:
        Ho, Wo = (H + 2 * pad - k) // stride + 1, (Wd + 2 * pad - k) // stride + 1
        T = _taps(Ho, H, k, stride, pad) * _taps(Wo, Wd, k, stride, pad)
        lab = f"{N}x{C}x{H}x{Wd} * {Co}x{C}x{k}x{k} s{stride} p{pad}"
        nx, ny, nw = N * C * H * Wd, N * Co * Ho * Wo, Co * C * k * k

        def make(rng, xs=(N, C, H, Wd), wsh=(Co, C, k, k), ys=(N, Co, Ho, Wo)):
            return _conv_arrays(rng, dt, xs, wsh, ys, bias_len=wsh[0])

        def run_bwd(K, a, stride=stride, pad=pad):
            dx = K.conv2d_backward(a["dy"], a["x"], a["W"], stride, pad, a["dW"], a["db"])
            return [dx, a["dW"], a["db"]]
        cases.append(Case("conv", "conv2d_forward", lab, dt, 2 * Co * C * N * T + ny, s * (nx + nw + Co + ny),
                          C * k * k, ("y",), make,
                          lambda K, a, stride=stride, pad=pad: [K.conv2d_forward(a["x"], a["W"], a["b"], stride, pad)]))
        cases.append(Case("conv", "conv2d_backward", lab, dt, 4 * Co * C * N * T + nw + ny,
                          s * (ny + nx + nw + 2 * nw + 2 * Co + nx), max(N * Ho * Wo, Co * k * k), ("dx", "dW", "db"),
                          make, run_bwd, mutates=("dW", "db")))
    for (N, Ci, H, Wd), (_, Co, k, _), stride, pad in tconvs:
        Ho, Wo = (H - 1) * stride - 2 * pad + k, (Wd - 1) * stride - 2 * pad + k
        # the adjoint of the conv (N, Co, Ho, Wo) -> (N, Ci, H, W): its taps inside (Ho, Wo)
        T = _taps(H, Ho, k, stride, pad) * _taps(Wd, Wo, k, stride, pad)
        lab = f"{N}x{Ci}x{H}x{Wd} * {Ci}x{Co}x{k}x{k} s{stride} p{pad}"
        nx, ny, nw = N * Ci * H * Wd, N * Co * Ho * Wo, Ci * Co * k * k

        def make(rng, xs=(N, Ci, H, Wd), wsh=(Ci, Co, k, k), ys=(N, Co, Ho, Wo)):
            return _conv_arrays(rng, dt, xs, wsh, ys, bias_len=wsh[1])

        def run_bwd(K, a, stride=stride, pad=pad):
            dx = K.conv2d_transpose_backward(a["dy"], a["x"], a["W"], stride, pad, a["dW"], a["db"])
            return [dx, a["dW"], a["db"]]
        cases.append(Case("conv", "conv2d_transpose_forward", lab, dt, 2 * Co * Ci * N * T + ny,
                          s * (nx + nw + Co + ny), max(Co * k * k, 1), ("y",), make,
                          lambda K, a, stride=stride, pad=pad: [K.conv2d_transpose_forward(a["x"], a["W"], a["b"],
                                                                                             stride, pad)]))
        cases.append(Case("conv", "conv2d_transpose_backward", lab, dt, 4 * Co * Ci * N * T + nw + ny,
                          s * (ny + nx + nw + 2 * nw + 2 * Co + nx), max(N * H * Wd, Co * k * k),
                          ("dx", "dW", "db"), make, run_bwd, mutates=("dW", "db")))
    for shape in pools:
        N, C, H, Wd = shape
        nx, ny = N * C * H * Wd, N * C * (H // 2) * (Wd // 2)
        lab = "x".join(map(str, shape))

        def make(rng, shape=shape):
            x = rng.standard_normal(shape).astype(dt)
            y, idx = ref.maxpool2x2_forward(x)
            return {"x": x, "idx": idx, "dy": rng.standard_normal(y.shape).astype(dt)}
        cases.append(Case("conv", "maxpool2x2_forward", lab, dt, 3 * ny, s * (nx + ny) + ny, 1, ("y", "argmax"),
                          make, lambda K, a: list(K.maxpool2x2_forward(a["x"]))))
        cases.append(Case("conv", "maxpool2x2_backward", lab, dt, 0, s * (ny + nx) + ny, 1, ("dx",), make,
                          lambda K, a, shape=shape: [K.maxpool2x2_backward(a["dy"], a["idx"], shape)]))
    return cases


def _update_cases(shape, dt):
    import numpy as np
    s = np.dtype(dt).itemsize
    n = int(np.prod(shape))
    lab = "x".join(map(str, shape))

    def make(rng):
        return {"p": (0.1 * rng.standard_normal(shape)).astype(dt), "g": (0.01 * rng.standard_normal(shape)).astype(dt),
                "m": (0.001 * rng.standard_normal(shape)).astype(dt),
                "v": (1e-5 * np.abs(rng.standard_normal(shape))).astype(dt)}

    def run_adam(K, a):
        K.adam_update(a["p"], a["g"], a["m"], a["v"], 3, 1e-3)
        return [a["p"], a["m"], a["v"]]

    def run_sgd(K, a):
        K.sgd_momentum_update(a["p"], a["g"], a["m"], 0.1, 0.9)
        return [a["p"], a["m"]]
    return [Case("update", "adam_update", lab, dt, 13 * n, 7 * n * s, 1, ("p", "m", "v"), make, run_adam,
                 mutates=("p", "m", "v")),
            Case("update", "sgd_momentum_update", lab, dt, 4 * n, 5 * n * s, 1, ("p", "v"), make, run_sgd,
                 mutates=("p", "m"))]


def _adam_many_case(shapes, dt, label):
    """``adam_update_many`` over a model's parameters (one launch on a GPU): inputs p0.., g0..,
    m0.., v0.. per parameter."""
    import numpy as np
    s = np.dtype(dt).itemsize
    n = int(sum(np.prod(sh) for sh in shapes))
    names = [f"{k}{i}" for k in "pmv" for i in range(len(shapes))]

    def make(rng):
        out = {}
        for i, sh in enumerate(shapes):
            out[f"p{i}"] = (0.1 * rng.standard_normal(sh)).astype(dt)
            out[f"g{i}"] = (0.01 * rng.standard_normal(sh)).astype(dt)
            out[f"m{i}"] = (0.001 * rng.standard_normal(sh)).astype(dt)
            out[f"v{i}"] = (1e-5 * np.abs(rng.standard_normal(sh))).astype(dt)
        return out

    def run(K, a):
        k = range(len(shapes))
        K.adam_update_many([a[f"p{i}"] for i in k], [a[f"g{i}"] for i in k], [a[f"m{i}"] for i in k],
                           [a[f"v{i}"] for i in k], 3, 1e-3)
        return [a[name] for name in names]
    return [Case("update", "adam_update_many", label, dt, 13 * n, 7 * n * s, 1, tuple(names), make, run,
                 mutates=tuple(names))]


def _blocksum_cases(shapes, dt):
    """block_outer_sum: (rows, m, n, blocks) = a batch's weight gradient from its blocks in
    the fixed tree (the trainer's call per tree node)."""
    import numpy as np
    from aepar.rows import block_bounds, tree_merges, tree_top
    s = np.dtype(dt).itemsize
    cases = []
    for rows, m, n, count in shapes:
        starts = block_bounds(rows, count)
        merges = tree_merges(tree_top(count), 0, count)

        def make(rng, rows=rows, m=m, n=n):
            return {"A": rng.random((rows, m)).astype(dt), "D": (0.01 * rng.standard_normal((rows, n))).astype(dt),
                    "out": np.zeros((m, n), dt)}

        def run(K, a, starts=starts, merges=merges, count=count):
            return [K.block_outer_sum(a["A"], a["D"], starts, merges, [-0.01] * count, a["out"])]
        cases.append(Case("blocksum", "block_outer_sum", f"{rows}x{m}x{n} {count} blocks", dt, 2 * rows * m * n,
                          s * (rows * (m + n) + m * n), rows, ("out",), make, run))
    return cases


def _sparse_ae_cases(m, v, h, leaf):
    import numpy as np
    from aepar.kernels import ref
    from aepar.rows import cover_merges
    dt = "float64"
    size = ref.sparse_ae_partials_size(v, h)
    layout = ref.sparse_ae_layout(v, h)
    nparams = 2 * v * h + h + v
    cases = []
    # kl: one shard folds the KL term; leaf: per-leaf sums with Q = x^T s (one round);
    # rounds: per-leaf Σ a2, then the leaves' sums with ρ̂ given, added in the fixed tree as
    # they come (aepar.sparse's two rounds in one process)
    _, merges = cover_merges(0, -(-m // leaf), -(-m // leaf))
    for kind in ("kl", f"leaf{leaf}", f"rounds{leaf}"):
        rows = 1 if kind == "kl" else -(-m // leaf)

        def make(rng, rows=rows, kind=kind):
            r = math.sqrt(6 / (v + h + 1))
            return {"x": rng.uniform(0.1, 0.9, (m, v)), "W1": rng.uniform(-r, r, (v, h)), "b1": np.zeros(h),
                    "W2": rng.uniform(-r, r, (h, v)), "b2": np.zeros(v),
                    "out": np.zeros(size if rows == 1 else (1 if kind.startswith("rounds") else rows, size)),
                    "act": np.zeros((rows, h))}

        def prep(K, a, kind=kind):
            a["ws"] = K.sparse_ae_workspace(m, v, h, np.float64, leaf=None if kind == "kl" else leaf)

        def run(K, a, kind=kind):
            kl, lf, rho_hat = ((0.01, 3.0), None, None) if kind == "kl" else (None, leaf, None)
            if kind.startswith("rounds"):
                act = K.sparse_ae_activations(a["x"], a["W1"], a["b1"], a["act"], a.get("ws"), leaf)
                total = act.sum(axis=0)
                total = total.get() if hasattr(total, "get") else total  # CuPy's: ρ̂ goes in on the host
                kl, rho_hat = (0.01, 3.0), np.asarray(total, dtype=np.float64) / m
            out = K.sparse_ae_partials(a["x"], a["W1"], a["b1"], a["W2"], a["b2"], a["out"], a.get("ws"), kl, lf,
                                       rho_hat, merges if kind.startswith("rounds") else None)
            return [out[..., o:o + int(np.prod(shp))] for o, shp in layout.values()]
        products = 12 if kind.startswith("leaf") else 10
        cases.append(Case("sparse_ae", "sparse_ae_partials", f"{m}x{v}x{h} {kind}", dt,
                          products * m * v * h + 10 * m * h + 11 * m * v, 8 * (m * v + nparams + rows * size),
                          m * v, tuple(layout), make, run, prep))
    return cases


def catalog(quick: bool) -> list:
    """Every case, at the models' shapes (or tiny ones with ``quick``)."""
    f32 = "float32"
    if quick:
        dense = [(8, 24, 16, "sigmoid", False), (8, 16, 12, "sigmoid", True), (8, 12, 4, "identity", True)]
        cases = _dense_cases(dense, f32)
        cases += _dense_blocks_cases([(9, 16, 12, "sigmoid", 3)], f32)
        cases += _tied_ae_cases([(8, 12, 6, "sigmoid")], f32)
        cases += _activation_cases((4, 10), (2, 3, 4, 4), f32)
        cases += _loss_cases((4, 12), (4, 3), f32)
        cases += _sparsity_cases(5, (6, 4), f32)
        cases += _rbm_cases((6, 12, 8, "bernoulli"), [(6, 12, 8, "bernoulli"), (6, 8, 3, "gaussian")], f32)
        cases += _conv_cases([((2, 1, 8, 8), (3, 1, 3, 3), 1, 1), ((2, 3, 4, 4), (4, 3, 3, 3), 1, 1)],
                             [((2, 4, 2, 2), (4, 3, 2, 2), 2, 0), ((2, 3, 4, 4), (3, 1, 2, 2), 2, 0)],
                             [(2, 3, 8, 8), (2, 4, 4, 4)], f32)
        cases += _update_cases((6, 5), f32)
        cases += _adam_many_case([(6, 5), (5,), (5, 6), (6,)], f32, "6-5-6 (4 arrays)")
        cases += _blocksum_cases([(20, 12, 40, 3)], f32)
        cases += _sparse_ae_cases(96, 8, 5, 32)
        return cases
    # 784-1000-500-250-30 (linear code layer) at batch 100, then the classifier head on the CAE
    # codes; a network's first layer needs no input gradient (need_dx False)
    dense = [(100, 784, 1000, "sigmoid", False), (100, 1000, 500, "sigmoid", True),
             (100, 500, 250, "sigmoid", True), (100, 250, 30, "identity", True),
             (100, 1568, 10, "identity", False)]
    cases = _dense_cases(dense, f32)
    # fine-tuning's blocks: the first layer forward, a middle layer backward (both ways each)
    cases += _dense_blocks_cases([(100, 784, 1000, "sigmoid", 8), (100, 1000, 500, "sigmoid", 8)], f32)
    # the autoencoder layer's (--pretrainer ae) one-block step: its first and code layers
    cases += _tied_ae_cases([(100, 784, 1000, "sigmoid"), (100, 250, 30, "identity")], f32)
    cases += _activation_cases((100, 1000), (100, 16, 28, 28), f32)
    cases += _loss_cases((100, 784), (100, 10), f32)
    cases += _sparsity_cases(25, (784, 1000), f32)
    cases += _rbm_cases((100, 784, 1000, "bernoulli"),
                        [(100, 784, 1000, "bernoulli"), (100, 1000, 500, "bernoulli"),
                         (100, 500, 250, "bernoulli"), (100, 250, 30, "gaussian")], f32)
    # aepar.models.cae: conv 3x3 pad 1 (1->16, 16->32), pool, transposed 2x2/2 (32->16, 16->1)
    cases += _conv_cases([((100, 1, 28, 28), (16, 1, 3, 3), 1, 1), ((100, 16, 14, 14), (32, 16, 3, 3), 1, 1)],
                         [((100, 32, 7, 7), (32, 16, 2, 2), 2, 0), ((100, 16, 14, 14), (16, 1, 2, 2), 2, 0)],
                         [(100, 16, 28, 28), (100, 32, 14, 14)], f32)
    cases += _update_cases((784, 1000), f32)
    # the unrolled 784-1000-500-250-30 stack's 16 parameters (fine-tuning's Adam step)
    sizes = [784, 1000, 500, 250, 30, 250, 500, 1000, 784]
    cases += _adam_many_case([sh for i in range(8) for sh in ((sizes[i], sizes[i + 1]), (sizes[i + 1],))], f32,
                             "784-1000-500-250-30 unrolled (16 arrays)")
    # the CD-1 statistics ([v0; vk] of 8 blocks) and fine-tuning's first and code layers
    cases += _blocksum_cases([(200, 784, 1000, 8), (100, 784, 1000, 8), (100, 250, 30, 8)], f32)
    cases += _sparse_ae_cases(10000, 64, 25, 128)
    return cases
