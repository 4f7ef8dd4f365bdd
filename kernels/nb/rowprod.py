"""out = v @ W in float32 with each row's sums in a fixed order: the products of a block
of 12-13 rows (aepar.rows' eight blocks of a batch of 100) faster than OpenBLAS.

OpenBLAS runs such thin products far below its rate on the whole batch, and the eight
blocks per batch that make results bit-identical on 1-8 ranks made the CD-1 and
fine-tuning epochs much slower than PyTorch's. Here every out[r, j] is
fma(v[r, K-1], W[K-1, j], ... fma(v[r, 0], W[0, j], 0)), in that order, whatever the
number of rows in the call or the row's place in it (on a CPU without FMA each fma a
multiply, then an add: :func:`.simd.hardware_fma`), and W streams through the register
tiles once per tile of rows, without OpenBLAS's packing. The tiles hold RT rows x CT
vectors of 16 columns in registers (named variables, as in :mod:`.sparse_tiles`); the
last vector of a row is masked, so no memory past a row's end is read or written.

==========  ==========================  =======  ======
ISA         tile                        AVX-512  AVX2
==========  ==========================  =======  ======
RT x CT     rows x 16-column vectors    6 x 4    6 x 1
==========  ==========================  =======  ======

:func:`rows_times_t` (h @ W.T) takes the same tiles over W.T, a column panel at a time
copied transposed out of W's rows (16 x 16 blocks in registers): every out[r, i] is the
FMA chain over row r of h and row i of W in order, as v @ W's. Dot products of h's and
W's rows, 16 lanes each added in a tree at the end, ran slower on AVX2 (its 16 registers
held a 2 x 3 tile of 16-lane sums only as 8-lane halves) and at 50 or more rows on AVX-512.

For a block's rows these tiles beat OpenBLAS; how far up depends on the code path:
:data:`MAX_ROWS` picks.

:func:`block_outer_sum` is the weight gradient of those blocks: Σ_b alpha_b A_b.T @ D_b
added in the fixed tree, one call per tree node. Each block's FMA chain runs over its
own rows in a register tile (OR x OC: 8 x 3 on AVX-512, 6 x 1 on AVX2; OR - 1 and single
rows where M is not a fit), the tree's
additions against a small stack in cache, so the blocks' gradients are never written
out (written out, eight blocks' 784 x 1000 gradients are 8 zeroed 3 MB vectors, 8 GEMMs
of K = 26 and 7 NumPy additions per step). Each column panel of D is copied into a
contiguous buffer before the row tiles pass over it: read in place, each row of a
tile's panel lies on another page (docs/performance-notes.md has the figures). It runs
close to OpenBLAS's one K = 208 product over all the blocks, which would give other bits
on other ranks.

Blocks longer than :data:`LONG_ROWS` (batch 5000: 8 blocks of 1250 rows of [v0; vk]) go
a stretch of :data:`SEGMENT_ROWS` rows at a time, every tile taking the stretch before the
next one, the tiles' unfinished sums waiting on their stacks: the same bits, but D's
panel no longer comes from L3 for every tile. Each stretch's rows of A are copied transposed, and of D padded, into
small buffers that stay in cache (instead of whole copies of A.T and of D padded; A's
through 16 x 16 register transposes), and a run of tiles of one row count is one call.
Each of these made long blocks faster, the copies included (whole blocks ran far
slower); OpenBLAS's one product over all the blocks, with other bits, runs about as fast
with AVX-512 and somewhat faster with AVX2.

:func:`block_outer_sum_sgd` is that sum with the SGD step of :mod:`.update` in each tile's
epilogue: where a tile's sums reach the tree's root they step its elements of the
weights and velocity in registers, so the gradient is never written out and the step is
not a second pass over memory the size of the weights. The same bits as the sum, then
the step.
"""
from __future__ import annotations

import sys
import threading

import numpy as np
from numba import literal_unroll, njit

from ..memory import empty
from ..ref.blocksum import block_outer_sum as _ref_block_outer_sum
from ..ref.blocksum import (as_parts, blocks_sgd_step_via, chain_rows, check_bias_rows, check_block_outer_sum,
                            check_rows_tree, interleaved, postfix_tree)
from .codegen import define
# the generated tiles (_define) call these by name
from .simd import JIT, prefetch, prefetch_l2, target_isa  # noqa: F401
from .update import sgd_momentum_update
from .simd32 import (LANES32, address32, vadd32, vbcast32, vfma32, vload32, vload32m, vstore32, vstore32m,  # noqa: F401
                     vtranspose32, vzero32)

__all__ = ["rows_times", "rows_times_t", "w_panels", "wt_panel", "thin", "MAX_ROWS", "block_outer_sum",
           "block_outer_sum_sgd", "rows_tree_sum", "blocks_sgd_step"]

