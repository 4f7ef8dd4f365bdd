"""Explicit 16-lane float32 vectors for Numba kernels (and their 8-lane halves), with their
intrinsics: the float32 counterparts of :mod:`.simd`'s f64x8, for :mod:`.rowprod`'s
tiles. Horizontal sums add lanes in a fixed tree, so every call gives the same bits.
"""
from __future__ import annotations

from llvmlite import ir
from llvmlite.binding import llvm_version_info
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from .simd import _flat_f32

__all__ = ["LANES32", "f32x16", "vzero32", "vload32", "vload32m", "vstore32", "vstore32m", "vbcast32", "vfma32",
           "vhsum32", "f32x8", "vzero32h", "vload32h", "vload32hm", "vhsum32h", "vhsum32x16", "vupper32"]


# ---- 16-lane float32 ---------------------------------------------------------------------------
# One AVX-512 register (two with AVX2). Same conventions as f64x8, on flat float32 arrays;
# the masked forms touch only the first n lanes' memory, for rows whose length is not a
# multiple of 16.

LANES32 = 16


class _F32x16(types.Type):
    def __init__(self):
        super().__init__(name="f32x16")


f32x16 = _F32x16()
_VEC32 = ir.VectorType(ir.FloatType(), LANES32)
_I32 = ir.IntType(32)
_IVEC32 = ir.VectorType(_I32, LANES32)


@register_model(_F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC32)


def _ptr32(context, builder, sig, args, vec=_VEC32):
    """&a[i] as a pointer to ``vec`` (<16 x float> unless told) for the (array, index,
    ...) arguments."""
    data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
    idx = context.cast(builder, args[1], sig.args[1], types.intp)
    return builder.bitcast(builder.gep(data, [idx]), vec.as_pointer())


def _lanes_below(context, builder, n, nty, lanes=LANES32):
    """<lanes x i1>: lane < n."""
    ivec = ir.VectorType(_I32, lanes)
    n32 = context.cast(builder, n, nty, types.int32)
    splat = builder.shuffle_vector(builder.insert_element(ir.Constant(ivec, ir.Undefined), n32, ir.Constant(_I32, 0)),
                                   ir.Constant(ivec, ir.Undefined), ir.Constant(ivec, [0] * lanes))
    return builder.icmp_signed("<", ir.Constant(ivec, list(range(lanes))), splat)


def _masked_load(context, builder, sig, args, vec):
    """The first n lanes of ``vec`` from a[i:], zeros in the rest; no memory past them read."""
    lanes = vec.count
    ptr = _ptr32(context, builder, sig, args, vec)
    mask = _lanes_below(context, builder, args[2], sig.args[2], lanes)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vec, [ptr.type, _I32, mask.type, vec]),
        f"llvm.masked.load.v{lanes}f32." + ("p0" if llvm_version_info >= (15,) else f"p0v{lanes}f32"))
    return builder.call(fn, [ptr, ir.Constant(_I32, 4), mask, ir.Constant(vec, [0.0] * lanes)])


