"""Sparse autoencoder partials and assembly, fused for the CPU (Numba).

Same names, layout and results as :mod:`aepar.kernels.ref.sparse_ae` (read its docstring
for the formulation). Two implementations behind one entry point:

float64: register-tiled SIMD kernels, no BLAS. The five products have a 25- or 64-wide
side, where OpenBLAS reached 55-65% of its own DGEMM rate, and the element-wise passes
between them streamed the (m, ·) arrays through memory again: ~4.5 ms per evaluation at
10,000 patches (one thread), against ~2.7 ms here. The design:

- Explicit 8-lane vectors (:data:`f64x8`, a Numba type that is LLVM's <8 x double>, with
  a few intrinsics), so that register tiles stay in registers (the tile kernels are
  generated source with one variable per accumulator); kernels take raw pointers,
  because Numba's reference counting of array arguments (atomic) cost more than a tile.
- The workspace packs x once (until x changes) into *panels* of PW = 32 samples. Per
  panel one contiguous block holds x feature-major (v, PW), a2 (h, PW) and x
  sample-major (PW, v): the next block is prefetched while this one is worked on.
- Each product's element-wise epilogue runs on its accumulators, in registers:
  x W1 (lanes = samples, weights broadcast, 5 hidden units × PW): σ and the ρ̂ sums;
  a2 W2 (lanes = visible units, a2 broadcast, 8 samples × 16 units): σ, the error, δ3
  sample-major, its sums, and δ3 transposed in registers into a feature-major panel;
  δ3 W2ᵀ (like x W1): δ2 = (e + k)(a2 − a2²) and its sums.
- a2ᵀ δ3 and xᵀ δ2, per group of panels: sums over samples of a broadcast (a2 or δ2 of
  a sample) times a sample-major row (δ3 or x), tiles of 5 hidden × 32 visible units.

With ``kl=(rho, beta)`` (one shard = all samples) a first sweep computes a2 of every
panel and ρ̂, the second folds k into δ2 (five products; no Q = xᵀs); without it one
sweep does everything and adds Q and Σs. Biases start the accumulators. Rows and
columns are padded to the tile sizes with zero weights, padding lanes are masked out of
every sum; every sum has a fixed order, so results are deterministic, and they agree
with the reference to rounding. Such kernels are bound by instruction throughput: in
the element-wise epilogues, by the sigmoid's one division per value.

Other dtypes: the BLAS path (np.dot on 256-row blocks with fused element-wise passes).

The sigmoid is computed inline and vectorised: exp(−z) = 2^n·P(r)/P(−r) (Cody-Waite
reduction, Padé [6/6], 2^n built in the exponent bits), so σ costs one division and ~12
FMAs (libm's scalar exp cost as much as all the products together). Sums are
accumulated in float64. All scratch memory lives in a :class:`SparseAEWorkspace` made
once per model; an evaluation allocates nothing of size m.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from llvmlite.binding import llvm_version_info
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from ..ref.sparse_ae import (leaf_rows, sparse_ae_layout, sparse_ae_partials_size, sparse_ae_theta_layout,
                             sparse_ae_theta_size)

__all__ = ["sparse_ae_layout", "sparse_ae_partials_size", "sparse_ae_theta_layout",
           "sparse_ae_theta_size", "sparse_ae_workspace", "sparse_ae_partials",
           "sparse_ae_assemble", "SparseAEWorkspace"]

DEFAULT_BLOCK = 256
# error_model="numpy": no ZeroDivisionError branch in 1/(1 + e), which would stop LLVM
# from vectorising the sigmoid; "contract" lets it use FMAs (no reassociation, so the
# rounding trick in _sigmoid survives).
_JIT = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})


@intrinsic
def _int64_bits_as_float64(typingctx, bits):
    """Reinterpret an int64 as the float64 with the same bits (lets LLVM vectorise 2^n)."""
    if bits != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


_LOG2E = 1.4426950408889634
_SHIFTER = 6755399441055744.0  # 1.5 * 2**52: adding it rounds to an integer in the low bits
_LN2_HI = 6.93147180369123816490e-01  # fdlibm's split of ln 2: n * LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
# Padé [6/6] of exp: exp(r) ~ P(r)/P(-r), P(r) = E(r²) + r O(r²); relative error < 1e-18
# for |r| <= ln2/2
_C1, _C2, _C3, _C4, _C5, _C6 = 1 / 2, 5 / 44, 1 / 66, 1 / 792, 1 / 15840, 1 / 665280


@njit(**_JIT, inline="always")
def _sigmoid(z):
    """1 / (1 + exp(-z)) to ~2 ulp, vectorisable: exp(-z) = 2^n P(r)/P(-r), and then
    σ = P(-r) / (P(-r) + 2^n P(r)) costs a single division. |z| is clamped at 708 (σ is
    then 1 or below 1e-307 anyway)."""
    t = min(max(-z, -708.0), 708.0)
    n = (t * _LOG2E + _SHIFTER) - _SHIFTER
    r = (t - n * _LN2_HI) - n * _LN2_LO
    s = r * r
    even = ((_C6 * s + _C4) * s + _C2) * s + 1.0
    odd = ((_C5 * s + _C3) * s + _C1) * r
    den = even - odd
    return den / (den + (even + odd) * _int64_bits_as_float64((np.int64(n) + 1023) << 52))


# ---------------------------------------------------------------------------- BLAS path
@njit(**_JIT)
def _hidden_forward(a2, b1, act):
    """a2 holds x W1 on entry: a2 = σ(a2 + b1) in place, act += column sums."""
    for i in range(a2.shape[0]):
        for j in range(a2.shape[1]):
            a = _sigmoid(np.float64(a2[i, j]) + b1[j])
            a2[i, j] = a
            act[j] += a


@njit(**_JIT)
def _output_delta(z3, b2, x, db2, err):
    """z3 holds a2 W2 on entry: a3 = σ(z3 + b2); z3 = δ3 = (a3 − x) a3 (1 − a3) in place;
    db2 += Σ δ3, err += Σ (a3 − x)² (per column, so the loop vectorises exactly)."""
    for i in range(z3.shape[0]):
        for j in range(z3.shape[1]):
            a = _sigmoid(np.float64(z3[i, j]) + b2[j])
            d = a - x[i, j]
            err[j] += d * d
            d3 = d * a * (1.0 - a)
            z3[i, j] = d3
            db2[j] += d3


@njit(**_JIT)
def _hidden_delta_folded(e, a2, k, db1):
    """e holds δ3 W2ᵀ on entry: e = δ2 = (e + k) ⊙ a2 (1 − a2) in place; db1 += Σ δ2."""
    for i in range(e.shape[0]):
        for j in range(e.shape[1]):
            a = np.float64(a2[i, j])
            d2 = (e[i, j] + k[j]) * a * (1.0 - a)
            e[i, j] = d2
            db1[j] += d2


@njit(**_JIT)
def _hidden_delta_split(e, a2, g, db1):
    """g[:, :h] = e ⊙ s, g[:, h:] = s with s = a2 (1 − a2); db1 += their column sums."""
    h = e.shape[1]
    for i in range(e.shape[0]):
        for j in range(h):
            a = np.float64(a2[i, j])
            s = a * (1.0 - a)
            es = e[i, j] * s
            g[i, j] = es
            g[i, h + j] = s
            db1[j] += es
            db1[h + j] += s


@njit(**_JIT)
def _partials_blas(x, W1, b1, W2, b2, W2t, a2, z3, e, g, t_vh, t_v2h, t_hv,
                   acc_w1, acc_b1, acc_w2, acc_b2, acc_act, acc_err, block, fold, rho, beta):
    m = x.shape[0]
    h = W1.shape[1]
    acc_w1[:] = 0.0
    acc_b1[:] = 0.0
    acc_w2[:] = 0.0
    acc_b2[:] = 0.0
    acc_act[:] = 0.0
    acc_err[:] = 0.0
    W2t[:] = W2.T  # a contiguous copy: BLAS is ~1.5x slower on this product with W2.T's view
    k = np.zeros(h)
    if fold:
        # pass 1: hidden activations of every sample, so ρ̂ (hence k) is known for pass 2
        for i0 in range(0, m, block):
            i1 = min(i0 + block, m)
            np.dot(x[i0:i1], W1, a2[i0:i1])
            _hidden_forward(a2[i0:i1], b1, acc_act)
        for j in range(h):
            rho_hat = acc_act[j] / m
            k[j] = beta * (-rho / rho_hat + (1.0 - rho) / (1.0 - rho_hat))
    for i0 in range(0, m, block):
        i1 = min(i0 + block, m)
        nb = i1 - i0
        xb = x[i0:i1]
        ab = a2[i0:i1]
        if not fold:
            np.dot(xb, W1, ab)
            _hidden_forward(ab, b1, acc_act)
        zb = z3[:nb]
        np.dot(ab, W2, zb)
        _output_delta(zb, b2, xb, acc_b2, acc_err)
        np.dot(ab.T, zb, t_hv)
        acc_w2 += t_hv
        eb = e[:nb]
        np.dot(zb, W2t, eb)
        if fold:
            _hidden_delta_folded(eb, ab, k, acc_b1)
            np.dot(xb.T, eb, t_vh)
            acc_w1[:, :h] += t_vh
        else:
            gb = g[:nb]
            _hidden_delta_split(eb, ab, gb, acc_b1)
            np.dot(xb.T, gb, t_v2h)
            acc_w1 += t_v2h


# ---------------------------------------------------------------------------- SIMD path
# Explicit 8-lane float64 vectors (one AVX-512 register; LLVM splits them in two on
# AVX2). Numba has no vector type, so f64x8 is a Numba type whose LLVM value is
# <8 x double>, used through the intrinsics below: kernels written with them keep their
# register tiles in registers, which auto-vectorised loops do not.
LANES = 8


class _F64x8(types.Type):
    def __init__(self):
        super().__init__(name="f64x8")


f64x8 = _F64x8()
_VEC = ir.VectorType(ir.DoubleType(), LANES)
_IVEC = ir.VectorType(ir.IntType(64), LANES)


@register_model(_F64x8)
class _F64x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC)


def _flat_f64(a):
    """A flat C-contiguous float64 array, or a raw float64 pointer (see :func:`_dptr`)."""
    if isinstance(a, types.CPointer):
        return a.dtype == types.float64
    return isinstance(a, types.Array) and a.dtype == types.float64 and a.ndim == 1 and a.layout == "C"


def _data(context, builder, ty, val):
    """The float64* behind an array or pointer argument."""
    if isinstance(ty, types.CPointer):
        return val
    return context.make_array(ty)(context, builder, value=val).data


def _vec_ptr(context, builder, arrty, arr, idx, idxty):
    data = _data(context, builder, arrty, arr)
    idx = context.cast(builder, idx, idxty, types.intp)
    return builder.bitcast(builder.gep(data, [idx]), _VEC.as_pointer())


@intrinsic
def _dptr(typingctx, a):
    """The data pointer of a flat float64 array. Kernels take pointers, not arrays: an
    array argument costs atomic reference-count updates on every call where Numba
    cannot prove them redundant, which cost more than a small tile's arithmetic."""
    if not (isinstance(a, types.Array) and a.dtype == types.float64 and a.ndim == 1 and a.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        return context.make_array(sig.args[0])(context, builder, value=args[0]).data

    return types.CPointer(types.float64)(a), codegen


def _splat_ir(builder, x):
    v = builder.insert_element(ir.Constant(_VEC, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, ir.Constant(_VEC, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))


@intrinsic
def _vload(typingctx, a, i):
    """a[i:i + 8] of a flat float64 array (no bounds check, any alignment)."""
    if not (_flat_f64(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_vec_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1]), align=8)

    return f64x8(a, i), codegen


@intrinsic
def _vstore(typingctx, a, i, v):
    """a[i:i + 8] = v."""
    if not (_flat_f64(a) and isinstance(i, types.Integer) and v == f64x8):
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _vec_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1]),
                      align=8)
        return context.get_dummy_value()

    return types.none(a, i, v), codegen


