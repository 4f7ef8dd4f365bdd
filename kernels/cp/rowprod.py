"""Products with a fixed order of sums on the GPU (CuPy): the RawKernels of the sibling
``rowprod.cu``, the counterparts of :mod:`kernels.nb.rowprod` with the same sums in the same
order (the same bits as the CPU's row kernels, where both are correctly rounded FMAs).

:func:`rows_times` and :func:`rows_times_t` give each row of a product the bits it has
alone, whatever rows share the launch, so that the blocks of a batch could go through
one launch where cuBLAS takes a call per block; :func:`block_outer_sum` is the
blocks' weight gradient and their fixed tree in one launch, where cuBLAS takes a call, a
scaling and an addition per block.

The set's block paths (``block_outer_sum``, ``rbm_cd_factors_blocks``, the dense layer's
blocks) take these kernels for a block of at most :data:`MAX_ROWS` rows, decided block by
block from its own rows so that a block has the same bits whatever blocks share its call,
and so on any number of ranks; larger blocks keep cuBLAS. At batch 100 a step of 8 blocks
through cuBLAS made over a hundred host calls (``python -m bench.gpu_launches``), each
costing the host more than its product costs the GPU. Their bits
and the emulated GPU (tests/unit/test_kernels_cp_rowprod.py) say these kernels compute
what they should; their speed against cuBLAS on a GPU is what ``python -m bench.row_bits
--device gpu`` (bench.gpu_node's ``bits`` step) measures, and :data:`MAX_ROWS` is set
from it.
"""
import functools
import os
import re

import cupy as cp
import numpy as np

from ..ref.blocksum import as_parts, check_block_outer_sum, postfix_tree

__all__ = []  # helpers of the set's block paths, not kernels of their own

# a block of at most this many rows takes these kernels: its chains' products
# (rbm_cd_factors_blocks, the dense blocks), and its factors' product, which stacks two of
# its chains (the RBM's [vk; v0]: 2 * MAX_ROWS rows, block_outer_sum). Set from
# bench.row_bits --device gpu on an H200 (bench/results/gpu/row_bits.csv, 2026-12-04): 8
# blocks of 125 rows in one launch took 22-184 us a product against 166-186 us for cuBLAS
# a call per block, and their factors' sum 283-342 us against 439-469 us; at 625 rows a
# block cuBLAS was faster (282 against 575 us for the 784x1000 product). As epochs (gpu_epoch.csv,
# 0.8.28): 8 blocks of 125 rows 2.5-2.6x one block's time, where cuBLAS a call per block took 8.7-9.4x
MAX_ROWS = 128

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rowprod.cu")) as _f:
    _CODE = _f.read()
_MODULE = cp.RawModule(code=_CODE, options=("-std=c++14", "--fmad=false"))
# the stack's depth as rowprod.cu defines it; its threads index a block as 16 x 16
_DEFINED = {name: int(value) for name, value in re.findall(r"#define (RP_\w+) (\d+)", _CODE)}
_MAX_DEPTH, _THREADS = _DEFINED["RP_MAX_DEPTH"], (16, 16)
_MAX_GRID_Z = 65535  # CUDA's bound on a grid's z extent: a longer stack takes several launches
# each kernel's instances in rowprod.cu: name suffix -> its tiles' side (16 x the elements
# a thread takes along each axis). The mid tiles are timed beside the others by
# bench.row_bits --device gpu, every instance's bits checked, but tiles_for does not pick
# them before a GPU has timed them
TILES = {"": 64, "_mid": 32, "_thin": 16}


@functools.cache
def _multiprocessors() -> int:
    return int(cp.cuda.Device().attributes["MultiProcessorCount"])