# OR x OC: block_outer_sum's tiles (8 x 3 and 6 x 1: the fastest of the 4-8 shapes timed
# for each ISA, on 1-block and 8-block sums of the stack's eight weight shapes). The figures
# behind these choices: docs/performance-notes.md.
TILE_SHAPES = {"avx512": dict(RT=6, CT=4, OR=8, OC=3), "avx2": dict(RT=6, CT=1, OR=6, OC=1)}
RT, CT, OR, OC = (TILE_SHAPES[target_isa()][k] for k in ("RT", "CT", "OR", "OC"))
# products with at most this many rows a block go through these kernels, larger ones
# through BLAS (a choice made from the shapes alone: a block's rows get the same kernel on
# any rank). On the AVX2 path the tiles beat OpenBLAS up to 128 rows, the GPU set's bound
# (kernels.cp.rowprod.MAX_ROWS): a block of 33-128 rows (8 blocks of a batch of 264-1024)
# then has the GPU's products, not OpenBLAS's (whose bits depend on its kernels). The
# AVX-512 tiles past 32 rows are yet to be timed against OpenBLAS (bench.row_bits' rows
# "cpu rows_times" on such a CPU)
MAX_ROWS = {"avx512": 32, "avx2": 128}[target_isa()]
# rows_times' tiles ask for W's lines this many rows ahead: each row of a tile's panel is
# a few lines 4 kB from the last (a new page each), which the hardware prefetchers did
# not keep up with on the AVX2 path (the AVX-512 tiles ran the same either way;
# block_outer_sum's D panel sits in L2 and gained nothing)
PREFETCH_ROWS = 16
# W's rows a multiple of ALIAS_BYTES apart put a column panel's lines into a few cache sets
# of L1 and L2, which then hold few of them: every row tile read the panel from L3 (784 x
# 1024 on the AVX2 path: half BLAS's rate). rows_times copies such a panel into a
# contiguous buffer first, on every path: the AVX-512 tiles ran at their usual rate in
# place on AMD Zen 4, but at 36 GFLOP/s on an Intel Xeon (family 6 model 167), 129 copied.
ALIAS_BYTES = 2048
# the AVX2 path's rows_times copies every column panel of W first when a call has at least
# this many rows (several blocks stacked, e.g. a step's eight on one thread): each panel
# row then lies next to the last, not a row of W (4 kB) away, and the copy is paid once
# for all the row tiles. A block of 13 rows ran up to 24% slower copied, and the AVX-512
# tiles gained at 100 rows on some shapes and lost on others, so they read W in place
# (an Intel Xeon, family 6 model 106: docs/performance-notes.md).
COPY_ROWS = {"avx512": None, "avx2": 24}[target_isa()]
# block_outer_sum's stretches of long blocks copy D's rows into a buffer one vector wider
# where they would alias, on the AVX2 path only (batch 5000's stretches: 0.74 -> 0.84 of
# OpenBLAS there; the AVX-512 tiles gained nothing on either CPU)
PAD_ALIASED = target_isa() == "avx2"
# rows_times copies this many column panels of W in one pass over its rows, each row then
# a run of lines (256 B on the AVX2 path, 512 B on AVX-512) rather than one panel's: on
# the AVX2 path the copy of one 64-byte panel at a time, a line from every row of W, had
# taken 10-20% of a 100-row product (the tiles alone ran faster than OpenBLAS). Four or
# eight AVX2 panels ran alike, all of W at once slower (it left L2); on AVX-512 the
# aliased shapes it copies gained 4-7% with two.
COPY_PANELS = {"avx512": 2, "avx2": 4}[target_isa()]
_NO_PANEL = np.empty(0, np.float32)  # rows_times reads W in place
# w_panels keeps all of a W's column panels for a second product up to this size of W (the
# room stays with each thread that used it; the stack's largest W, 784 x 1000, is 3 MB)
KEEP_PANELS_BYTES = 16 << 20
SLOT = OR * OC * LANES32  # floats of one partial sum of a block_outer_sum tile on its stack
# block_outer_sum takes blocks longer than LONG_ROWS in stretches of SEGMENT_ROWS rows (see
# _segment_source; stretches of 64, 128, 256 and 512 ran within the noise of each other at
# batch 5000). A whole block's tiles read D's column panel, OC vectors a row, from L1 while
# it fits there: on the AVX2 path (one 32-byte vector a row) they ran 8-25% faster than the
# stretches up to 384 rows, alike at 512 and slower from 640 (AMD EPYC Zen 3; the AVX-512
# panel, three 64-byte vectors a row, was not timed against them past 128)
SEGMENT_ROWS = 128
LONG_ROWS = {"avx512": SEGMENT_ROWS, "avx2": 512}[target_isa()]
# the stretches ask for the stack slots of the tile this many tiles ahead (12 MB of slots
# at batch 5000 sit in L3; a small gain, within the noise)
PREFETCH_TILES = 2


def _fma_lines(rows, vecs, pad, masked=False, vstep="ldv", width="nlast"):
    """One step k of a rows x vecs tile: the vectors of w's row at ``wb`` (the last one
    masked to ``width`` columns if ``masked``), each times v at ``vb + r * vstep`` added
    into a{r}_{c}."""
    last = vecs - 1
    whole = last if masked else vecs  # the vectors loaded whole
    src = [f"{pad}w{c} = vload32(w, wb + {LANES32 * c})" for c in range(whole)]
    if masked:
        src += [f"{pad}w{last} = vload32m(w, wb + {LANES32 * last}, {width})"]
    for r in range(rows):
        src += [f"{pad}x = vbcast32(v, vb + {r} * {vstep})"]
        src += [f"{pad}a{r}_{c} = vfma32(x, w{c}, a{r}_{c})" for c in range(vecs)]
    return src


def _store_lines(rows, vecs, pad="    "):
    """The tile's a{r}_{c} into o at ``oo`` (rows ``ldo`` apart), the last vector masked."""
    last, src = vecs - 1, []
    for r in range(rows):
        src += [f"{pad}vstore32(o, oo + {r} * ldo + {LANES32 * c}, a{r}_{c})" for c in range(last)]
        src += [f"{pad}if nlast == {LANES32}:",
                f"{pad}    vstore32(o, oo + {r} * ldo + {LANES32 * last}, a{r}_{last})",
                f"{pad}else:",
                f"{pad}    vstore32m(o, oo + {r} * ldo + {LANES32 * last}, a{r}_{last}, nlast)"]
    return src


def _tile_source(rows, vecs):
    """rows x vecs vectors of out at row offset vo (v), column offset wo (W), out offset oo;
    the last vector holds ``nlast`` (1..16) columns, and the tile loads ``wlast`` of W's:
    ``nlast`` where it reads W in place (nothing past a row's end), all 16 from a copied
    panel, whose padding is zeros (a masked load in every step had made products 500 or
    1000 wide, such as the 784-1000 layer's x @ W, 5-8% slower on the AVX2 path). The k
    loop is written out twice, every vector whole or the last one masked, rather than the
    load chosen inside it: LLVM then split the loop itself, and on the AVX2 path the 5-row
    tile kept three of its sums on the stack in every step (docs/performance-notes.md, "The
    register tiles")."""
    name = f"_tile_{rows}x{vecs}"
    src = [f"    a{r}_{c} = vzero32()" for r in range(rows) for c in range(vecs)]
    for test, masked in ((f"if wlast == {LANES32}:", False), ("else:", True)):
        # two steps a pass, then the odd one: fewer loop instructions per FMA (the AVX2
        # tiles' loop was near the core's issue limit); the sums in the same order
        src += [f"    {test}", "        for k0 in range(0, K - 1, 2):"]
        for step in range(2):
            src += [f"            k = k0 + {step}", "            wb = wo + k * ldw", "            vb = vo + k"]
            src += [f"            prefetch(w, wb + {PREFETCH_ROWS} * ldw + {LANES32 * c})" for c in range(vecs)]
            src += _fma_lines(rows, vecs, " " * 12, masked, width="wlast")
        src += ["        if K % 2:", "            wb = wo + (K - 1) * ldw", "            vb = vo + K - 1"]
        src += _fma_lines(rows, vecs, " " * 12, masked, width="wlast")
    src += _store_lines(rows, vecs)
    return name, _over_tiles(name, "v, ldv, w, wo, ldw, o, ldo, K, nlast, wlast",
                             ["vo = r0 * ldv", "oo = r0 * ldo + wo"], src)


def _over_tiles(name, args, setup, body):
    """The source of ``name(args, tiles, t0, t1)``: the tile code ``body`` (lines of a
    function body) once for each row tile t0..t1, starting at row ``r0 = tiles[tile]``,
    after ``setup``. One call per run of tiles of one row count, not one per tile (each
    call passes every array's fields through the dispatcher and the tile): faster for
    block_outer_sum, whole blocks and stretches alike; v @ W unchanged (a few calls per
    product)."""
    src = [f"def {name}({args}, tiles, t0, t1):", "    for tile in range(t0, t1):", "        r0 = tiles[tile]"]
    src += [f"        {line}" for line in setup]
    return "\n".join(src + ["    " + line for line in body])


