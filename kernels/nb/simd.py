"""Explicit vectors for Numba kernels: one register's worth of float64 (:data:`f64x8`) or
float32 (:data:`f32x16`) and their intrinsics, and the vector ISA Numba compiles for
(:func:`target_isa`). :mod:`.simd32` adds float32 loads and stores from addresses and
masks, for :mod:`.rowprod`.

Numba has no vector type, so f64x8 and f32x16 are Numba types whose LLVM values are
<8 x double> and <16 x float> (one AVX-512 register; LLVM splits each in two on AVX2),
used through the intrinsics below. Kernels written with them keep their register tiles in
registers, which auto-vectorised loops do not; the tile shapes that fit each CPU's
registers are chosen in :mod:`.sparse_tiles`. The intrinsics take either kind: a load
gives the vector of its array's precision (:func:`lanes` says how many), arithmetic keeps
it, so one kernel's source serves both precisions. Loads and stores take raw pointers
(:func:`dptr`) as well as flat arrays, because Numba's reference counting of array
arguments (atomic) cost more than a small tile.
"""
from __future__ import annotations

import functools
import re

from llvmlite import ir
from llvmlite import binding as ll
from llvmlite.binding import llvm_version_info
from numba import njit, types
from numba.core import cgutils, config
from numba.extending import intrinsic, models, overload, register_model

from .nbmath import (_LN2_HI_F, _LN2_LO_F, _LOG2E_F, _P_F, C1, C2, C3, C4, C5, C6, LN2_HI, LN2_LO, LOG2E,
                     SHIFTER)

__all__ = ["LANES", "f64x8", "f32x16", "lanes", "dptr", "rowptr", "vload", "vstore", "vbcast", "vfill", "prefetch",
           "prefetch_l2", "vsplat", "vfma", "vfnma", "vadd", "vsub", "vmul", "vdiv", "vclamp", "vhsum", "vtreesum",
           "vpow2n", "vsigmoid", "vsigmoid_array", "store_transposed", "JIT", "target_isa", "hardware_fma", "host_fma"]

# error_model="numpy": no ZeroDivisionError branch, which would stop LLVM from
# vectorising; "contract" lets it use FMAs (no reassociation, so rounding tricks survive).
JIT = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})

LANES = 8  # float64 lanes of a vector (and float64 numbers of a 64-byte cache line)


class _F64x8(types.Type):
    def __init__(self):
        super().__init__(name="f64x8")


class _F32x16(types.Type):
    def __init__(self):
        super().__init__(name="f32x16")


f64x8, f32x16 = _F64x8(), _F32x16()
_VEC = ir.VectorType(ir.DoubleType(), LANES)
_IVEC = ir.VectorType(ir.IntType(64), LANES)
_VEC32 = ir.VectorType(ir.FloatType(), 2 * LANES)
# each precision's vector: (Numba type, LLVM type, lanes, LLVM's name for it in intrinsics)
_KINDS = {types.float64: (f64x8, _VEC, LANES, "v8f64"), types.float32: (f32x16, _VEC32, 2 * LANES, "v16f32")}
_OF_VECTOR = {kind[0]: kind for kind in _KINDS.values()}


@register_model(_F64x8)
class _F64x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC)


@register_model(_F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC32)


def _flat(a):
    """The element type of a flat C-contiguous float64 or float32 array, or of a raw pointer
    to either (see :func:`dptr`); None for anything else."""
    if isinstance(a, types.CPointer):
        return a.dtype if a.dtype in _KINDS else None
    if isinstance(a, types.Array) and a.dtype in _KINDS and a.ndim == 1 and a.layout == "C":
        return a.dtype
    return None


def _flat_f32(a):
    """A flat C-contiguous float32 array (no pointer: :mod:`.simd32`'s loads take arrays or addresses)."""
    return isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1 and a.layout == "C"


def _data(context, builder, ty, val):
    """The element pointer behind an array or pointer argument."""
    if isinstance(ty, types.CPointer):
        return val
    return context.make_array(ty)(context, builder, value=val).data


def _vec_ptr(context, builder, arrty, arr, idx, idxty):
    data = _data(context, builder, arrty, arr)
    idx = context.cast(builder, idx, idxty, types.intp)
    return builder.bitcast(builder.gep(data, [idx]), _KINDS[_flat(arrty)][1].as_pointer())


def lanes(a):
    """The lanes of a vector loaded from ``a`` (a flat float64 or float32 array or pointer):
    8 or 16, a constant where compiled. Also the numbers in a 64-byte cache line."""