@intrinsic
def _vbcast(typingctx, a, i):
    """a[i] in every lane (a plain load: no negative-index wraparound code)."""
    if not (_flat_f64(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        data = _data(context, builder, sig.args[0], args[0])
        idx = context.cast(builder, args[1], sig.args[1], types.intp)
        return _splat_ir(builder, builder.load(builder.gep(data, [idx])))

    return f64x8(a, i), codegen


# llvm.prefetch is overloaded on the pointer type: "p0" with opaque pointers (LLVM >= 15)
_PREFETCH = "llvm.prefetch.p0" if llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


@intrinsic
def _prefetch(typingctx, a, i):
    """Ask for the cache line holding a[i] (a hint: never faults, even past the end)."""
    if not (_flat_f64(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        data = _data(context, builder, sig.args[0], args[0])
        idx = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(data, [idx]), ir.PointerType(ir.IntType(8)))
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]), _PREFETCH)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(a, i), codegen


@intrinsic
def _vsplat(typingctx, x):
    """x in every lane."""
    if not isinstance(x, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return _splat_ir(builder, context.cast(builder, args[0], sig.args[0], types.float64))

    return f64x8(x), codegen


@intrinsic
def _vfma(typingctx, a, b, c):
    """a * b + c, rounded once."""
    if not (a == b == c == f64x8):
        return None

    def codegen(context, builder, sig, args):
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3),
                                             "llvm.fma.v8f64")
        return builder.call(fma, args)

    return f64x8(a, b, c), codegen