def _outer_source(rows, vecs):
    """rows x vecs vectors of out = the tree over blocks b of alphas[b] * A_b.T @ D_b, from
    A packed by row tiles (v: the tile of rows vo.. of out takes ``rows`` * ldv floats from
    vo * ldv on, its rows' values of A's row k side by side at k * rows, so that a step's
    broadcasts are at fixed offsets from one address) and D (w, column wo: its columns, a
    copied panel whose rows are whole vectors, so that only the stores are masked): per
    block an FMA
    chain over the block's rows in order, one multiply by alphas[b], then the postfix
    tree's additions (``merges[b]`` of them) against the partial sums on ``stack``. The
    multiply is an FMA with -0 (rounded once, exactly a plain *) and the additions are
    :func:`vadd32`'s, which no contraction can fuse with a product either; an addition as
    an FMA with 1, the same bits, takes the FMA pipes from the products on CPUs that add
    in pipes of their own (AMD Zen 4; docs/performance-notes.md)."""
    name = f"_outer_{rows}x{vecs}"
    size = rows * vecs * LANES32
    acc = [(r, c) for r in range(rows) for c in range(vecs)]
    # alphas ends with -0: a b + (-0) is exactly a b
    src = ["    zero = vzero32()",
            "    minus0 = vbcast32(alphas, alphas.size - 1)"]
    # ask for out's lines now (and, where the tile steps, the velocity's): its stores and
    # the step's loads come after all its blocks' FMAs, and a weight row is seldom in
    # cache (a store that misses stalled the tile's stack stores). Into L2, not L1, where
    # the FMAs read D's panel and A's tile: the step ran 6-8% faster over the stack's
    # shapes on both paths than with out's lines in L1 (docs/performance-notes.md). Both
    # ends of each vector, which straddles two lines where a row is not whole lines.
    src += [f"    prefetch_l2(o, oo + {r} * ldo + {LANES32 * c + e})" for r, c in acc for e in (0, LANES32 - 1)]
    src += ["    if sgd:"]
    src += [f"        prefetch_l2(vel, oo + {r} * ldo + {LANES32 * c + e})" for r, c in acc for e in (0, LANES32 - 1)]
    src += [f"    a{r}_{c} = zero" for r, c in acc]
    src += ["    top = 0", "    for b in range(merges.size):"]
    src += [f"        a{r}_{c} = zero" for r, c in acc]
    src += ["        for k in range(starts[b], starts[b + 1]):",
            "            wb = k * ldw + wo",
            f"            vb = vo * ldv + k * {rows}"]
    src += _fma_lines(rows, vecs, " " * 12, vstep="1")
    src += _scale_merge_lines(rows, vecs, " " * 8, "b", "merges[b]", size)
    src += ["        if b + 1 < merges.size:  # the root's sum stays in registers for the store below"]
    src += _stack_lines(rows, vecs, " " * 12, "vstore32")
    src += [f"            top += {size}"]
    src += ["    if sgd:"]
    src += _sgd_lines(rows, vecs, " " * 8)
    src += ["    else:"]
    src += _store_lines(rows, vecs, " " * 8)
    return name, _over_tiles(name, "v, ldv, w, ldw, wo, starts, merges, alphas, stack, o, vel, ldo, nlast, sgd",
                             ["vo = r0", "oo = r0 * ldo + wo"], src)


def _sgd_lines(rows, vecs, pad):
    """The tile's finished sums g as the step :func:`kernels.nb.update.sgd_momentum_update`
    takes with them, instead of stored: at every element of p (``o``) and v (``vel``),
    v = momentum v - lr (g + decay p), p += v, each product and sum rounded once as there
    (FMAs with -1 and -0, :func:`vadd32`), the decay left out where it is 0 (as that kernel
    does). The scalars: ``alphas``' last five, [decay, momentum, lr, -1, -0]."""
    src = [f"{pad}dec = vbcast32(alphas, alphas.size - 5)",
           f"{pad}mom = vbcast32(alphas, alphas.size - 4)",
           f"{pad}rate = vbcast32(alphas, alphas.size - 3)",
           f"{pad}minus1 = vbcast32(alphas, alphas.size - 2)",
           f"{pad}decays = alphas[alphas.size - 5] != 0"]
    last = vecs - 1
    for r in range(rows):
        for c in range(vecs):
            at = f"oo + {r} * ldo + {LANES32 * c}"
            inner = pad + "    " if c == last else pad  # the last vector: whole or masked
            for whole in (True, False) if c == last else (True,):
                if c == last:
                    src += [f"{pad}if nlast == {LANES32}:" if whole else f"{pad}else:"]
                load = (lambda a: f"vload32({a}, {at})") if whole else (lambda a: f"vload32m({a}, {at}, nlast)")
                store = (lambda a, x: f"vstore32({a}, {at}, {x})") if whole else \
                    (lambda a, x: f"vstore32m({a}, {at}, {x}, nlast)")
                src += [f"{inner}p = {load('o')}",
                        f"{inner}g = vadd32(a{r}_{c}, vfma32(dec, p, minus0)) if decays else a{r}_{c}",
                        f"{inner}s = vfma32(vfma32(rate, g, minus0), minus1, vfma32(mom, {load('vel')}, minus0))",
                        f"{inner}{store('vel', 's')}",
                        f"{inner}{store('o', 'vadd32(p, s)')}"]
    return src


def _scale_merge_lines(rows, vecs, pad, b, merges, size):
    """A block's finished sums times alphas[b] (unless 1), then ``merges`` additions of
    the partial sums below ``top`` on the stack (slots ``size`` floats apart)."""
    acc = [(r, c) for r in range(rows) for c in range(vecs)]
    src = [f"{pad}if alphas[{b}] != 1:", f"{pad}    s = vbcast32(alphas, {b})"]
    src += [f"{pad}    a{r}_{c} = vfma32(a{r}_{c}, s, minus0)" for r, c in acc]
    src += [f"{pad}for m in range({merges}):", f"{pad}    top -= {size}"]
    src += [f"{pad}    a{r}_{c} = vadd32(vload32(stack, top + {(r * vecs + c) * LANES32}), a{r}_{c})"
            for r, c in acc]
    return src


def _stack_lines(rows, vecs, pad, op):
    """The tile's sums stored to (``vstore32``) or loaded from (``vload32``) the stack at ``top``."""
    at = [(r, c, f"top + {(r * vecs + c) * LANES32}") for r in range(rows) for c in range(vecs)]
    if op == "vstore32":
        return [f"{pad}vstore32(stack, {a}, a{r}_{c})" for r, c, a in at]
    return [f"{pad}a{r}_{c} = vload32(stack, {a})" for r, c, a in at]