@overload(lanes, inline="always")
def _lanes_impl(a):
    kind = _flat(a)
    if kind is not None:
        n = _KINDS[kind][2]
        return lambda a: n


@intrinsic
def dptr(typingctx, a):
    """The data pointer of a flat float64 or float32 array. Kernels take pointers, not
    arrays: an array argument costs atomic reference-count updates on every call where
    Numba cannot prove them redundant, which cost more than a small tile's arithmetic."""
    if not (isinstance(a, types.Array) and a.dtype in _KINDS and a.ndim == 1 and a.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        return context.make_array(sig.args[0])(context, builder, value=args[0]).data

    return types.CPointer(a.dtype)(a), codegen


@intrinsic
def rowptr(typingctx, a, i):
    """The data pointer of row i of a 2-D float64 or float32 array of any layout (for rows
    of a column slice, which Numba types as non-contiguous): the caller makes sure that
    the row's elements are adjacent (strides[1] == itemsize)."""
    if not (isinstance(a, types.Array) and a.dtype in _KINDS and a.ndim == 2 and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        arr = context.make_array(sig.args[0])(context, builder, value=args[0])
        row = context.cast(builder, args[1], sig.args[1], types.intp)
        stride = builder.extract_value(arr.strides, 0)
        base = builder.ptrtoint(arr.data, ir.IntType(64))
        return builder.inttoptr(builder.add(base, builder.mul(row, stride)), arr.data.type)

    return types.CPointer(a.dtype)(a, i), codegen


def _splat_ir(builder, x, vec=_VEC):
    v = builder.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, ir.Constant(vec, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), vec.count), [0] * vec.count))


@intrinsic
def vload(typingctx, a, i):
    """a[i:i + lanes(a)] of a flat float64 or float32 array (no bounds check, any alignment)."""
    kind = _flat(a)
    if not (kind is not None and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_vec_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1]),
                            align=kind.bitwidth // 8)

    return _KINDS[kind][0](a, i), codegen


@intrinsic
def vstore(typingctx, a, i, v):
    """a[i:i + lanes(a)] = v (v of a's precision)."""
    kind = _flat(a)
    if not (kind is not None and isinstance(i, types.Integer) and v == _KINDS[kind][0]):
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _vec_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1]),
                      align=kind.bitwidth // 8)
        return context.get_dummy_value()

    return types.none(a, i, v), codegen


@intrinsic
def vbcast(typingctx, a, i):
    """a[i] in every lane (a plain load: no negative-index wraparound code)."""
    kind = _flat(a)
    if not (kind is not None and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        data = _data(context, builder, sig.args[0], args[0])
        idx = context.cast(builder, args[1], sig.args[1], types.intp)
        return _splat_ir(builder, builder.load(builder.gep(data, [idx])), _KINDS[kind][1])

    return _KINDS[kind][0](a, i), codegen


@intrinsic
def vfill(typingctx, a, x):
    """x in every lane of a vector of a's precision (a: a flat array or pointer, as
    :func:`vload`'s): the constants of a kernel written for either."""
    kind = _flat(a)
    if not (kind is not None and isinstance(x, (types.Float, types.Integer))):
        return None

    def codegen(context, builder, sig, args):
        return _splat_ir(builder, context.cast(builder, args[1], sig.args[1], kind), _KINDS[kind][1])

    return _KINDS[kind][0](a, x), codegen


# llvm.prefetch is overloaded on the pointer type: "p0" with opaque pointers (LLVM >= 15)
_PREFETCH = "llvm.prefetch.p0" if llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


def _prefetcher(locality, doc):
    """An intrinsic f(a, i) asking for the cache line holding a[i] of a flat float64 or
    float32 array with llvm.prefetch's ``locality`` (3: into L1, 2: into L2; a hint:
    never faults, even past the end)."""
    @intrinsic
    def ask(typingctx, a, i):
        if not (_flat(a) is not None and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            data = _data(context, builder, sig.args[0], args[0])
            idx = context.cast(builder, args[1], sig.args[1], types.intp)
            ptr = builder.bitcast(builder.gep(data, [idx]), ir.PointerType(ir.IntType(8)))
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]), _PREFETCH)
            builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return types.none(a, i), codegen
    ask.__doc__ = doc
    return ask


prefetch = _prefetcher(3, "Ask for the cache line holding a[i] in L1 (x86: prefetcht0).")
# where L1 is busy with a kernel's own operands and the line is wanted only later
prefetch_l2 = _prefetcher(2, "Ask for the cache line holding a[i] in L2, not L1 (x86: prefetcht1).")


