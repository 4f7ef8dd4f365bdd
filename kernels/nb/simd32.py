"""Float32 loads and stores for :mod:`.rowprod`'s tiles beyond :mod:`.simd`'s: from an
address (an int64), masked to the first n lanes, and the 16 x 16 transpose that copies W's
rows into a panel of W.T for them. The f32x16 type and its arithmetic are :mod:`.simd`'s.
"""
from __future__ import annotations

from llvmlite import ir
from llvmlite.binding import llvm_version_info
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .simd import _VEC32, _flat_f32, f32x16, target_isa, vadd, vfma

__all__ = ["LANES32", "f32x16", "address32", "vzero32", "vload32", "vload32m", "vstore32", "vstore32m", "vbcast32",
           "vfma32", "vadd32", "vtranspose32"]


# ---- 16-lane float32 ---------------------------------------------------------------------------
# The masked forms touch only the first n lanes' memory, for rows whose length is not a
# multiple of 16.

LANES32 = 16
_I32 = ir.IntType(32)
_IVEC32 = ir.VectorType(_I32, LANES32)
# a + b: an LLVM fadd without fast-math flags, so no contraction can fuse it with a
# product (the same bits as vfma32(a, 1, b)); on CPUs with separate add pipes (AMD Zen)
# it leaves the FMA pipes to the products
vfma32, vadd32 = vfma, vadd


def _source32(a):
    """What the loads read from: a flat float32 array, or the address of a float32 (an
    int64: the parts of one call, which a tuple of arrays would reference-count each time
    one is taken from it)."""
    return _flat_f32(a) or a == types.int64


def _ptr32(context, builder, sig, args):
    """&a[i] as a <16 x float> pointer for the (array or address, index, ...) arguments."""
    if isinstance(sig.args[0], types.Integer):
        data = builder.inttoptr(args[0], ir.FloatType().as_pointer())
    else:
        data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
    idx = context.cast(builder, args[1], sig.args[1], types.intp)
    return builder.bitcast(builder.gep(data, [idx]), _VEC32.as_pointer())


def _lanes_below(context, builder, n, nty):
    """<16 x i1>: lane < n."""
    n32 = context.cast(builder, n, nty, types.int32)
    first = builder.insert_element(ir.Constant(_IVEC32, ir.Undefined), n32, ir.Constant(_I32, 0))
    splat = builder.shuffle_vector(first, ir.Constant(_IVEC32, ir.Undefined), ir.Constant(_IVEC32, [0] * LANES32))
    return builder.icmp_signed("<", ir.Constant(_IVEC32, list(range(LANES32))), splat)


@intrinsic
def address32(typingctx, a):
    """The address of a float32 array's first element (any layout), as an int64: what
    :func:`vload32` reads from where it is given an address."""
    if not (isinstance(a, types.Array) and a.dtype == types.float32):
        return None

    def codegen(context, builder, sig, args):
        return builder.ptrtoint(context.make_array(sig.args[0])(context, builder, value=args[0]).data, ir.IntType(64))

    return types.int64(a), codegen


@intrinsic
def vzero32(typingctx):
    """Zeros in 16 float32 lanes."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_VEC32, [0.0] * LANES32)

    return f32x16(), codegen


@intrinsic
def vload32(typingctx, a, i):
    """a[i:i + 16] of a flat float32 array, or of the floats from address a (no bounds
    check, any alignment)."""
    if not (_source32(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_ptr32(context, builder, sig, args), align=4)

    return f32x16(a, i), codegen


@intrinsic
def vload32m(typingctx, a, i, n):
    """a[i:i + n] in the first n lanes (0 < n <= 16), zeros in the rest; memory past
    a[i + n - 1] is not read. ``a`` as :func:`vload32`'s."""
    if not (_source32(a) and isinstance(i, types.Integer) and isinstance(n, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr32(context, builder, sig, args)
        mask = _lanes_below(context, builder, args[2], sig.args[2])
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VEC32, [ptr.type, _I32, mask.type, _VEC32]),
            "llvm.masked.load.v16f32." + ("p0" if llvm_version_info >= (15,) else "p0v16f32"))
        return builder.call(fn, [ptr, ir.Constant(_I32, 4), mask, ir.Constant(_VEC32, [0.0] * LANES32)])

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