def _binary(op):
    @intrinsic
    def _op(typingctx, a, b):
        if not (a == b == f64x8):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])

        return f64x8(a, b), codegen

    return _op


_vadd, _vsub, _vmul, _vdiv = (_binary(op) for op in ("fadd", "fsub", "fmul", "fdiv"))


@intrinsic
def _vclamp(typingctx, a, lo, hi):
    """min(max(a, lo), hi) per lane; NaN stays NaN."""
    if not (a == f64x8 and isinstance(lo, types.Float) and isinstance(hi, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        a, lo, hi = args[0], _splat_ir(builder, args[1]), _splat_ir(builder, args[2])
        a = builder.select(builder.fcmp_ordered("<", a, lo), lo, a)
        return builder.select(builder.fcmp_ordered(">", a, hi), hi, a)

    return f64x8(a, lo, hi), codegen


@intrinsic
def _vhsum(typingctx, v):
    """Lane 0 + lane 1 + ... + lane 7, in that order (the same result every call)."""
    if v != f64x8:
        return None

    def codegen(context, builder, sig, args):
        s = builder.extract_element(args[0], ir.Constant(ir.IntType(32), 0))
        for i in range(1, LANES):
            s = builder.fadd(s, builder.extract_element(args[0], ir.Constant(ir.IntType(32), i)))
        return s

    return types.float64(v), codegen


@intrinsic
def _vpow2n(typingctx, kd):
    """2^n for kd = n + 1023 + 1.5·2^52 (n + 1023 sits in kd's low mantissa bits: the
    shift moves it into the exponent field and drops the rest)."""
    if kd != f64x8:
        return None

    def codegen(context, builder, sig, args):
        bits = builder.shl(builder.bitcast(args[0], _IVEC), ir.Constant(_IVEC, [52] * LANES))
        return builder.bitcast(bits, _VEC)

    return f64x8(kd), codegen


@intrinsic
def _vfnma(typingctx, a, b, c):
    """c − a·b, rounded once."""
    if not (a == b == c == f64x8):
        return None

    def codegen(context, builder, sig, args):
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3),
                                             "llvm.fma.v8f64")
        return builder.call(fma, [builder.fneg(args[0]), args[1], args[2]])

    return f64x8(a, b, c), codegen


@njit(**_JIT, inline="always")
def _vsigmoid(z):
    """:func:`_sigmoid` on 8 lanes in two instructions fewer: with u = clamp(z) and
    r = u + n ln2 = −(−u − n ln2), P(∓r) swap, so −z is never formed; the shifter carries
    the exponent bias, so 2^n is one shift. (Results differ from :func:`_sigmoid` only
    if u·log2 e is exactly halfway between integers: n is then rounded the other way.)"""
    u = _vclamp(z, -708.0, 708.0)
    kd = _vfma(u, _vsplat(-_LOG2E), _vsplat(_SHIFTER + 1023.0))
    n = _vsub(kd, _vsplat(_SHIFTER + 1023.0))
    r = _vfma(n, _vsplat(_LN2_LO), _vfma(n, _vsplat(_LN2_HI), u))
    s = _vmul(r, r)
    even = _vfma(_vfma(_vfma(_vsplat(_C6), s, _vsplat(_C4)), s, _vsplat(_C2)), s, _vsplat(1.0))
    odd = _vmul(_vfma(_vfma(_vsplat(_C5), s, _vsplat(_C3)), s, _vsplat(_C1)), r)
    den = _vadd(even, odd)
    return _vdiv(den, _vfma(_vsub(even, odd), _vpow2n(kd), den))


@njit(**_JIT)
def _vsigmoid_array(z, out):
    """out = σ(z) through the 8-lane kernel (z.size a multiple of 8; for tests)."""
    for i in range(0, z.size, LANES):
        _vstore(out, i, _vsigmoid(_vload(z, i)))