@intrinsic
def vsplat(typingctx, x):
    """x in every lane."""
    if not isinstance(x, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return _splat_ir(builder, context.cast(builder, args[0], sig.args[0], types.float64))

    return f64x8(x), codegen


def _fma_ir(builder, vec_kind, a, b, c):
    """a * b + c: LLVM's fma, one instruction where the target has FMA; on an x86 target
    without it (:func:`hardware_fma`) a multiply, then an add, each rounded, as Numba's
    contracted loops compute there (LLVM's fma would be a library call per lane: exact,
    but far slower, and other bits than those loops')."""
    _, vec, _, name = vec_kind
    if not hardware_fma():
        return builder.fadd(builder.fmul(a, b), c)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), "llvm.fma." + name)
    return builder.call(fma, [a, b, c])


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c, rounded once."""
    if not (a == b == c and a in _OF_VECTOR):
        return None

    def codegen(context, builder, sig, args):
        return _fma_ir(builder, _OF_VECTOR[a], *args)

    return a(a, b, c), codegen


def _binary(op):
    @intrinsic
    def _op(typingctx, a, b):
        if not (a == b and a in _OF_VECTOR):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])

        return a(a, b), codegen

    return _op


vadd, vsub, vmul, vdiv = (_binary(op) for op in ("fadd", "fsub", "fmul", "fdiv"))


@intrinsic
def vclamp(typingctx, a, lo, hi):
    """min(max(a, lo), hi) per lane; NaN stays NaN."""
    if not (a == f64x8 and isinstance(lo, types.Float) and isinstance(hi, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        a, lo, hi = args[0], _splat_ir(builder, args[1]), _splat_ir(builder, args[2])
        a = builder.select(builder.fcmp_ordered("<", a, lo), lo, a)
        return builder.select(builder.fcmp_ordered(">", a, hi), hi, a)

    return f64x8(a, lo, hi), codegen


@intrinsic
def vhsum(typingctx, v):
    """Lane 0 + lane 1 + ... + the last lane, in that order (the same result every call),
    in the vector's precision."""
    if v not in _OF_VECTOR:
        return None
    count = _OF_VECTOR[v][2]

    def codegen(context, builder, sig, args):
        s = builder.extract_element(args[0], ir.Constant(ir.IntType(32), 0))
        for i in range(1, count):
            s = builder.fadd(s, builder.extract_element(args[0], ir.Constant(ir.IntType(32), i)))
        return s

    return (types.float64 if v == f64x8 else types.float32)(v), codegen