def tiles_for(M: int, N: int, stack: int = 1) -> str:
    """The instance (a suffix of :data:`TILES`) for ``stack`` M x N results: the wide tiles
    where they give at least two thirds of the multiprocessors a block, else the thin ones
    (a batch of 100 rows, or a narrow layer's gradient, makes a few wide tiles: most of the
    GPU idle while each block runs its whole chain of chunks). Either gives the same bits."""
    wide = TILES[""]
    # two thirds, not all: on an H200 (132 multiprocessors; bench/results/gpu/row_bits.csv,
    # 2026-12-04) the wide tiles were faster at every shape making 104 or 128 of them (e.g.
    # 103 against 175 us for 512 rows through 784x1000, 62 against 102 us for a 1000x500
    # gradient) and the thin ones at 79 and below, or within a tenth at 64
    return "" if 3 * -(-M // wide) * -(-N // wide) * stack >= 2 * _multiprocessors() else "_thin"


def _grid(M, N, tiles):
    side = TILES[tiles]
    return (-(-N // side), -(-M // side))


@functools.lru_cache(maxsize=64)
def on_device(values: tuple, dtype):
    """A small host array's device copy, kept: a step's blocks, tree and scales are the same
    call after call, and a copy to the device is host time in every launch."""
    return cp.asarray(np.asarray(values, dtype))


def _float32s(*arrays):
    for a in arrays:
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            raise TypeError(f"rowprod takes C-contiguous float32 arrays, got {a.dtype} "
                            f"{'C' if a.flags.c_contiguous else 'strided'}")


def _rows_of(A):
    """(A, its row stride in elements): A as it is where its rows are runs of float32
    (a band of a factor's columns, as the trainer's bands are), else a C-ordered copy
    (a row's sums are the same in either)."""
    if A.dtype == np.float32 and A.ndim == 2 and (A.shape[1] <= 1 or A.strides[1] == 4) and A.strides[0] % 4 == 0 \
            and A.strides[0] >= 0:
        return A, max(A.strides[0] // 4, A.shape[1])
    return cp.ascontiguousarray(A, dtype=np.float32), A.shape[1]


def rows_times(a, W, out=None, tiles=None):
    """out = a @ W for float32 a (M, K), W (K, N): every out[m, n] the FMA chain over k in
    order, whatever the other rows of ``a``. Either operand may be a view (a transposed or
    a band of a wider array), and all three may be stacks (Z, ...) of as many products,
    each its own chains, in one launch. ``tiles``: an instance of :data:`TILES` (default
    :func:`tiles_for` the result). Returns out (a new C-ordered array if None)."""
    return _rows(a, W, out, False, tiles)


def rows_times_t(h, W, out=None, tiles=None):
    """out = h @ W.T for float32 h (M, K), W (N, K), in the same order (and as
    :func:`rows_times`, stacks and views too). Returns out."""
    return _rows(h, W, out, True, tiles)


def _rows(a, W, out, transposed, tiles):
    shape, name, grid, Z, (sa, sw, so) = _plan((a.dtype, a.shape, a.strides), (W.dtype, W.shape, W.strides),
                                               None if out is None else (out.dtype, out.shape, out.strides),
                                               transposed, tiles)
    out = cp.empty(shape, np.float32) if out is None else out
    if name is None:  # nothing to compute
        return out
    kernel = _MODULE.get_function(name)
    if Z is None:
        kernel(grid, _THREADS, (a, *sa, W, *sw, out, *so))
    for z0 in range(0, Z or 0, _MAX_GRID_Z):  # a grid's z extent is at most 65535
        at = slice(z0, min(Z, z0 + _MAX_GRID_Z))
        kernel(grid + (at.stop - z0,), _THREADS, (a[at], *sa, W[at], *sw, out[at], *so))
    return out


@functools.lru_cache(maxsize=256)
def _plan(a, W, out, transposed, tiles):
    """(out's shape, the kernel's name or None, its grid, the stack's depth or None, the
    launch's integer arguments) of a product of operands laid out as ``a`` and ``W``
    (dtype, shape, strides) into ``out`` (the same, or None: a new C-ordered array). Kept
    per layout: a step makes the same products every time, and the checks and NumPy
    integers of a launch are host time that a GPU step waits for."""
    (M, K), Z = a[1][-2:], (a[1][0] if len(a[1]) == 3 else None)
    N, K2 = (W[1][-2:] if transposed else W[1][-1:-3:-1])
    if K2 != K or (len(W[1]) == 3) != (Z is not None) or (Z is not None and W[1][0] != Z):
        raise ValueError(f"rowprod: shapes {a[1]} and {W[1]} do not chain")
    shape = (M, N) if Z is None else (Z, M, N)
    out = out or (np.dtype(np.float32), shape, tuple(4 * int(np.prod(shape[i + 1:])) for i in range(len(shape))))
    if out[1] != shape:
        raise ValueError(f"rowprod: out {out[1]} is not {shape}")
    (za, am, ak), (zw, wr, wc), (zo, ldo, one) = (_steps(*x) for x in (a + ("a",), W + ("W",), out + ("out",)))
    if one != 1 and N > 1 and M * N * (1 if Z is None else Z):  # (an empty or one-column array's strides say nothing)
        raise TypeError(f"rowprod: out's rows must be runs of floats, got strides {out[2]}")
    if not (M and N and Z != 0):
        return shape, None, None, None, ((), (), ())
    tiles = tiles_for(M, N, Z or 1) if tiles is None else tiles
    sbk, sbn = (wc, wr) if transposed else (wr, wc)
    ints = (tuple(np.array([za, am, ak], np.int64)), tuple(np.array([zw, sbk, sbn], np.int64)),
            tuple(np.array([zo, ldo], np.int64)) + tuple(np.array([M, N, K], np.int32)))
    return shape, f"rows_times{tiles}_f32", _grid(M, N, tiles), Z, ints


def _steps(dtype, shape, strides, what):
    """An operand's strides in elements, (stack, rows, columns), of a matrix or a stack of
    them (a view as it is: the kernels read any layout whose strides are whole floats)."""
    if dtype != np.float32 or len(strides) not in (2, 3) or any(st % 4 or st < 0 for st in strides):
        raise TypeError(f"rowprod takes float32 matrices or stacks of them with whole-float strides, got "
                        f"{what} {dtype} {shape} strides {strides}")
    return ((0,) if len(strides) == 2 else ()) + tuple(st // 4 for st in strides)


def block_outer_sum(A, D, starts, merges, alphas, out, tiles=None):
    """out = the fixed tree (``merges``, postfix) over blocks b of alphas[b] * A_b.T @ D_b,
    A_b and D_b the rows starts[b]..starts[b + 1] of float32 A (R, M) and D (R, N), in one
    launch: each block's sums an FMA chain over its rows in order, as
    :func:`kernels.nb.rowprod.block_outer_sum`'s. A and D may be tuples of two parts (a
    tied autoencoder's): a block's chain runs over its rows of the first, then of the
    second, as over the parts interleaved (:func:`kernels.ref.blocksum.interleaved`).
    ``tiles``: as :func:`rows_times`'. Returns out."""
    starts, merges = check_block_outer_sum(A, D, starts, merges, alphas, out)
    _float32s(out)
    _outer_sum_launch("block_outer_sum", A, D, starts, merges, alphas, (out,), out.shape, (), tiles)
    return out


def block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay=0.0, tiles=None):
    """SGD with momentum on float32 ``p`` and ``v`` (C-contiguous, the shape of the sum)
    with the gradient :func:`block_outer_sum` (A, D, ...), in one launch: each element
    stepped where its sum ends, as ``kernels.cp.update.sgd_momentum_update`` would step
    it (the same bits; the gradient is never written out). ``tiles``: as
    :func:`rows_times`'. Returns None."""
    starts, merges = check_block_outer_sum(A, D, starts, merges, alphas, p)
    _float32s(p, v)
    if v.shape != p.shape:
        raise ValueError(f"rowprod.block_outer_sum_sgd: v {v.shape} does not match p {p.shape}")
    _outer_sum_launch("block_outer_sum_sgd", A, D, starts, merges, alphas, (p, v), p.shape,
                      (np.float32(lr), np.float32(momentum), np.float32(weight_decay)), tiles)


def _outer_sum_launch(name, A, D, starts, merges, alphas, outs, shape, after, tiles):
    """One launch of rowprod.cu's ``name`` (its instance ``tiles``, by default
    :func:`tiles_for` the shape) over the blocks: its factors' arguments, then ``outs``,
    their row stride and shape, then ``after``."""
    a_parts, d_parts = as_parts(A), as_parts(D)
    if len(a_parts) > 2:
        raise TypeError(f"rowprod.{name} takes at most two parts of A and D, not {len(a_parts)}")
    if any(a.dtype != np.float32 for a in a_parts):
        raise TypeError(f"rowprod takes float32 arrays, got {a_parts[0].dtype}")
    a_parts = [_rows_of(a) for a in a_parts]
    d_parts = [d if d.flags.c_contiguous else cp.ascontiguousarray(d) for d in d_parts]
    _float32s(*d_parts)
    if postfix_tree(merges).depth > _MAX_DEPTH:
        raise ValueError(f"rowprod.{name}: a tree deeper than {_MAX_DEPTH}")
    (A, lda), D = a_parts[0], d_parts[0]
    (A2, lda2), D2 = a_parts[-1], d_parts[-1]
    M, N = shape
    if M and N:
        tiles = tiles_for(M, N) if tiles is None else tiles
        _MODULE.get_function(f"{name}{tiles}_f32")(
            _grid(M, N, tiles), _THREADS, (A, np.int64(lda), D, np.int64(N), A2, np.int64(lda2), D2, np.int64(N),
                                           np.int32(len(d_parts)), on_device(tuple(starts), np.int64),
                                           on_device(tuple(merges), np.int64), np.int32(len(merges)),
                                           on_device(tuple(map(float, alphas)), np.float32), *outs, np.int64(N),
                                           np.int32(M), np.int32(N), *after))