def _transpose_ir(builder, rows):
    """The 8×8 transpose of 8 <8 x double> values (24 shuffles): out[c][r] = rows[r][c]."""
    def shuf(a, b, mask):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), LANES), mask))

    t = []
    for r in range(0, LANES, 2):
        t += [shuf(rows[r], rows[r + 1], [0, 8, 2, 10, 4, 12, 6, 14]),
              shuf(rows[r], rows[r + 1], [1, 9, 3, 11, 5, 13, 7, 15])]
    u = [None] * LANES
    for g in (0, 4):
        for k, (x, y) in enumerate(((0, 2), (1, 3))):
            u[g + k] = shuf(t[g + x], t[g + y], [0, 1, 8, 9, 4, 5, 12, 13])
            u[g + k + 2] = shuf(t[g + x], t[g + y], [2, 3, 10, 11, 6, 7, 14, 15])
    out = [None] * LANES
    for c in range(4):
        out[c] = shuf(u[c], u[c + 4], [0, 1, 2, 3, 8, 9, 10, 11])
        out[c + 4] = shuf(u[c], u[c + 4], [4, 5, 6, 7, 12, 13, 14, 15])
    return out


@intrinsic
def _store_transposed(typingctx, dst, do, dld, v0, v1, v2, v3, v4, v5, v6, v7):
    """dst[do + c·dld + r] = v_r[c] for r, c < 8: 8 vectors stored as the columns of a
    block (one register transpose)."""
    vs = (v0, v1, v2, v3, v4, v5, v6, v7)
    if not (_flat_f64(dst) and isinstance(do, types.Integer) and isinstance(dld, types.Integer)
            and all(v == f64x8 for v in vs)):
        return None

    def codegen(context, builder, sig, args):
        data = _data(context, builder, sig.args[0], args[0])
        do = context.cast(builder, args[1], sig.args[1], types.intp)
        dld = context.cast(builder, args[2], sig.args[2], types.intp)
        for c, col in enumerate(_transpose_ir(builder, list(args[3:]))):
            off = builder.add(do, builder.mul(dld, ir.Constant(ir.IntType(64), c)))
            builder.store(col, builder.bitcast(builder.gep(data, [off]), _VEC.as_pointer()), align=8)
        return context.get_dummy_value()

    return types.none(dst, do, dld, *vs), codegen


# Panels and register tiles. A panel is PW = 32 samples. The workspace keeps, per panel,
# one contiguous block [x feature-major (vp, PW) | a2 (hp, PW) | x sample-major (PW, vp)],
# so the next panel's data is one range to prefetch while this one is computed. The tile
# kernels are generated below (the tiles' accumulators are named variables, so that they
# live in registers); shapes were timed on AVX-512: a tile must fit the 32 registers.
_PV = 4                     # vectors per panel row
PW = LANES * _PV
_RH = 5                     # x W1, δ3 W2ᵀ: 5 hidden units × PW samples
_SB, _TB = 8, 2             # a2 W2: 8 samples × 2 vectors (16 visible units)
_OJ, _OV = 5, 4             # weight gradients: 5 hidden units × 4 vectors of visible units
DEFAULT_GROUP = 64          # samples per group: the gradients' operands stay in L1/L2


def _hidden_source(rows):
    """x W1 for hidden units n0 .. n0 + rows of a panel, then the layer's epilogue:
    z[zo + n·PW + lanes] = b1[n] + Σ_k w1[k·ldw + n] · x[xo + k·PW + lanes] (weights
    broadcast, panel rows as vectors); for n < h, a2 = σ(z) in place and act[n] += a2 on
    the valid lanes (mask at mo); padding units keep z (= 0). Iteration k also prefetches
    two cache lines at pf[pfo + 16k] while k < npf."""
    name = f"_hidden{rows}"
    cols = range(_PV)
    src = [f"def {name}(w, ldw, n0, bias, x, xo, K, z, zo, pf, pfo, npf, h, act, mask, mo):"]
    src += [f"    a{r}_{c} = _vbcast(bias, n0 + {r})" for r in range(rows) for c in cols]
    src += ["    for k in range(K):",
            "        if k < npf:",
            "            _prefetch(pf, pfo + 16 * k)",
            "            _prefetch(pf, pfo + 16 * k + 8)",
            f"        xb = xo + k * {PW}",
            "        wb = k * ldw + n0"]
    src += [f"        x{c} = _vload(x, xb + {LANES * c})" for c in cols]
    for r in range(rows):
        src.append(f"        w{r} = _vbcast(w, wb + {r})")
        src += [f"        a{r}_{c} = _vfma(w{r}, x{c}, a{r}_{c})" for c in cols]
    for r in range(rows):
        src += [f"    if n0 + {r} < h:",
                f"        s = _vload(act, (n0 + {r}) * {LANES})"]
        for c in cols:
            src += [f"        a{r}_{c} = _vsigmoid(a{r}_{c})",
                    f"        s = _vfma(a{r}_{c}, _vload(mask, mo + {LANES * c}), s)"]
        src += [f"        _vstore(act, (n0 + {r}) * {LANES}, s)"]
        src += [f"    _vstore(z, zo + (n0 + {r}) * {PW} + {LANES * c}, a{r}_{c})" for c in cols]
    return name, "\n".join(src)