@intrinsic
def vtreesum(typingctx, v):
    """((lane 0 + lane 1) + (lane 2 + lane 3)) + ((lane 4 + lane 5) + (lane 6 + lane 7)):
    eight partial sums added in a fixed tree, as a scalar kernel with eight named sums would."""
    if v != f64x8:
        return None

    def codegen(context, builder, sig, args):
        level = [builder.extract_element(args[0], ir.Constant(ir.IntType(32), i)) for i in range(LANES)]
        while len(level) > 1:
            level = [builder.fadd(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        return level[0]

    return types.float64(v), codegen


@intrinsic
def vpow2n(typingctx, kd):
    """2^n for kd = n + 1023 + 1.5·2^52 (n + 1023 sits in kd's low mantissa bits: the
    shift moves it into the exponent field and drops the rest)."""
    if kd != f64x8:
        return None

    def codegen(context, builder, sig, args):
        bits = builder.shl(builder.bitcast(args[0], _IVEC), ir.Constant(_IVEC, [52] * LANES))
        return builder.bitcast(bits, _VEC)

    return f64x8(kd), codegen


@intrinsic
def vfnma(typingctx, a, b, c):
    """c − a·b, rounded once."""
    if not (a == b == c and a in _OF_VECTOR):
        return None

    def codegen(context, builder, sig, args):
        return _fma_ir(builder, _OF_VECTOR[a], builder.fneg(args[0]), args[1], args[2])

    return a(a, b, c), codegen


def vsigmoid(z):
    """σ(z) = 1 / (1 + exp(−z)) on every lane, in the vector's precision: float64 as
    :func:`.nbmath.sigmoid64` (to a few ulp), float32 as :func:`.nbmath.sigmoid32` (the
    same bits: tails down to the smallest subnormal, NaN kept)."""


@overload(vsigmoid, inline="always")
def _vsigmoid_impl(z):
    if z == f64x8:
        return lambda z: _vsigmoid64(z)
    if z == f32x16:
        return lambda z: _vsigmoid32(z)


@njit(**JIT, inline="always")
def _vsigmoid64(z):
    """:func:`.nbmath.sigmoid64` on 8 lanes in two instructions fewer: with u = clamp(z) and
    r = u + n ln2 = −(−u − n ln2), P(∓r) swap, so −z is never formed; the shifter carries
    the exponent bias, so 2^n is one shift. (Results differ from the scalar one only
    if u·log2 e is exactly halfway between integers: n is then rounded the other way.)"""
    u = vclamp(z, -708.0, 708.0)
    kd = vfma(u, vsplat(-LOG2E), vsplat(SHIFTER + 1023.0))
    n = vsub(kd, vsplat(SHIFTER + 1023.0))
    r = vfma(n, vsplat(LN2_LO), vfma(n, vsplat(LN2_HI), u))
    s = vmul(r, r)
    even = vfma(vfma(vfma(vsplat(C6), s, vsplat(C4)), s, vsplat(C2)), s, vsplat(1.0))
    odd = vmul(vfma(vfma(vsplat(C5), s, vsplat(C3)), s, vsplat(C1)), r)
    den = vadd(even, odd)
    return vdiv(den, vfma(vsub(even, odd), vpow2n(kd), den))


@intrinsic
def _vsigmoid32(typingctx, z):
    """:func:`.nbmath.sigmoid32` on 16 float32 lanes, its operations one for one (each of
    its contracted products and sums one FMA here), so the same bits."""
    if z != f32x16:
        return None

    def codegen(context, builder, sig, args):
        n, i32 = 2 * LANES, ir.IntType(32)
        ivec = ir.VectorType(i32, n)

        def const(x):
            return ir.Constant(_VEC32, [float(x)] * n)

        def call(name, *values):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC32, [_VEC32] * len(values)),
                                                f"llvm.{name}.v16f32")
            return builder.call(fn, list(values))

        def fma(a, b, c):
            return _fma_ir(builder, _OF_VECTOR[f32x16], a, b, c)

        def pow2(k):  # 2^k from its exponent bits, -126 <= k <= 127
            return builder.bitcast(builder.shl(builder.add(k, ir.Constant(ivec, [127] * n)),
                                               ir.Constant(ivec, [23] * n)), _VEC32)

        z = args[0]
        a = call("fabs", z)
        a = builder.select(builder.fcmp_unordered("<", a, const(104.0)), a, const(104.0))  # NaN stays
        x = builder.fneg(a)
        nf = call("floor", fma(x, const(_LOG2E_F), const(0.5)))
        r = fma(builder.fneg(nf), const(_LN2_LO_F), fma(builder.fneg(nf), const(_LN2_HI_F), x))
        p = const(_P_F[0])
        for c in _P_F[1:]:
            p = fma(p, r, const(c))
        q = builder.fadd(fma(p, builder.fmul(r, r), r), const(1.0))
        k = builder.fptosi(nf, ivec)
        half = builder.ashr(k, ir.Constant(ivec, [1] * n))
        e = builder.fmul(builder.fmul(q, pow2(half)), pow2(builder.sub(k, half)))
        top = builder.select(builder.fcmp_ordered(">=", z, const(0.0)), const(1.0), e)
        return builder.fdiv(top, builder.fadd(const(1.0), e))

    return f32x16(z), codegen


@njit(**JIT)
def vsigmoid_array(z, out):
    """out = σ(z) through the vector kernel of z's precision (z.size a multiple of
    lanes(z); for tests)."""
    for i in range(0, z.size, lanes(z)):
        vstore(out, i, vsigmoid(vload(z, i)))