def _segment_source(rows, vecs):
    """:func:`_outer_source`'s tiles for one stretch of rows k0..k1 of one block, for
    blocks longer than :data:`SEGMENT_ROWS`: row tiles t0..t1 of out (all of ``rows`` rows,
    starting at rows ``tiles[t]``), one column panel (``wo``); the stretch's rows of A
    transposed in ``v`` (rows ``ldv`` apart) and of D padded in ``w``. D's panel rows of a
    stretch stay in L1 while every row tile passes over them (a 625-row block's whole
    panel, 1.9 MB, had to come from L3 for every tile). Each tile's unfinished sums wait on
    its stack (at ``top0``, then ``region`` floats apart; fresh: the block's first stretch
    starts from zero), so each out[i, j] is the FMA chain of the whole block in order, as
    in one call; with ``block`` >= 0 the stretch ends that block, which is then scaled and
    merged as there (``merges`` additions, slots :data:`SLOT` floats apart) and stored to
    the stack, or to out at the root."""
    name = f"_segment_{rows}x{vecs}"
    src = ["    minus0 = vbcast32(alphas, alphas.size - 1)",
           "    if fresh:"]
    src += [f"        a{r}_{c} = vzero32()" for r in range(rows) for c in range(vecs)]
    src += ["    else:"]
    src += _stack_lines(rows, vecs, " " * 8, "vload32")
    src += ["    for k in range(k0, k1):",
            "        wb = (k - k0) * ldw + wo",
            "        vb = vo * ldv + k - k0"]
    src += _fma_lines(rows, vecs, " " * 8)
    src += ["    if block >= 0:"]
    src += _scale_merge_lines(rows, vecs, " " * 8, "block", "merges", SLOT)
    src += ["    if block < 0 or not root:"]
    src += _stack_lines(rows, vecs, " " * 8, "vstore32")
    src += ["    else:"]
    src += _store_lines(rows, vecs, " " * 8)
    setup = ["vo = r0", "oo = r0 * ldo + wo", "top = top0 + (tile - t0) * region",
             f"for i in range(lo, {SLOT}, {LANES32}):  # a later tile's stack (in L3 by then)",
             f"    prefetch(stack, top + {PREFETCH_TILES} * region + i)"]
    return name, _over_tiles(name, "v, ldv, w, ldw, wo, k0, k1, fresh, block, merges, root, alphas, stack, top0, "
                             "region, lo, o, ldo, nlast", setup, src)


_SCRATCH = threading.local()


def _scratch(name: str, size: int) -> np.ndarray:
    """``size`` float32s of this thread's scratch buffer ``name`` (a copied panel, the
    tree's stack), kept from call to call rather than allocated in each: for a narrow
    layer the allocations were a sizeable part of the call (docs/performance-notes.md).
    Each thread has its own (aepar's threads take bands and groups at once); a call's
    scratch is never returned to its caller."""
    buf = getattr(_SCRATCH, name, None)
    if buf is None or buf.size < size:
        buf = empty(max(size, 1), np.float32)
        setattr(_SCRATCH, name, buf)
    return buf[:size]


def _define(name, source):
    """Compile generated source as if written in this file (so Numba caches it here)."""
    return define(name, source, globals(), __file__)


_TILES = {(r, c): _define(*_tile_source(r, c)) for r in range(1, RT + 1) for c in range(1, CT + 1)}


def _dispatch_source(name, prefix, tiles, args):
    """``name(a, b, *args)`` calls the tile ``prefix{a}x{b}`` in jitted code: Numba cannot
    index a tuple of functions with a run-time number, so the choice is written out."""
    src = [f"def {name}(a, b, {args}):"]
    for (r, c) in tiles:
        src += [f"    if a == {r} and b == {c}:", f"        return {prefix}{r}x{c}({args})"]
    return name, "\n".join(src)


# three row counts only (see _outer_row_tiles): each generated tile takes a while to
# compile on first use, and every rank of a first run compiles them at once
_OUTER_ROWS = sorted({1, OR - 1, OR})
_OUTERS = {(r, c): _define(*_outer_source(r, c)) for r in _OUTER_ROWS for c in range(1, OC + 1)}
_SEGMENTS = {(r, c): _define(*_segment_source(r, c)) for r in _OUTER_ROWS for c in range(1, OC + 1)}
_tile = _define(*_dispatch_source("_tile", "_tile_", _TILES, "v, ldv, w, wo, ldw, o, ldo, K, nlast, wlast, tiles, "
                                  "t0, t1"))
_outer = _define(*_dispatch_source("_outer", "_outer_", _OUTERS, "v, ldv, w, ldw, wo, starts, merges, alphas, "
                                   "stack, o, vel, ldo, nlast, sgd, tiles, t0, t1"))
_segment = _define(*_dispatch_source("_segment", "_segment_", _SEGMENTS, "v, ldv, w, ldw, wo, k0, k1, fresh, block, "
                                     "merges, root, alphas, stack, top0, region, lo, o, ldo, nlast, tiles, t0, t1"))


@njit(**JIT)
def _row_tiles(M, most):
    """Bounds of the row tiles: as few tiles of at most ``most`` rows as will do, of
    nearly equal size (13 rows with 6 at most: 5, 4, 4)."""
    ntile = (M + most - 1) // most
    bounds = np.empty(ntile + 1, np.int64)
    bounds[0] = 0
    for t in range(ntile):
        bounds[t + 1] = bounds[t] + (M - bounds[t] + ntile - t - 1) // (ntile - t)
    return bounds


@njit(**JIT)
def _tile_runs(tiles):
    """Where the runs of row tiles of one row count start (and the end): each run is one
    call of a generated tile function (see :func:`_over_tiles`)."""
    ntile = tiles.size - 1
    runs = np.empty(ntile + 1, np.int64)
    count = 0
    for t in range(ntile):
        if t == 0 or tiles[t + 1] - tiles[t] != tiles[t] - tiles[t - 1]:
            runs[count] = t
            count += 1
    runs[count] = ntile
    return runs[:count + 1]


@njit(**JIT)
def _outer_row_tiles(M):
    """Row tiles of OR or OR - 1 rows (balanced) where M allows, else OR-row tiles and
    single rows: the row counts :data:`_OUTERS` has."""
    if M >= OR * (OR - 1):
        return _row_tiles(M, OR)
    full = M // OR
    bounds = np.empty(full + M % OR + 1, np.int64)
    for t in range(bounds.size):
        bounds[t] = OR * t if t <= full else OR * full + (t - full)
    return bounds