def _output_source(ns, nv, masked):
    """The output layer for ns = 8 samples of a panel: for each tile of 8·nv visible
    units (c0 = 0, 8·nv, ... < ldw), z = b2 + Σ_k a[ao + k·PW + r] · w2[k·ldw + c0 + ..]
    (a2 broadcast, weight rows as vectors); then, in registers, a3 = σ(z) and δ3 =
    (a3 − x)(a3 − a3²) into d3 (sample-major rows of ldw) and, transposed, into the
    feature-major panel zt (columns zto..) that δ3 W2ᵀ reads; err += (a3 − x)², db2 +=
    δ3 per visible unit. masked: padding columns (cmask) and rows >= nval count zero.
    Iteration i over all tiles prefetches like _hidden's k-th."""
    assert ns == LANES, "the register transpose takes 8 rows"
    name = f"_output{ns}x{nv}{'m' if masked else ''}"
    cs = range(nv)
    src = [f"def {name}(a, ao, w, ldw, bias, K, pf, pfo, npf, x, xo, d3, do, zt, zto, err, db2, cmask,"
           " nval):",
           "    i = 0",
           f"    for c0 in range(0, ldw, {LANES * nv}):"]
    src += [f"        s{r}_{c} = _vload(bias, c0 + {LANES * c})" for r in range(ns) for c in cs]
    src += ["        for k in range(K):",
            "            if i < npf:",
            "                _prefetch(pf, pfo + 16 * i)",
            "                _prefetch(pf, pfo + 16 * i + 8)",
            "            i += 1",
            "            wb = k * ldw + c0",
            f"            ab = ao + k * {PW}"]
    src += [f"            w{c} = _vload(w, wb + {LANES * c})" for c in cs]
    for r in range(ns):
        src.append(f"            b = _vbcast(a, ab + {r})")
        src += [f"            s{r}_{c} = _vfma(b, w{c}, s{r}_{c})" for c in cs]
    for c in cs:
        src += [f"        cc = c0 + {LANES * c}",
                "        se = _vload(err, cc)",
                "        sd = _vload(db2, cc)"]
        if masked:
            src.append("        mk = _vload(cmask, cc)")
        for r in range(ns):
            src += [f"        y = _vsigmoid(s{r}_{c})",
                    f"        d = _vsub(y, _vload(x, xo + {r} * ldw + cc))"]
            if masked:
                src.append(f"        d = _vmul(d, _vmul(mk, _vsplat(1.0 if {r} < nval else 0.0)))")
            src += ["        se = _vfma(d, d, se)",
                    f"        t{r} = _vmul(d, _vfnma(y, y, y))",
                    f"        _vstore(d3, do + {r} * ldw + cc, t{r})",
                    f"        sd = _vadd(sd, t{r})"]
        rows = ", ".join(f"t{r}" for r in range(ns))
        src += [f"        _store_transposed(zt, zto + cc * {PW}, {PW}, {rows})",
                "        _vstore(err, cc, se)",
                "        _vstore(db2, cc, sd)"]
    return name, "\n".join(src)


def _backward_source(rows, fold):
    """e = δ3 W2ᵀ for hidden units n0 .. n0 + rows of a panel (x: the feature-major δ3
    panel, K rows; weights broadcast), then the hidden layer's backward epilogue: for
    j < h, s = a2 − a2² (a2 rows of the panel at ao; zero on padding lanes); folded: d2
    row j = δ2 = (e + k_j) s; split: d2 row j = e s and row ldw + j = s. db1 gets the
    row sums per lane."""
    name = f"_backward{rows}{'f' if fold else 's'}"
    cols = range(_PV)
    src = [f"def {name}(w, ldw, n0, x, K, a2, ao, k, h, d2, do, db1, mask, mo):"]
    src += [f"    a{r}_{c} = _vsplat(0.0)" for r in range(rows) for c in cols]
    src += ["    for kk in range(K):",
            f"        xb = kk * {PW}",
            "        wb = kk * ldw + n0"]
    src += [f"        x{c} = _vload(x, xb + {LANES * c})" for c in cols]
    for r in range(rows):
        src.append(f"        w{r} = _vbcast(w, wb + {r})")
        src += [f"        a{r}_{c} = _vfma(w{r}, x{c}, a{r}_{c})" for c in cols]
    src += [f"    mk{c} = _vload(mask, mo + {LANES * c})" for c in cols]
    for r in range(rows):
        src += [f"    j = n0 + {r}",
                "    if j < h:",
                f"        s1 = _vload(db1, j * {LANES})",
                "        kj = _vbcast(k, j)" if fold else f"        s2 = _vload(db1, (ldw + j) * {LANES})"]
        for c in cols:
            src += [f"        y = _vload(a2, ao + j * {PW} + {LANES * c})",
                    f"        s = _vmul(_vfnma(y, y, y), mk{c})"]
            if fold:
                src.append(f"        d = _vmul(_vadd(a{r}_{c}, kj), s)")
            else:
                src += [f"        d = _vmul(a{r}_{c}, s)",
                        f"        _vstore(d2, do + (ldw + j) * {PW} + {LANES * c}, s)",
                        "        s2 = _vadd(s2, s)"]
            src += [f"        _vstore(d2, do + j * {PW} + {LANES * c}, d)",
                    "        s1 = _vadd(s1, d)"]
        src.append(f"        _vstore(db1, j * {LANES}, s1)")
        if not fold:
            src.append(f"        _vstore(db1, (ldw + j) * {LANES}, s2)")
    return name, "\n".join(src)


def _outer_source(nj, nv):
    """A weight-gradient tile: acc[co + j·lda + 8c] += Σ_q Σ_s a[ao + q·sa + j·PW + s] ·
    b[bo + q·sb + s·ldb + 8c] for j < nj rows of panels (a broadcast per sample) and nv
    vectors of sample-major rows, over npan panels q of PW samples s: a sum over samples
    as outer products, the accumulators in registers."""
    name = f"_outer{nj}x{nv}"
    src = [f"def {name}(a, ao, sa, b, bo, sb, ldb, npan, acc, co, lda):"]
    src += [f"    s{j}_{c} = _vload(acc, co + {j} * lda + {LANES * c})"
            for j in range(nj) for c in range(nv)]
    src += ["    for q in range(npan):",
            "        aq = ao + q * sa",
            "        bq = bo + q * sb",
            f"        for s in range({PW}):",
            "            bs = bq + s * ldb"]
    src += [f"            b{c} = _vload(b, bs + {LANES * c})" for c in range(nv)]
    for j in range(nj):
        src.append(f"            w = _vbcast(a, aq + {j * PW} + s)")
        src += [f"            s{j}_{c} = _vfma(w, b{c}, s{j}_{c})" for c in range(nv)]
    src += [f"    _vstore(acc, co + {j} * lda + {LANES * c}, s{j}_{c})"
            for j in range(nj) for c in range(nv)]
    return name, "\n".join(src)


def _define(name_source):
    """Compile generated source as if written in this file (so Numba caches it here)."""
    name, source = name_source
    scope = {}
    exec(compile(source, __file__, "exec"), globals(), scope)
    fn = njit(**_JIT)(scope[name])
    globals()[name] = fn
    return fn