@intrinsic
def vzero32(typingctx):
    """Zeros in 16 float32 lanes."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_VEC32, [0.0] * LANES32)

    return f32x16(), codegen


@intrinsic
def vload32(typingctx, a, i):
    """a[i:i + 16] of a flat float32 array (no bounds check, any alignment)."""
    if not (_flat_f32(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_ptr32(context, builder, sig, args), align=4)

    return f32x16(a, i), codegen


@intrinsic
def vload32m(typingctx, a, i, n):
    """a[i:i + n] in the first n lanes (0 < n <= 16), zeros in the rest; memory past
    a[i + n - 1] is not read."""
    if not (_flat_f32(a) and isinstance(i, types.Integer) and isinstance(n, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return _masked_load(context, builder, sig, args, _VEC32)

    return f32x16(a, i, n), codegen


@intrinsic
def vstore32(typingctx, a, i, v):
    """a[i:i + 16] = v."""
    if not (_flat_f32(a) and isinstance(i, types.Integer) and v == f32x16):
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _ptr32(context, builder, sig, args), align=4)
        return context.get_dummy_value()

    return types.none(a, i, v), codegen


@intrinsic
def vstore32m(typingctx, a, i, v, n):
    """a[i:i + n] = the first n lanes of v (0 < n <= 16); nothing past them is written."""
    if not (_flat_f32(a) and isinstance(i, types.Integer) and v == f32x16 and isinstance(n, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr32(context, builder, sig, args)
        mask = _lanes_below(context, builder, args[3], sig.args[3])
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_VEC32, ptr.type, _I32, mask.type]),
            "llvm.masked.store.v16f32." + ("p0" if llvm_version_info >= (15,) else "p0v16f32"))
        builder.call(fn, [args[2], ptr, ir.Constant(_I32, 4), mask])
        return context.get_dummy_value()

    return types.none(a, i, v, n), codegen


@intrinsic
def vbcast32(typingctx, a, i):
    """a[i] in every lane."""
    if not (_flat_f32(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
        x = builder.load(builder.gep(data, [context.cast(builder, args[1], sig.args[1], types.intp)]))
        v = builder.insert_element(ir.Constant(_VEC32, ir.Undefined), x, ir.Constant(_I32, 0))
        return builder.shuffle_vector(v, ir.Constant(_VEC32, ir.Undefined), ir.Constant(_IVEC32, [0] * LANES32))

    return f32x16(a, i), codegen


@intrinsic
def vfma32(typingctx, a, b, c):
    """a * b + c, rounded once per lane (16 lanes, or 8: :data:`f32x8`)."""
    if not (a == b == c and a in (f32x16, f32x8)):
        return None
    vec = _VEC32 if a == f32x16 else _VEC32H

    def codegen(context, builder, sig, args):
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3),
                                             f"llvm.fma.v{vec.count}f32")
        return builder.call(fma, args)

    return a(a, b, c), codegen


def _tree_sum(builder, s):
    """The lanes of s added as a fixed tree: lane i + lane i + n/2, and so on down to one."""
    width = s.type.count
    while width > 1:
        width //= 2
        lo = builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(_I32, width), list(range(width))))
        hi = builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(_I32, width), list(range(width, 2 * width))))
        s = builder.fadd(lo, hi)
    return builder.extract_element(s, ir.Constant(_I32, 0))


@intrinsic
def vhsum32(typingctx, v):
    """The 16 lanes added as a fixed tree: lane i + lane i+8, then i + i+4 of those, i +
    i+2, i + i+1 (the same result every call; 4 shuffles and 4 adds, where a chain
    lane by lane takes 15 dependent adds, a large part of rows_times_t's time)."""
    if v != f32x16:
        return None

    def codegen(context, builder, sig, args):
        return _tree_sum(builder, args[0])

    return types.float32(v), codegen


# bit-reversed lane order: the network below leaves input m's sum in lane _BITREV[m]
_BITREV = [int(f"{m:04b}"[::-1], 2) for m in range(LANES32)]


def _sums16_ir(builder, vs):
    """The transposed form of :func:`_tree_sum` for 16 vectors at once. At each level a
    vector holds the partial sums of 16 / width inputs, ``width`` lanes each; a pair of
    vectors becomes one by two shuffles (the first and the second half of every input's
    lanes, the pair's inputs alternating) and one add: lane i + lane i + width / 2 of each
    input, the additions of :func:`_tree_sum`. 45 instructions for 16 sums instead of 128.
    Returns one vector whose lane k is the tree sum of vs[k]."""
    ws = [vs[_BITREV[m]] for m in range(LANES32)]  # fed in bit-reversed order, out in order
    width = LANES32
    while len(ws) > 1:
        lo, hi = [], []
        for g in range(LANES32 // width):
            for src in (0, LANES32):  # the pair's first vector, then its second
                lo += [src + g * width + j for j in range(width // 2)]
                hi += [src + g * width + width // 2 + j for j in range(width // 2)]
        ws = [builder.fadd(builder.shuffle_vector(a, b, ir.Constant(_IVEC32, lo)),
                           builder.shuffle_vector(a, b, ir.Constant(_IVEC32, hi)))
              for a, b in zip(ws[0::2], ws[1::2])]
        width //= 2
    return ws[0]


@intrinsic
def vhsum32x16(typingctx, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15):
    """Lane k = :func:`vhsum32` of v_k, bit for bit (the same additions of the same lanes),
    for 16 vectors at once."""
    if not all(v == f32x16 for v in (v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15)):
        return None

    def codegen(context, builder, sig, args):
        return _sums16_ir(builder, list(args))

    return f32x16(*([f32x16] * LANES32)), codegen


@intrinsic
def vupper32(typingctx, v):
    """Lanes 8-15 of v in lanes 0-7 (and again in 8-15)."""
    if v != f32x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[0], ir.Constant(_IVEC32, list(range(8, 16)) * 2))

    return f32x16(v), codegen


# ---- 8-lane float32: the halves of a 16-lane vector -------------------------------------------
# One AVX2 register. A kernel that holds a 16-lane sum as its two halves (lanes 0-7 and
# 8-15) can order its loads half by half, which LLVM does not do for a 16-lane vector it
# splits itself: rows_times_t's tiles larger than 2 x 2 spilled as 16-lane code, while as
# halves its 2 x 3 tiles run faster than the 2 x 2 ones, with the same sums
# (:func:`vhsum32h`).

LANES32H = 8


class _F32x8(types.Type):
    def __init__(self):
        super().__init__(name="f32x8")


f32x8 = _F32x8()
_VEC32H = ir.VectorType(ir.FloatType(), LANES32H)


@register_model(_F32x8)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC32H)


@intrinsic
def vzero32h(typingctx):
    """Zeros in 8 float32 lanes."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_VEC32H, [0.0] * LANES32H)

    return f32x8(), codegen


@intrinsic
def vload32h(typingctx, a, i):
    """a[i:i + 8] of a flat float32 array (no bounds check, any alignment)."""
    if not (_flat_f32(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_ptr32(context, builder, sig, args, _VEC32H), align=4)

    return f32x8(a, i), codegen


@intrinsic
def vload32hm(typingctx, a, i, n):
    """a[i:i + n] in the lanes below n (all 8 when n >= 8, none when n <= 0), zeros in
    the rest; memory past a[i + n - 1] is not read."""
    if not (_flat_f32(a) and isinstance(i, types.Integer) and isinstance(n, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return _masked_load(context, builder, sig, args, _VEC32H)

    return f32x8(a, i, n), codegen


@intrinsic
def vhsum32h(typingctx, lo, hi):
    """:func:`vhsum32` of the 16-lane vector whose halves are lo and hi (the same tree:
    its first step is lo + hi)."""
    if not (lo == hi == f32x8):
        return None

    def codegen(context, builder, sig, args):
        return _tree_sum(builder, builder.fadd(args[0], args[1]))

    return types.float32(lo, hi), codegen