def _transpose_ir(builder, rows):
    """The 8×8 transpose of 8 vectors of 8 lanes (24 shuffles): out[c][r] = rows[r][c]."""
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
def store_transposed(typingctx, dst, do, dld, v0, v1, v2, v3, v4, v5, v6, v7):
    """dst[do + c·dld + r] = v_r[c] for r < 8, c < lanes: 8 vectors stored as the columns
    of a block (register transposes of 8 x 8; float32's 16 lanes as two such halves)."""
    vs = (v0, v1, v2, v3, v4, v5, v6, v7)
    kind = _flat(dst)
    if not (kind is not None and isinstance(do, types.Integer) and isinstance(dld, types.Integer)
            and all(v == _KINDS[kind][0] for v in vs)):
        return None
    count = _KINDS[kind][2]

    def codegen(context, builder, sig, args):
        data = _data(context, builder, sig.args[0], args[0])
        do = context.cast(builder, args[1], sig.args[1], types.intp)
        dld = context.cast(builder, args[2], sig.args[2], types.intp)
        i32 = ir.IntType(32)
        columns = []
        for h in range(0, count, LANES):  # lanes h .. h + 7 of every row: columns h .. h + 7
            rows = list(args[3:])
            if count > LANES:
                rows = [builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, LANES), list(range(h, h + 8))))
                        for v in rows]
            columns += _transpose_ir(builder, rows)
        column = ir.VectorType(data.type.pointee, LANES).as_pointer()
        for c, col in enumerate(columns):
            off = builder.add(do, builder.mul(dld, ir.Constant(ir.IntType(64), c)))
            builder.store(col, builder.bitcast(builder.gep(data, [off]), column), align=kind.bitwidth // 8)
        return context.get_dummy_value()

    return types.none(dst, do, dld, *vs), codegen


# CPUs LLVM knows by name whose default features include AVX-512F
_AVX512_CPUS = ("skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
                "icelake-server", "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids",
                "graniterapids", "znver4", "znver5", "x86-64-v4", "knl", "knm")


def target_isa() -> str:
    """"avx512" if the code Numba generates may use AVX-512 registers, else "avx2".

    Numba compiles for NUMBA_CPU_NAME (default: this host) with NUMBA_CPU_FEATURES
    (default: this host's features, even when NUMBA_CPU_NAME names another CPU: on an
    AVX-512 host, NUMBA_CPU_NAME=haswell alone still emits AVX-512 code;
    NUMBA_CPU_FEATURES=-avx512f is needed as well)."""
    features = _target_features()
    if "+avx512f" in features:
        return "avx512"
    if "-avx512f" in features:
        return "avx2"
    return "avx512" if _target_cpu().lower() in _AVX512_CPUS else "avx2"


def hardware_fma(features: str | None = None, cpu: str | None = None) -> bool:
    """Whether the code Numba generates (or would for the LLVM ``features`` and ``cpu``
    given) has fused multiply-add instructions (x86's FMA3 or AMD's FMA4, AArch64's and
    POWER's own). LLVM is asked: its fma compiled for that target is one instruction, or a
    call to libm's fmaf where the target has none. False on an x86 CPU before Intel's
    Haswell and AMD's Piledriver, a low-power one without AVX, a virtual machine that shows
    a generic CPU model, or NUMBA_CPU_NAME=generic (which Numba's docs suggest for a cache
    shared by different machines): :func:`vfma` is then a multiply and an add. Named
    features alone do not say it: a CPU name brings its own unless a feature list turns
    them off (``generic`` with Numba's empty list has none; ``bdver2`` without ``fma``
    keeps ``fma4``)."""
    return _fma_is_an_instruction(_target_cpu() if cpu is None else cpu,
                                  _target_features() if features is None else features)


def host_fma() -> bool:
    """Whether this host's CPU has FMA instructions, whatever Numba is told to compile for."""
    return _fma_is_an_instruction(ll.get_host_cpu_name(), ll.get_host_cpu_features().flatten())


_FMA_PROBE = """
declare <4 x float> @llvm.fma.v4f32(<4 x float>, <4 x float>, <4 x float>)
define <4 x float> @probe(<4 x float> %a, <4 x float> %b, <4 x float> %c) {
  %r = call <4 x float> @llvm.fma.v4f32(<4 x float> %a, <4 x float> %b, <4 x float> %c)
  ret <4 x float> %r
}
"""


@functools.cache
def _fma_is_an_instruction(cpu: str, features: str) -> bool:
    """Whether LLVM compiles an fma for this CPU name and feature list without a call to
    libm (asked once a process for each: every FMA a kernel compiles asks)."""
    machine = ll.Target.from_triple(ll.get_process_triple()).create_target_machine(cpu=cpu, features=features)
    return re.search(r"\bfmaf\b", machine.emit_assembly(ll.parse_assembly(_FMA_PROBE))) is None


@functools.cache
def _target_cpu() -> str:
    """The LLVM CPU name Numba compiles for: NUMBA_CPU_NAME, else this host's (asked once,
    as :func:`_target_features`)."""
    return config.CPU_NAME or ll.get_host_cpu_name()


@functools.cache
def _target_features() -> str:
    """The LLVM features Numba compiles for: NUMBA_CPU_FEATURES, else this host's (asked
    once: every FMA a kernel compiles asks)."""
    features = config.CPU_FEATURES
    return ll.get_host_cpu_features().flatten() if features is None else features