_hidden_tile = _define(_hidden_source(_RH))
_output_full = _define(_output_source(_SB, _TB, False))
_output_masked = _define(_output_source(_SB, _TB, True))
_backward_fold = _define(_backward_source(_RH, True))
_backward_split = _define(_backward_source(_RH, False))
_outer_tile = _define(_outer_source(_OJ, _OV))


@njit(**_JIT)
def _pack_panels(x, blocks, vp, hp):
    """x into the panel blocks (both layouts), zero padding; a2 rows zeroed."""
    m, v = x.shape
    blk = (2 * vp + hp) * PW
    so = (vp + hp) * PW
    blocks[:] = 0.0
    for s in range(m):
        base = (s // PW) * blk
        l = s % PW
        for i in range(v):
            blocks[base + i * PW + l] = x[s, i]
            blocks[base + so + l * vp + i] = x[s, i]


@njit(**_JIT, inline="always")
def _tile_prefetch(t, per, lines):
    """(offset, line pairs) of the next block's lines that call t prefetches, per lines
    (an even number) to a call."""
    lo = min(t * per, lines)
    return lo * LANES, (min(lo + per, lines) - lo + 1) >> 1


@njit(**_JIT)
def _sweeps(blocks, npan, p_lo, p_hi, m, v, h, vp, hp, w1, w2, w2t, b1p, b2p, cmask, kv, zt, d3, d2,
            gw1, gw2, act, err, db1, db2, mask, group, fold, rho, beta):
    """The sweeps over panels [p_lo, p_hi) of the npan packed ones (all arrays as raw
    pointers; see _partials_panels)."""
    ao, so = vp * PW, (vp + hp) * PW       # a2 and sample-major x within a block
    blk = so + PW * vp
    nh = hp if fold else 2 * hp            # rows of d2 panels: δ2, or e·s then s
    ht = hp // _RH
    # Cache lines of the next block that each call prefetches (an even number): x and a2
    # over the x W1 tiles in sweep 1; x feature-major (split) over the x W1 tiles and a2 +
    # x sample-major over the PW / _SB output-layer calls in sweep 2.
    per1 = -(-so // (LANES * 2 * ht)) * 2
    per0 = -(-ao // (LANES * 2 * ht)) * 2
    per2 = -(-(blk - ao) // (LANES * 2 * (PW // _SB))) * 2
    if fold:
        # sweep 1: a2 of every panel and ρ̂, so that k is known for sweep 2
        for p in range(p_lo, p_hi):
            base = p * blk
            lines = so // LANES if p + 1 < npan else 0
            for t in range(ht):
                pfo, npf = _tile_prefetch(t, per1, lines)
                _hidden_tile(w1, hp, t * _RH, b1p, blocks, base, vp, blocks, base + ao,
                             blocks, base + blk + pfo, npf, h, act, mask, PW if p == npan - 1 else 0)
        for j in range(h):
            rho_hat = _vhsum(_vload(act, j * LANES)) / m
            kv[j] = beta * (-rho / rho_hat + (1.0 - rho) / (1.0 - rho_hat))
    for g0 in range(p_lo, p_hi, group):
        g1 = min(g0 + group, p_hi)
        for p in range(g0, g1):
            base = p * blk
            nxt = p + 1 < npan
            last = p == npan - 1
            mo = PW if last else 0
            if not fold:
                lines = ao // LANES if nxt else 0
                for t in range(ht):
                    pfo, npf = _tile_prefetch(t, per0, lines)
                    _hidden_tile(w1, hp, t * _RH, b1p, blocks, base, vp, blocks, base + ao,
                                 blocks, base + blk + pfo, npf, h, act, mask, mo)
            # output layer, 8 samples at a time (a3, δ3 both ways, sums); meanwhile the
            # next block's a2 and x rows are prefetched
            lines = (blk - ao) // LANES if nxt else 0
            nval = m - p * PW if last else PW
            do3 = (p - g0) * PW * vp
            for s0 in range(0, PW, _SB):
                pfo, npf = _tile_prefetch(s0 // _SB, per2, lines)
                if nval < PW or vp > v:
                    _output_masked(blocks, base + ao + s0, w2, vp, b2p, hp, blocks, base + blk + ao + pfo,
                                   npf, blocks, base + so + s0 * vp, d3, do3 + s0 * vp, zt, s0, err, db2,
                                   cmask, nval - s0)
                else:
                    _output_full(blocks, base + ao + s0, w2, vp, b2p, hp, blocks, base + blk + ao + pfo,
                                 npf, blocks, base + so + s0 * vp, d3, do3 + s0 * vp, zt, s0, err, db2,
                                 cmask, nval - s0)
            # hidden layer backward: e = δ3 W2ᵀ from the feature-major δ3, then δ2
            do2 = (p - g0) * nh * PW
            for t in range(ht):
                if fold:
                    _backward_fold(w2t, hp, t * _RH, zt, vp, blocks, base + ao, kv, h, d2, do2, db1, mask, mo)
                else:
                    _backward_split(w2t, hp, t * _RH, zt, vp, blocks, base + ao, kv, h, d2, do2, db1, mask,
                                    mo)
        # the group's weight gradients: gw2 (hp, vp) += Σ a2 ⊗ δ3, gw1 (nh, vp) += Σ d2 ⊗ x
        for c0 in range(0, vp, LANES * _OV):
            for j0 in range(0, hp, _OJ):
                _outer_tile(blocks, g0 * blk + ao + j0 * PW, blk, d3, c0, PW * vp, vp, g1 - g0,
                            gw2, j0 * vp + c0, vp)
            for j0 in range(0, nh, _OJ):
                _outer_tile(d2, j0 * PW, nh * PW, blocks, g0 * blk + so + c0, blk, vp, g1 - g0,
                            gw1, j0 * vp + c0, vp)


@njit(**_JIT)
def _partials_panels(blocks, m, W1, b1, W2, b2, w1, w2, w2t, b1p, b2p, cmask, kv, zt, d3, d2,
                     gw1, gw2, act, err, db1, db2, mask, group, fold, rho, beta, leaf_panels, res):
    """res[L] = the packed sums over leaf L (panels [L leaf_panels, (L + 1) leaf_panels); one
    leaf of every panel when leaf_panels is 0), each leaf summed alone."""
    v, h = W1.shape
    hp, vp = kv.size, b2p.size
    npan = blocks.size // ((2 * vp + hp) * PW)
    # zero-padded weights in the layouts the tiles read
    for j in range(h):
        b1p[j] = b1[j]
    for i in range(v):
        b2p[i] = b2[i]
        for j in range(h):
            w1[i * hp + j] = W1[i, j]
            w2t[i * hp + j] = W2[j, i]
            w2[j * vp + i] = W2[j, i]
    P = _dptr
    per = leaf_panels if leaf_panels > 0 else max(npan, 1)
    for leaf in range(res.shape[0]):
        for arr in (gw1, gw2, act, err, db1, db2):
            arr[:] = 0.0
        p_lo = leaf * per
        _sweeps(P(blocks), npan, p_lo, min(p_lo + per, npan), m, v, h, vp, hp, P(w1), P(w2), P(w2t),
                P(b1p), P(b2p), P(cmask), P(kv), P(zt), P(d3), P(d2), P(gw1), P(gw2), P(act), P(err),
                P(db1), P(db2), P(mask), group, fold, rho, beta)
        _unpad(gw1, gw2, act, err, db1, db2, v, h, vp, hp, fold, res[leaf])


@njit(**_JIT)
def _unpad(gw1, gw2, act, err, db1, db2, v, h, vp, hp, fold, res):
    """The padded accumulators -> one packed partials vector (reference layout)."""
    o_b1 = 2 * v * h
    o_w2 = o_b1 + 2 * h
    o_b2 = o_w2 + v * h
    o_act = o_b2 + v
    res[:] = 0.0
    for i in range(v):
        for j in range(h):
            res[i * 2 * h + j] = gw1[j * vp + i]
            if not fold:
                res[i * 2 * h + h + j] = gw1[(hp + j) * vp + i]
            res[o_w2 + j * v + i] = gw2[j * vp + i]
    for j in range(h):
        res[o_b1 + j] = _vhsum(_vload(db1, j * LANES))
        if not fold:
            res[o_b1 + h + j] = _vhsum(_vload(db1, (hp + j) * LANES))
        res[o_act + j] = _vhsum(_vload(act, j * LANES))
    total = 0.0
    for i in range(v):
        res[o_b2 + i] = db2[i]
        total += err[i]
    res[o_act + h] = total


def _round_up(n, k):
    return -(-n // k) * k


def _zeros64(n):
    """Zeros whose data starts on a 64-byte boundary: a vector load that straddles two
    cache lines costs two, which halved the speed of every tile."""
    buf = np.zeros(n + LANES)
    start = (-buf.ctypes.data % 64) // 8
    return buf[start:start + n]


class SparseAEWorkspace:
    """Scratch arrays for :func:`sparse_ae_partials` on ``m`` samples, made once per model.

    float64: x packed into panel blocks (kept until a different or changed x comes) with
    every panel's hidden activations, one group's δ3/δ2, the accumulators and padded
    weights; ``block`` is the group size in samples (default 64). Other dtypes: the
    shard's hidden activations (m, h) and per-block buffers of ``block`` rows (256).
    """

    def __init__(self, m: int, visible: int, hidden: int, dtype=np.float64, block: int | None = None,
                 leaf: int | None = None):
        dtype = np.dtype(dtype)
        v, h = int(visible), int(hidden)
        self.m, self.visible, self.hidden, self.dtype = int(m), v, h, dtype
        self.leaf = None if leaf is None else int(leaf)
        if self.leaf is not None and dtype == np.float64 and self.leaf % PW:
            raise ValueError(f"leaf of {self.leaf} samples: the float64 kernel needs a multiple of {PW}")
        self.simd = dtype == np.float64
        self.acc = _zeros64(sparse_ae_partials_size(v, h))
        layout = sparse_ae_layout(v, h)
        self.views = {name: self.acc[o:o + int(np.prod(s))].reshape(s) for name, (o, s) in layout.items()}
        if self.simd:
            self._init_panels(block)
        else:
            self._init_blocks(block)

    def _init_panels(self, block):
        v, h = self.visible, self.hidden
        vp = _round_up(v, LANES * np.lcm(_TB, _OV))
        hp = _round_up(h, np.lcm(_RH, _OJ))
        npan = -(-self.m // PW)
        self.block = int(self.leaf or block or DEFAULT_GROUP)  # a leaf is one group
        self.group = max(1, -(-self.block // PW))
        g = min(self.group, max(npan, 1))
        z = _zeros64
        self.blocks = z(npan * (2 * vp + hp) * PW)
        self.zt = z(vp * PW)
        self.d3, self.d2 = z(g * PW * vp), z(g * 2 * hp * PW)
        self.gw1, self.gw2 = z(2 * hp * vp), z(hp * vp)
        self.act, self.db1 = z(hp * LANES), z(2 * hp * LANES)
        self.err, self.db2 = z(vp), z(vp)
        self.w1, self.w2, self.w2t = z(vp * hp), z(hp * vp), z(vp * hp)
        self.b1p, self.b2p, self.kv = z(hp), z(vp), z(hp)
        self.cmask = z(vp)
        self.cmask[:v] = 1.0
        self.mask = z(2 * PW)  # lanes of a full panel, then of the last panel
        self.mask[:PW + (self.m - (npan - 1) * PW if npan else PW)] = 1.0
        self.vp, self.hp = vp, hp
        self._packed = None  # (x, its fingerprint) last packed

    def _init_blocks(self, block):
        v, h, dtype = self.visible, self.hidden, self.dtype
        self.block = int(block or DEFAULT_BLOCK)
        rows = max(1, min(self.block, self.m))
        self.a2 = np.empty((max(self.m, 1), h), dtype)
        self.z3 = np.empty((rows, v), dtype)
        self.e = np.empty((rows, h), dtype)
        self.g = np.empty((rows, 2 * h), dtype)
        self.t_vh = np.empty((v, h), dtype)
        self.t_v2h = np.empty((v, 2 * h), dtype)
        self.t_hv = np.empty((h, v), dtype)
        self.W2t = np.empty((v, h), dtype)
        self.acc_err = np.zeros(v)  # per-column squared error, summed at the end

    def fits(self, x, W1, leaf=None) -> bool:
        return (x.shape[0] == self.m and W1.shape == (self.visible, self.hidden) and x.dtype == self.dtype
                and (leaf is None or self.leaf == int(leaf)))

    @staticmethod
    def _fingerprint(x):
        flat = x.reshape(-1)
        return flat[::max(1, flat.size // 61)].copy()

    def pack(self, x):
        """Pack ``x`` into the panels unless it is the array packed last time, unchanged
        (same object and the same values at ~64 spread-out places)."""
        if self._packed is not None and self._packed[0] is x \
                and np.array_equal(self._packed[1], self._fingerprint(x)):
            return
        _pack_panels(x, self.blocks, self.vp, self.hp)
        self._packed = (x, self._fingerprint(x))


def sparse_ae_workspace(m: int, visible: int, hidden: int, dtype=np.float64, block: int | None = None,
                        leaf: int | None = None):
    """A :class:`SparseAEWorkspace` for ``m`` samples of a ``visible``-``hidden`` model
    (``leaf``: the samples per leaf the partials will be asked for, a multiple of 32 in
    float64)."""
    return SparseAEWorkspace(m, visible, hidden, dtype, block, leaf)


def sparse_ae_partials(x, W1, b1, W2, b2, out, ws=None, kl=None, leaf=None):
    """Fill ``out`` with this shard's packed sums (see the reference); returns ``out``.

    ``ws`` should be a workspace made once for this shard (one is made per call if not,
    which allocates); ``kl=(rho, beta)`` when the shard holds all samples. With ``leaf``,
    ``out`` is (ceil(m / leaf), size) and row L holds the sums over samples
    [L leaf, (L + 1) leaf) alone. In float64 the workspace keeps x packed between calls:
    pass the same array again, or a new one (an array changed in place is noticed only
    at the ~64 places it samples).
    """
    v, h = W1.shape
    m = x.shape[0]
    rows = _check_leaves(m, out, kl, leaf)
    if ws is None or not ws.fits(x, W1, leaf):
        ws = SparseAEWorkspace(m, v, h, x.dtype, leaf=leaf)
    c = np.ascontiguousarray
    fold = kl is not None
    rho, beta = (float(kl[0]), float(kl[1])) if fold else (0.0, 0.0)
    if ws.simd:
        x = c(x)
        ws.pack(x)
        _partials_panels(ws.blocks, m, c(W1), c(b1), c(W2), c(b2), ws.w1, ws.w2, ws.w2t,
                         ws.b1p, ws.b2p, ws.cmask, ws.kv, ws.zt, ws.d3, ws.d2,
                         ws.gw1, ws.gw2, ws.act, ws.err, ws.db1, ws.db2, ws.mask, ws.group, fold, rho,
                         beta, 0 if leaf is None else int(leaf) // PW, rows)
    else:
        V = ws.views
        step = m if leaf is None else int(leaf)
        for i, i0 in enumerate(range(0, max(m, 1), max(step, 1))):
            i1 = min(i0 + step, m)
            _partials_blas(c(x[i0:i1]), c(W1), c(b1), c(W2), c(b2), ws.W2t, ws.a2, ws.z3, ws.e, ws.g,
                           ws.t_vh, ws.t_v2h, ws.t_hv, V["w1"], V["b1"], V["w2"], V["b2"], V["act"],
                           ws.acc_err, ws.block, fold, rho, beta)
            V["err"][0] = ws.acc_err.sum()
            rows[i] = ws.acc
    return out


def _check_leaves(m, out, kl, leaf):
    """``out`` as rows (one per leaf; a 1-row view without ``leaf``), checked."""
    return out.reshape(1, -1) if leaf is None else leaf_rows(m, out, kl, leaf)


@njit(**_JIT)
def _assemble(p, W1, W2, m, rho, beta, lam, grad):
    v, h = W1.shape
    vh = v * h
    o_b1 = 2 * vh
    o_w2 = o_b1 + 2 * h
    o_b2 = o_w2 + vh
    o_act = o_b2 + v
    o_err = o_act + h
    k = np.empty(h)
    kl = 0.0
    for j in range(h):
        rho_hat = p[o_act + j] / m
        k[j] = beta * (-rho / rho_hat + (1.0 - rho) / (1.0 - rho_hat))
        kl += rho * np.log(rho / rho_hat) + (1.0 - rho) * np.log((1.0 - rho) / (1.0 - rho_hat))
    decay = 0.0
    for i in range(v):
        for j in range(h):
            w1 = W1[i, j]
            w2 = W2[j, i]
            decay += w1 * w1 + w2 * w2
            grad[i * h + j] = (p[i * 2 * h + j] + p[i * 2 * h + h + j] * k[j]) / m + lam * w1
    for j in range(h):
        for i in range(v):
            grad[vh + j * v + i] = p[o_w2 + j * v + i] / m + lam * W2[j, i]
        grad[2 * vh + j] = (p[o_b1 + j] + k[j] * p[o_b1 + h + j]) / m
    for i in range(v):
        grad[2 * vh + h + i] = p[o_b2 + i] / m
    return p[o_err] / (2.0 * m) + 0.5 * lam * decay + beta * kl


def sparse_ae_assemble(partials, W1, W2, m, rho, beta, lam, grad=None):
    """Cost and float64 gradient from the summed partials (see the reference)."""
    v, h = W1.shape
    if grad is None:
        grad = np.empty(sparse_ae_theta_size(v, h))
    p = np.ascontiguousarray(partials, dtype=np.float64)
    cost = _assemble(p, np.ascontiguousarray(W1, dtype=np.float64),
                     np.ascontiguousarray(W2, dtype=np.float64), float(m), float(rho), float(beta),
                     float(lam), grad)
    return float(cost), grad