@njit(**JIT)
def _rows_times(v, W, out, panel, transposed=False, filled=False):
    """out = v @ W by the row tiles, column panel by column panel. ``panel``: room for one
    or more panels (K x CT vectors each) that W's are copied into, as many at a time as it
    holds (:func:`_copy_panels`), before the tiles take them, or empty to read W where it
    is. Room for all of W's panels keeps each at its own place, copied COPY_PANELS at a
    time; ``filled``: a call before this one copied them there from the same W, and the
    tiles read them as they are. ``transposed``: out = v @ W.T, each panel of W.T copied
    transposed out of W's rows (:func:`_transposed_panel`), so that every out[r, i] is
    the same FMA chain over v's row r and W's row i."""
    M, K = v.shape
    N = out.shape[1]
    vf, wf, of = v.reshape(-1), W.reshape(-1), out.reshape(-1)
    tiles = _row_tiles(M, RT)
    runs = _tile_runs(tiles)
    ldp = CT * LANES32
    j = 0
    while j < N:
        vecs = min(CT, (N - j + LANES32 - 1) // LANES32)
        nlast = min(LANES32, N - j - (vecs - 1) * LANES32)
        src, so, lds, wlast = wf, j, N, nlast  # where the tiles read the panel: in W, or copied (whole vectors)
        if transposed:
            _transposed_panel(wf, K, j, min(ldp, N - j), panel, ldp)
            src, so, lds, wlast = panel, 0, ldp, LANES32
        elif panel.size:
            count = panel.size // (K * ldp)  # the panels ``panel`` holds (COPY_PANELS, or all of W's)
            at = j // ldp % count  # this panel's place among them
            step = min(count, COPY_PANELS)  # panels copied a pass
            if at % step == 0 and not filled:
                _copy_panels(wf, K, N, j, panel[at * K * ldp:], ldp, step)
            src, so, lds, wlast = panel[at * K * ldp:], 0, ldp, LANES32
        for q in range(runs.size - 1):
            t = runs[q]
            # a tile takes one column offset for W and out: out from column j - so on
            _tile(tiles[t + 1] - tiles[t], vecs, vf, K, src, so, lds, of[j - so:], N, K, nlast, wlast, tiles, t,
                  runs[q + 1])
        j += vecs * LANES32


@njit(**JIT)
def _copy_panels(wf, K, N, j, panel, ldp, count):
    """The column panels of W (K rows ``N`` floats apart in ``wf``) from column j on, up to
    ``count`` of them, each into its K x ``ldp`` floats of ``panel``, one after
    another; a last vector that W's row ends inside is padded with zeros (nothing past
    the row's end is read). ``ldp`` is CT vectors, as everywhere here. Several panels a
    pass: each row of W then gives one run of lines rather than one line, which the AVX2
    tiles had waited for."""
    vectors = min(count * ldp, N - j + LANES32 - 1) // LANES32  # those W's row reaches
    whole = (N - j) // LANES32  # vectors before a last, partial one
    for k in range(K):
        prefetch(wf, (k + PREFETCH_ROWS) * N + j)
        row = k * N + j
        for c in range(min(whole, vectors)):
            vstore32(panel, (c // CT * K + k) * ldp + c % CT * LANES32, vload32(wf, row + c * LANES32))
        if whole < vectors:
            c = whole
            vstore32(panel, (c // CT * K + k) * ldp + c % CT * LANES32,
                     vload32m(wf, row + c * LANES32, N - j - c * LANES32))


@njit(**JIT)
def _transposed_panel(wf, N, j, cols, panel, ldp):
    """panel[n, c] = W[j + c, n] for the ``cols`` rows of W (rows N floats apart in
    ``wf``) from row j on, zeros from column ``cols`` to its last vector: 16 x 16 blocks
    transposed in registers, the rest (a row count or a width not a multiple of 16) one
    float at a time."""
    whole, nw = cols // LANES32 * LANES32, N // LANES32 * LANES32
    for c in range(0, whole, LANES32):
        for n in range(0, nw, LANES32):
            vtranspose32(panel, n * ldp + c, ldp, wf, (j + c) * N + n, N)
        for n in range(nw, N):
            for i in range(c, c + LANES32):
                panel[n * ldp + i] = wf[(j + i) * N + n]
    if whole < cols:
        for n in range(N):
            for i in range(whole, whole + LANES32):
                panel[n * ldp + i] = wf[(j + i) * N + n] if i < cols else 0


@njit(**JIT)
def _block_outer_sum(a_row, d_row, chain, merges, alphas, out, stack, panel, vel, sgd):
    """The tiles of :func:`block_outer_sum`, with A packed by row tiles first (see
    :func:`_outer_source`). A's and D's rows are read where they lie, wherever that is
    (several parts: a tied autoencoder's two, several threads' stacked blocks): chain row
    k (:func:`_chain`) of A (m floats, adjacent) from address ``a_row[k]``, of D (n
    floats) from ``d_row[k]``; block b's rows are chain[b]:chain[b + 1]. The packing and
    the panels' copies gather them, so the parts are never copied into one array first.
    Each column panel of D is copied into ``panel`` (rows x OC vectors, the last one
    padded with zeros where D's rows end) first, where the row tiles then read it: they
    load whole vectors. With ``sgd`` the sums are not stored but step ``out`` (the
    parameter) and ``vel`` (its velocity; see :func:`_sgd_lines`). Its arguments are the
    same types whatever the parts (compiled once; :func:`_chain` is what the parts'
    layouts specialise)."""
    M, N = out.shape
    rows = chain[-1]
    tiles = _outer_row_tiles(M)
    runs = _tile_runs(tiles)
    packed = _pack_row_tiles(a_row, M, tiles)
    of, vf = out.reshape(-1), vel.reshape(-1)
    ldp = OC * LANES32
    j = 0
    while j < N:  # a column panel of D stays in cache while the row tiles pass over it
        vecs = min(OC, (N - j + LANES32 - 1) // LANES32)
        nlast = min(LANES32, N - j - (vecs - 1) * LANES32)
        for k in range(rows):  # the last vector masked where D's rows end: zeros past them
            src = d_row[k]
            for c in range(vecs - 1):
                vstore32(panel, k * ldp + c * LANES32, vload32(src, j + c * LANES32))
            last = j + (vecs - 1) * LANES32
            vstore32(panel, k * ldp + (vecs - 1) * LANES32,
                     vload32(src, last) if nlast == LANES32 else vload32m(src, last, nlast))
        for q in range(runs.size - 1):
            t = runs[q]
            # the tiles take one column offset for D and out: out from column j on
            _outer(tiles[t + 1] - tiles[t], vecs, packed, rows, panel, ldp, 0, chain, merges, alphas,
                   stack, of[j:], vf[j:] if sgd else vf, N, nlast, sgd, tiles, t, runs[q + 1])
        j += vecs * LANES32


@njit(**JIT)
def _chain(a_parts, d_parts, starts):
    """The rows of one call as its blocks' FMA chains run over them: block after block,
    each block's rows of every part (starts[p, b]:starts[p, b + 1] of part p; one row of
    starts: the same rows of every part), one part after another. Returns (each chain
    row's address in A, and in D: the loads take addresses, the same whichever part a
    row is in; the blocks' offsets in the chain). The parts may differ in layout (a band
    of A's columns, whole rows): the tuples are unrolled, each part's rows taken at once
    (a tuple's array taken in a loop costs a reference count each time). The caller holds
    the parts while their addresses are read."""
    blocks, shared = starts.shape[1] - 1, starts.shape[0] == 1
    parts = len(a_parts)
    total = 0
    for p in range(parts):
        total += starts[0 if shared else p, blocks]
    chain = np.empty(blocks + 1, np.int64)
    at = np.empty((parts, blocks), np.int64)  # where each part's rows of each block begin in the chain
    k = 0
    for b in range(blocks):
        chain[b] = k
        for p in range(parts):
            at[p, b] = k
            k += starts[0 if shared else p, b + 1] - starts[0 if shared else p, b]
    chain[blocks] = k
    a_row = np.empty(total, np.int64)
    d_row = np.empty(total, np.int64)
    p = 0
    for a in literal_unroll(a_parts):
        _row_addresses(address32(a), a.strides[0], starts[0 if shared else p], at[p], a_row)
        p += 1
    p = 0
    for d in literal_unroll(d_parts):
        _row_addresses(address32(d), d.strides[0], starts[0 if shared else p], at[p], d_row)
        p += 1
    return a_row, d_row, chain


@njit(**JIT)
def _row_addresses(base, step, starts, at, rows):
    """rows[at[b] + i] = the address of row starts[b] + i of the part at ``base`` (rows
    ``step`` bytes apart), for each block b's rows."""
    for b in range(at.size):
        for r in range(starts[b], starts[b + 1]):
            rows[at[b] + r - starts[b]] = base + r * step


@njit(**JIT)
def _pack_row_tiles(a_row, m, tiles):
    """A's chain rows (:func:`_chain`: row k at address a_row[k], its elements adjacent)
    as the row tiles of out take them: tile [r0, r1) at r0 * rows, A[k, r0:r1] at r0 *
    rows + k * (r1 - r0), each such piece one masked load (a tile has at most OR <= 16
    rows), not element by element: at 100 rows the packing is then a small part of the
    product (docs/performance-notes.md). Each piece is stored as a whole vector: the
    lanes past it land where the next piece (or, past the last, the vector of slack at
    the end) is written after it. A masked store is microcoded on AMD's AVX2
    (VMASKMOVPS): one per piece made the packing cost as much as the FMAs where out is
    narrow."""
    rows = a_row.size
    packed = np.empty(rows * m + LANES32, np.float32)
    for t in range(tiles.size - 1):
        r0, r1 = tiles[t], tiles[t + 1]
        width = r1 - r0
        for k in range(rows):
            vstore32(packed, r0 * rows + k * width, vload32m(a_row[k], r0, width))
    return packed


@njit(**JIT)
def _block_outer_sum_segments(af, lda, D, starts, merges, alphas, out, stack, at, dp):
    """:func:`_block_outer_sum` for long blocks: each block in stretches of
    :data:`SEGMENT_ROWS` rows, every tile of out taking a stretch before the next one
    (``stack``: :func:`stack_depth` slots of :data:`SLOT` floats per tile, as many floats
    as out times the tree's depth: 12.6 MB for 784 x 1000 and 8 blocks). A stretch's rows
    are first copied into small buffers that stay in cache: A's (rows x m, its rows ``lda``
    floats apart in ``af``) transposed into ``at`` (m x SEGMENT_ROWS), so that a tile's
    broadcasts read along its rows, and D's into ``dp`` (SEGMENT_ROWS x n padded to whole
    vectors, the padding zero), instead of whole transposed and padded copies of A and D
    (see the module docstring)."""
    M, N = out.shape
    m, ldd = at.shape[0], dp.shape[1]
    tiles = _outer_row_tiles(M)
    runs = _tile_runs(tiles)
    ntile = tiles.size - 1
    panel = OC * LANES32
    region = stack.size // (ntile * ((N + panel - 1) // panel))
    atf, dpf, of = at.reshape(-1), dp.reshape(-1), out.reshape(-1)
    dp[:, N:] = 0
    depth = 0  # finished partial sums on every tile's stack
    for b in range(merges.size):
        k0, end = starts[b], starts[b + 1]
        while True:  # a stretch's rows of A and D stay in cache while every tile takes them
            k1 = min(end, k0 + SEGMENT_ROWS)
            last = b if k1 == end else -1
            _transposed_stretch(af, lda, k0, k1, m, atf, SEGMENT_ROWS)
            for k in range(k0, k1):
                for i in range(N):
                    dp[k - k0, i] = D[k, i]
            slot = depth * SLOT
            lo = -merges[b] * SLOT if last >= 0 else 0  # the stack a tile reads and writes: slot + lo ...
            for j in range(0, N, panel):
                vecs = min(OC, (N - j + LANES32 - 1) // LANES32)
                nlast = min(LANES32, N - j - (vecs - 1) * LANES32)
                for q in range(runs.size - 1):
                    t = runs[q]
                    _segment(tiles[t + 1] - tiles[t], vecs, atf, SEGMENT_ROWS, dpf, ldd, j, k0, k1, k0 == starts[b],
                             last, merges[b], b + 1 == merges.size, alphas, stack, slot + t * region, region, lo, of,
                             N, nlast, tiles, t, runs[q + 1])
                slot += ntile * region
            if last >= 0:
                break
            k0 = k1
        depth += 1 - merges[b]


@njit(**JIT)
def _transposed_stretch(af, lda, k0, k1, m, atf, ldt):
    """at[i, k - k0] = A[k, i] for rows k0..k1 of A (rows ``lda`` floats apart in ``af``)
    and its m columns, ``at`` rows ``ldt`` apart: 16 x 16 blocks transposed in registers
    (copied element by element, the stretches were a sizeable part of a long block's
    product), the rest of the rows and columns one float at a time."""
    kw, mw = k0 + (k1 - k0) // LANES32 * LANES32, m // LANES32 * LANES32
    for k in range(k0, kw, LANES32):
        for i in range(0, mw, LANES32):
            vtranspose32(atf, i * ldt + k - k0, ldt, af, k * lda + i, lda)
        for i in range(mw, m):
            for r in range(k, k + LANES32):
                atf[i * ldt + r - k0] = af[r * lda + i]
    for k in range(kw, k1):
        for i in range(m):
            atf[i * ldt + k - k0] = af[k * lda + i]


def _check(name, a, W, out, shape):
    if not (a.dtype == W.dtype == out.dtype == np.float32):
        raise TypeError(f"{name} takes float32 arrays, got {a.dtype}, {W.dtype}, {out.dtype}")
    if a.ndim != 2 or W.ndim != 2 or out.shape != shape:
        raise ValueError(f"{name}: shapes {a.shape}, {W.shape} -> {out.shape} do not match")
    if not (a.flags.c_contiguous and W.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError(f"{name} takes C-contiguous arrays")


def rows_times_t(h, W, out):
    """out = h @ W.T for C-contiguous float32 h (M, N), W (K, N) and out (M, K): each
    out[r, i] is fma(h[r, N-1], W[i, N-1], ... fma(h[r, 0], W[i, 0], 0)), in that order
    (:func:`rows_times` on W.T), whatever the other rows of the call. Returns out."""
    _check("rows_times_t", h, W, out, (h.shape[0], W.shape[0]) if W.shape[1:] == h.shape[1:] else None)
    if h.shape[1] == 0:
        out[...] = 0
    elif out.size:
        _rows_times(h, W, out, wt_panel(W), True)
    return out


def rows_times(v, W, out):
    """out = v @ W for C-contiguous float32 v (M, K), W (K, N) and out (M, N); each row's
    result depends on that row of v alone (see the module docstring). Returns out."""
    _check("rows_times", v, W, out, (v.shape[0], W.shape[1]) if W.shape[:1] == v.shape[1:] else None)
    if v.shape[1] == 0:
        out[...] = 0
    elif out.size:
        _rows_times(v, W, out, w_panels(v.shape[0], W, False)[0])
    return out


def w_panels(rows: int, W, keep: bool) -> tuple[np.ndarray, bool]:
    """(the room :func:`_rows_times` copies W's column panels into for a product of
    ``rows`` rows, whether it holds all of them): none where the tiles read W in place (one
    row tile reads a panel once anyway; many read it from a copy faster); with ``keep``,
    room for all of W's panels where W is at most :data:`KEEP_PANELS_BYTES`, so that a
    second product with the same W (CD-1's v0 @ W and vk @ W, a tied layer's x @ W and
    dz2 @ W, in one compiled call) reads them there (``filled``) instead of copying them
    again; else room for COPY_PANELS of them. This thread's scratch, kept between calls."""
    if not (rows > RT and (_aliased(W.shape[1]) or (COPY_ROWS is not None and rows >= COPY_ROWS))):
        return _NO_PANEL, False
    ldp = CT * LANES32
    if keep and W.nbytes <= KEEP_PANELS_BYTES:
        return _scratch("kept panels", -(-W.shape[1] // ldp) * W.shape[0] * ldp), True
    return _scratch("panel", COPY_PANELS * W.shape[0] * ldp), False


def wt_panel(W) -> np.ndarray:
    """The room :func:`_rows_times` copies each panel of W.T into (``transposed``): this
    thread's scratch, one panel of W's rows at a time."""
    return _scratch("panel", W.shape[1] * CT * LANES32)


def block_outer_sum(A, D, starts, merges, alphas, out):
    """out = the tree over blocks of alphas[b] * A_b.T @ D_b; see
    :func:`kernels.ref.blocksum.block_outer_sum` (A and D arrays, or parts).
    Float32 arrays, D's and out C-contiguous, take the register tiles here (every out[i, j]
    of a block an FMA chain over its rows in order, the tree's additions exactly as
    NumPy's); anything else the reference. Returns out."""
    starts, merges = check_block_outer_sum(A, D, starts, merges, alphas, out)
    if not _fits(A, D, out):
        return _ref_block_outer_sum(A, D, starts, merges, alphas, out)
    if out.size:
        scales = _scales(alphas)
        if _long_blocks(A, starts):
            # allocated per call, not kept (_scratch): megabytes at batch 5000, and one such
            # call is long enough that the allocation (and a copy of the parts into one
            # array) does not count
            A, D, starts = interleaved(A, D, starts)
            tiles = (len(_outer_row_tiles(out.shape[0])) - 1) * -(-out.shape[1] // (OC * LANES32))
            stack = empty(tiles * postfix_tree(merges).depth * SLOT, np.float32)
            at = empty((A.shape[1], SEGMENT_ROWS), np.float32)
            dp = empty((SEGMENT_ROWS, _padded_width(D.shape[1])), np.float32)
            _block_outer_sum_segments(*_flat_rows(A), D, starts, merges, scales, out, stack, at, dp)
        else:
            _in_tiles(A, D, starts, merges, scales, out, _NO_PANEL, False)
    return out


def _long_blocks(A, starts) -> bool:
    """Whether a block's chain (its rows of every part of A) is longer than LONG_ROWS:
    then it is taken in stretches (:func:`_segment_source`), not by the whole-block tiles."""
    return chain_rows(A, starts) > LONG_ROWS


def _fits(A, D, out, *more):
    """Whether the tiles here take these arrays: float32 (A and D as arrays or parts: see
    :func:`block_outer_sum`), D's and the outputs C-contiguous, the outputs writeable."""
    if type(A) is not tuple and type(D) is not tuple and not more:  # the common call: arrays, no step
        return (A.dtype == D.dtype == out.dtype == np.float32 and D.flags.c_contiguous and out.flags.c_contiguous
                and out.flags.writeable)
    f32 = np.float32
    for a in as_parts(A):
        if a.dtype != f32:
            return False
    for d in (*as_parts(D), out, *more):
        if d.dtype != f32 or not d.flags.c_contiguous:
            return False
    return out.flags.writeable and all(o.flags.writeable for o in more)


def _in_tiles(A, D, starts, merges, scales, out, vel, sgd):
    """:func:`_block_outer_sum` with its scratch: the tree's stack and D's column panel.
    Each part of A and D is read where it lies (a thread's band of A's columns is a view:
    the packing is its one copy), from the addresses of its rows (:func:`_chain`), while
    the parts are held here; a part of A whose row's elements are not adjacent is copied
    first."""
    a_parts, d_parts = as_parts(A), as_parts(D)
    for a in a_parts:
        if not _rows_in_place(a):
            a_parts = tuple([np.ascontiguousarray(a) for a in a_parts])
            break
    a_row, d_row, chain = _chain(a_parts, d_parts, starts.reshape(1, -1) if starts.ndim == 1 else starts)
    _block_outer_sum(a_row, d_row, chain, merges, scales, out, _scratch("stack", postfix_tree(merges).depth * SLOT),
                     _scratch("panel", a_row.size * OC * LANES32), vel, sgd)


def _rows_in_place(A) -> bool:
    """Whether A's rows can be read where they lie: each row's elements adjacent, the
    rows a whole number of elements apart, forward."""
    return A.strides[1] == A.itemsize and A.strides[0] >= 0 and A.strides[0] % A.itemsize == 0


def _flat_rows(A):
    """(af, lda): A's rows as one flat float32 view from A[0, 0] to A[-1, -1], rows ``lda``
    floats apart, the gaps between them included: A read where it lies when its rows are
    contiguous (a view of a band of columns too), else a contiguous copy."""
    if not _rows_in_place(A):
        A = np.ascontiguousarray(A)
    lda = A.strides[0] // A.itemsize
    # an empty A is C-contiguous, so the strided view always has a first and a last row
    if A.flags.c_contiguous:
        return A.reshape(-1), lda
    return np.lib.stride_tricks.as_strided(A, ((A.shape[0] - 1) * lda + A.shape[1],), (A.itemsize,)), lda


def block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay=0.0):
    """The SGD step of :func:`kernels.nb.update.sgd_momentum_update` on ``p`` and ``v`` with
    the gradient g = :func:`block_outer_sum` (A, D, ...), the same bits, g not written out:
    each tile of g steps its elements of p and v where it ends, in registers (written out,
    g is a pass over memory the size of W and the step another over W, v and g). Returns
    None."""
    starts, merges = check_block_outer_sum(A, D, starts, merges, alphas, p)
    if v.shape != p.shape:
        raise ValueError(f"block_outer_sum_sgd: v {v.shape} does not match p {p.shape}")
    if not _fits(A, D, p, v) or _long_blocks(A, starts):  # the sum, then the step
        g = empty(p.shape, p.dtype)
        block_outer_sum(A, D, starts, merges, alphas, g)
        return sgd_momentum_update(p, g, v, lr, momentum, weight_decay)
    tiles_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay)


def tiles_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay):
    """:func:`block_outer_sum_sgd` by its tiles, on arrays its checks have passed (or a
    caller's own: as :func:`check_block_outer_sum` returns starts and merges, the arrays
    as :func:`_fits` takes them, no block longer than LONG_ROWS)."""
    if p.size:
        _in_tiles(A, D, starts, merges, _scales(alphas, weight_decay, momentum, lr), p, v, True)


def rows_tree_sum(rows, merges):
    """:func:`kernels.ref.blocksum.rows_tree_sum` in one compiled call: the same additions
    in the same order (a NumPy addition a merge cost a narrow layer's step more than the
    additions themselves). Returns ``rows[0]``, which holds the sum."""
    tree = check_rows_tree(rows, merges)
    _rows_tree(rows, tree.array, np.empty(tree.array.size, np.int64))
    return rows[0]


def blocks_sgd_step(A, D, starts, merges, alphas, W, vW, bias_rows, biases, velocities, lr, momentum, weight_cost=0.0):
    """See :func:`kernels.ref.blocksum.blocks_sgd_step`: :func:`block_outer_sum_sgd`'s
    tiles for W; the rows' tree and the biases' steps in one compiled call where the rows,
    biases and velocities are C-ordered, writeable and of one dtype (the arithmetic of
    :func:`rows_tree_sum` and :func:`kernels.nb.update.sgd_momentum_update`: their bits,
    without a call and its checks for each), else those kernels one after another."""
    if not biases or any(a.dtype != bias_rows.dtype or not a.flags.c_contiguous or not a.flags.writeable
                         for a in (bias_rows, *biases, *velocities)):
        return blocks_sgd_step_via(sys.modules[__package__], A, D, starts, merges, alphas, W, vW, bias_rows, biases,
                                   velocities, lr, momentum, weight_cost)
    bounds = check_bias_rows(merges, bias_rows, biases, velocities)
    block_outer_sum_sgd(A, D, starts, merges, alphas, W, vW, lr, momentum, weight_cost)
    return tree_sgd(bias_rows, merges, bounds, biases, velocities, lr, momentum)


def tree_sgd(rows, merges, bounds, biases, velocities, lr, momentum):
    """:func:`blocks_sgd_step`'s biases in one compiled call (:func:`_rows_tree_sgd`), on
    arrays its checks have passed (or a caller's own): ``rows`` C-ordered, the biases'
    columns from ``bounds``, everything of one dtype, writeable. Returns the sum, rows[0]."""
    tree = postfix_tree(merges).array
    dt = rows.dtype.type
    _rows_tree_sgd(rows, tree, np.empty(tree.size, np.int64), np.array(bounds, np.int64), tuple(biases),
                   tuple(velocities), dt(lr), dt(momentum))
    return rows[0]


def tables_sgd_step(A, D, starts, merges, W, vW, tables, biases, velocities, errors, lr, momentum, weight_cost):
    """:func:`blocks_sgd_step` for a layer's fused step (``rbm_cd_update_blocks``,
    ``tied_ae_update_blocks``) on arrays it made and checked itself: W's tiles
    (:func:`tiles_sgd`, every alpha 1), each bias's tree and step from its own table of a
    row a block (:func:`tree_sgd`; a table's columns are added as one table's would be),
    then the blocks' float64 ``errors`` rounded to the tables' dtype, as the trainer's rows
    hold them, and added in the tree. Returns that sum."""
    tiles_sgd(A, D, starts, merges, [1.0] * merges.size, W, vW, lr, momentum, weight_cost)
    for table, bias, velocity in zip(tables, biases, velocities):
        tree_sgd(table, merges, [0, bias.size], (bias,), (velocity,), lr, momentum)
    return rows_tree_sum(errors.astype(tables[0].dtype).reshape(-1, 1), merges)[0]


@njit(cache=True, nogil=True)
def _rows_tree_sgd(rows, merges, stack, bounds, biases, velocities, lr, momentum):
    """:func:`_rows_tree`, then SGD with momentum on bias i (``biases[i]``, ``velocities[i]``)
    with the sum's columns bounds[i]:bounds[i + 1], element by element as
    :func:`kernels.nb.update.sgd_momentum_update` (lr and momentum in the arrays' dtype;
    compiled as it is, without contracting the step into FMAs)."""
    _rows_tree(rows, merges, stack)
    for i in range(len(biases)):
        b, v, lo = biases[i], velocities[i], bounds[i]
        for j in range(b.size):
            vj = momentum * v[j] - lr * rows[0, lo + j]
            v[j] = vj
            b[j] += vj


@njit(**JIT)
def _rows_tree(rows, merges, stack):
    """rows[left] += rows[right] for each merge of the postfix tree, as the reference's
    stack of rows does (``stack``: the rows holding partial sums, newest last)."""
    top = 0
    for b in range(merges.size):
        right = b
        for _ in range(merges[b]):
            top -= 1
            left = stack[top]
            for j in range(rows.shape[1]):
                rows[left, j] += rows[right, j]
            right = left
        stack[top] = right
        top += 1


def _scales(alphas, weight_decay=0.0, momentum=0.0, lr=0.0):
    """The tiles' one float32 array of scalars: the blocks' alphas, then the step's
    [decay, momentum, lr] (:func:`_sgd_lines`), then -1 and -0 (:func:`_outer_source`)."""
    return np.array([*alphas, weight_decay, momentum, lr, -1, -0.0], np.float32)


def _padded_width(n: int) -> int:
    """The float32s a padded row of n columns takes: whole vectors, one more where they
    would alias (:func:`_aliased`) on a path that avoids it (PAD_ALIASED)."""
    width = -(-n // LANES32) * LANES32
    return width + LANES32 if PAD_ALIASED and _aliased(width) else width


def _aliased(row: int) -> bool:
    """Whether float32 rows of ``row`` columns put a column panel into a few cache sets
    (see ALIAS_BYTES)."""
    return (4 * row) % ALIAS_BYTES == 0


def thin(a, W, out, rows=None) -> bool:
    """Whether :func:`rows_times` takes ``out = a @ W`` (and :func:`rows_times_t` ``out = a
    @ W.T``): float32, C-contiguous, at most :data:`MAX_ROWS` rows, whatever their length.
    ``rows``: ``a`` stacks blocks of at most this many rows, each of which would take it
    alone; one call then gives every block its own bits. Short rows too (a softmax layer's
    10 classes in dz @ W.T): OpenBLAS's product there gave 64-bit ARM other bits than x86,
    the row kernel's are the same on every CPU with FMA."""
    rows = a.shape[0] if rows is None else rows
    return (a.dtype == W.dtype == out.dtype == np.float32 and a.ndim == 2 and rows <= MAX_ROWS
            and a.flags.c_contiguous and W.flags.c_contiguous and out.flags.c_contiguous)