def _transpose_ir(builder, rows, first=None):
    """The n x n transpose of n vectors of n lanes (n a power of two): log2(n) stages of
    two-vector shuffles, stage b swapping bit b of the row index with bit b of the lane
    index (the stages commute; together they swap all the bits). ``first``: the stages
    from b = first down, those above it done already."""
    rows, n = list(rows), len(rows)
    ivec = ir.VectorType(_I32, n)
    b = n // 2 if first is None else first
    while b:
        lo = [j if not j & b else n + j - b for j in range(n)]
        hi = [j + b if not j & b else n + j for j in range(n)]
        for i in range(n):
            if not i & b:
                x, y = rows[i], rows[i + b]
                rows[i] = builder.shuffle_vector(x, y, ir.Constant(ivec, lo))
                rows[i + b] = builder.shuffle_vector(x, y, ir.Constant(ivec, hi))
        b //= 2
    return rows


# vtranspose32's blocks: the whole 16 x 16 where 16 lanes are one register (AVX-512), else
# its four 8 x 8 quarters, each in the 8 registers of its rows: the 16 x 16 at once held
# 32 AVX2 registers of rows in 16, and the spills made it about a third as fast (AMD Zen 3)
_QUARTER = LANES32 if target_isa() == "avx512" else LANES32 // 2


@intrinsic
def vtranspose32(typingctx, dst, d, ldd, src, s, lds):
    """dst[d + j * ldd + i] = src[s + i * lds + j] for i, j < 16: a 16 x 16 block of
    float32 copied transposed, as 16 x 16 (AVX-512) or four 8 x 8 blocks of vector loads,
    shuffles and stores (flat arrays, no bounds check, any alignment)."""
    if not (_flat_f32(dst) and _flat_f32(src) and all(isinstance(t, types.Integer) for t in (d, ldd, s, lds))):
        return None

    def codegen(context, builder, sig, args):
        q = _QUARTER
        vec = ir.VectorType(ir.FloatType(), q).as_pointer()

        def ptr(k, base, step, r, c):  # &array_k[base + r * step + c] as <q x float>*
            data = context.make_array(sig.args[k])(context, builder, value=args[k]).data
            intp = context.get_value_type(types.intp)
            at = builder.add(context.cast(builder, base, sig.args[k + 1], types.intp),
                             builder.add(builder.mul(context.cast(builder, step, sig.args[k + 2], types.intp),
                                                     ir.Constant(intp, r)), ir.Constant(intp, c)))
            return builder.bitcast(builder.gep(data, [at]), vec)

        half = ir.VectorType(ir.FloatType(), 4).as_pointer()

        def halves(i, j):  # [src row i, columns j..j+4; row i + 4, the same]: stage 4 done by the loads
            pair = [builder.load(builder.bitcast(ptr(3, args[4], args[5], i + e, j), half), align=4) for e in (0, 4)]
            return builder.shuffle_vector(*pair, ir.Constant(ir.VectorType(_I32, 8), list(range(8))))
        for i0 in range(0, LANES32, q):  # src's rows i0.., columns j0.. -> dst's rows j0.., columns i0..
            for j0 in range(0, LANES32, q):
                if q == 8:
                    rows = [halves(i0 + r % 4, j0 + r // 4 * 4) for r in range(q)]
                    rows = _transpose_ir(builder, rows, first=2)
                else:
                    rows = _transpose_ir(builder, [builder.load(ptr(3, args[4], args[5], i0 + r, j0), align=4)
                                                   for r in range(q)])
                for r, v in enumerate(rows):
                    builder.store(v, ptr(0, args[1], args[2], j0 + r, i0), align=4)
        return context.get_dummy_value()

    return types.none(dst, d, ldd, src, s, lds), codegen
