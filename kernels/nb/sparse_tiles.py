"""Register-tile kernels of the sparse autoencoder (float64 and float32), generated for the
target CPU.

Each tile keeps its accumulators in named variables (so that they live in registers) and
runs its layer's element-wise epilogue on them; the generators below write the source
for one tile shape and precision and :func:`_define` compiles it. A tile must fit the
register file: 32 vector registers with AVX-512, where an f64x8 or f32x16 is one
register, and 16 with AVX2, where it is two. The shapes were timed per ISA and are chosen
once, from the features Numba compiles for (which are part of Numba's cache key, so a
cache built for one CPU is never loaded on the other):

=========  ======================================  ================  ===============
ISA        tile                                    AVX-512           AVX2
=========  ======================================  ================  ===============
PV         vectors per panel row (PW = lanes PV)   4 (32 samples)    1 (8 samples)
RH         x W1, δ3 W2ᵀ: hidden units × PW         5                 5
SB × TB    a2 W2: samples × vectors of units       8 × 2             8 × 1
SG         a2 W2: samples per pass of its k loop   8                 4
OJ × OV    weight gradients: units × vectors       5 × 4             5 × 1
=========  ======================================  ================  ===============

On an AVX2 target the AVX-512 shapes are much slower than these, and larger AVX2 tiles
(2×3 hidden, 8×2 output or 2×3 gradient tiles) spill registers and are slower too; so
did the 8 × 1 output tile in one pass (16 sums in 16 registers), hence SG. The AVX2
hidden and gradient tiles hold 5 × 1 vectors, ten registers of sums: two FMA pipes of
four or five cycles' latency need eight to ten chains in flight, which the 2 × 2 tiles
(eight) only just gave. Five units a tile also fit the default 25 hidden units without
padding. The sums' order does not depend on the shapes: every ISA and shape gives the
same bits.

Float32 tiles are the same source with 16 lanes a vector (the same registers, twice the
numbers); their panels hold PW = 16 PV samples, with PV = 2 on AVX-512 (32 samples, as
float64's) and 1 on AVX2 (16), so that leaves of 32 samples fit either precision on
either CPU. Each tile below is one name that takes either precision's pointers.
"""
from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from .codegen import define
from .simd import (JIT, LANES, prefetch, store_transposed, target_isa, vadd, vbcast, vfill, vfma, vfnma,  # noqa: F401
                   vload, vmul, vsigmoid, vstore, vsub)

TILE_SHAPES = {"avx512": dict(PV=4, RH=5, SB=8, SG=8, TB=2, OJ=5, OV=4),
               "avx2": dict(PV=1, RH=5, SB=8, SG=4, TB=1, OJ=5, OV=1)}
PV32 = {"avx512": 2, "avx2": 1}  # float32's vectors per panel row
ISA = target_isa()
PV, RH, SB, SG, TB, OJ, OV = (TILE_SHAPES[ISA][k] for k in ("PV", "RH", "SB", "SG", "TB", "OJ", "OV"))
PW = LANES * PV            # float64 samples per panel
PW32 = 2 * LANES * PV32[ISA]  # float32 samples per panel
_PANEL = {types.float64: PW, types.float32: PW32}


def panel_samples(dtype) -> int:
    """Samples per panel of x in ``dtype`` (float64 or float32)."""
    return PW32 if np.dtype(dtype) == np.float32 else PW


def panel_width(a):
    """:func:`panel_samples` of the precision of ``a`` (an array or pointer), a constant
    where compiled."""


@overload(panel_width, inline="always")
def _panel_width_impl(a):
    dtype = a.dtype if isinstance(a, (types.Array, types.CPointer)) else None
    if dtype in _PANEL:
        n = _PANEL[dtype]
        return lambda a: n


def _panel_fma(rows, L, pv):
    """The body both x·W tiles share: the panel row's pv vectors of L lanes loaded at xb,
    then for each of ``rows`` hidden units its weight at wb broadcast into the accumulators."""
    src = [f"        x{c} = vload(x, xb + {L * c})" for c in range(pv)]
    for r in range(rows):
        src.append(f"        w{r} = vbcast(w, wb + {r})")
        src += [f"        a{r}_{c} = vfma(w{r}, x{c}, a{r}_{c})" for c in range(pv)]
    return src


def _hidden_source(rows, L, pv, suffix):
    """x W1 for hidden units n0 .. n0 + rows of a panel, then the layer's epilogue:
    z[zo + n·PW + lanes] = b1[n] + Σ_k w1[k·ldw + n] · x[xo + k·PW + lanes] (weights
    broadcast, panel rows as vectors of L lanes, PW = L pv); for n < h, a2 = σ(z) in place
    and act[n] += a2 on the valid lanes (mask at mo); padding units keep z (= 0).
    Iteration k also prefetches two cache lines (2L numbers) at pf[pfo + 2Lk] while k < npf."""
    name = f"_hidden{rows}{suffix}"
    cols, pw = range(pv), L * pv
    src = [f"def {name}(w, ldw, n0, bias, x, xo, K, z, zo, pf, pfo, npf, h, act, mask, mo):"]
    src += [f"    a{r}_{c} = vbcast(bias, n0 + {r})" for r in range(rows) for c in cols]
    src += ["    for k in range(K):",
            "        if k < npf:",
            f"            prefetch(pf, pfo + {2 * L} * k)",
            f"            prefetch(pf, pfo + {2 * L} * k + {L})",
            f"        xb = xo + k * {pw}",
            "        wb = k * ldw + n0"]
    src += _panel_fma(rows, L, pv)
    for r in range(rows):
        src += [f"    if n0 + {r} < h:",
                f"        s = vload(act, (n0 + {r}) * {L})"]
        for c in cols:
            src += [f"        a{r}_{c} = vsigmoid(a{r}_{c})",
                    f"        s = vfma(a{r}_{c}, vload(mask, mo + {L * c}), s)"]
        src += [f"        vstore(act, (n0 + {r}) * {L}, s)"]
        src += [f"    vstore(z, zo + (n0 + {r}) * {pw} + {L * c}, a{r}_{c})" for c in cols]
    return name, "\n".join(src)


def _output_source(ns, nv, masked, sg, L, pv, suffix):
    """The output layer for ns = 8 samples of a panel: for each tile of L·nv visible units
    (c0 = 0, L·nv, ... < ldw), z = b2 + Σ_k a[ao + k·PW + r] · w2[k·ldw + c0 + ..]
    (a2 broadcast, weight rows as vectors); then, in registers, a3 = σ(z) and δ3 =
    (a3 − x)(a3 − a3²) into d3 (sample-major rows of ldw) and, transposed, into the
    feature-major panel zt (columns zto..) that δ3 W2ᵀ reads; err += (a3 − x)², db2 +=
    δ3 per visible unit. masked: padding columns (cmask) and rows >= nval count zero.
    The samples go through the k loop sg at a time (all 8 with AVX-512; 4 with AVX2,
    whose 16 registers cannot hold 8 samples' sums and the operands); the transpose
    then reads the earlier passes' δ3 rows back from d3, and err and db2 are summed over
    the samples in the same order either way, so the bits do not depend on sg.
    Iteration i over all tiles prefetches like _hidden's k-th."""
    assert ns == 8 and ns % sg == 0, "the register transpose takes 8 rows"
    name = f"_output{ns}x{nv}{'m' if masked else ''}{suffix}"
    cs, pw = range(nv), L * pv
    src = [f"def {name}(a, ao, w, ldw, bias, K, pf, pfo, npf, x, xo, d3, do, zt, zto, err, db2, cmask,"
           " nval):",
           "    i = 0",
           f"    for c0 in range(0, ldw, {L * nv}):"]
    for r0 in range(0, ns, sg):
        rs = range(r0, r0 + sg)
        src += [f"        s{r}_{c} = vload(bias, c0 + {L * c})" for r in rs for c in cs]
        src += ["        for k in range(K):",
                "            if i < npf:",
                f"                prefetch(pf, pfo + {2 * L} * i)",
                f"                prefetch(pf, pfo + {2 * L} * i + {L})",
                "            i += 1",
                "            wb = k * ldw + c0",
                f"            ab = ao + k * {pw}"]
        src += [f"            w{c} = vload(w, wb + {L * c})" for c in cs]
        for r in rs:
            src.append(f"            b = vbcast(a, ab + {r})")
            src += [f"            s{r}_{c} = vfma(b, w{c}, s{r}_{c})" for c in cs]
        for c in cs:
            src += [f"        cc = c0 + {L * c}",
                    "        se = vload(err, cc)",
                    "        sd = vload(db2, cc)"]
            if masked:
                src.append("        mk = vload(cmask, cc)")
            for r in rs:
                src += [f"        y = vsigmoid(s{r}_{c})",
                        f"        d = vsub(y, vload(x, xo + {r} * ldw + cc))"]
                if masked:
                    src.append(f"        d = vmul(d, vmul(mk, vfill(x, 1.0 if {r} < nval else 0.0)))")
                src += ["        se = vfma(d, d, se)",
                        f"        t{r} = vmul(d, vfnma(y, y, y))",
                        f"        vstore(d3, do + {r} * ldw + cc, t{r})",
                        f"        sd = vadd(sd, t{r})"]
            if r0 + sg == ns:  # the last pass: the earlier passes' rows back from d3
                src += [f"        t{r} = vload(d3, do + {r} * ldw + cc)" for r in range(r0)]
                rows = ", ".join(f"t{r}" for r in range(ns))
                src.append(f"        store_transposed(zt, zto + cc * {pw}, {pw}, {rows})")
            src += ["        vstore(err, cc, se)",
                    "        vstore(db2, cc, sd)"]
    return name, "\n".join(src)


def _backward_source(rows, fold, L, pv, suffix):
    """e = δ3 W2ᵀ for hidden units n0 .. n0 + rows of a panel (x: the feature-major δ3
    panel, K rows; weights broadcast), then the hidden layer's backward epilogue: for
    j < h, s = a2 − a2² (a2 rows of the panel at ao; zero on padding lanes); folded: d2
    row j = δ2 = (e + k_j) s; split: d2 row j = e s and row ldw + j = s. db1 gets the
    row sums per lane."""
    name = f"_backward{rows}{'f' if fold else 's'}{suffix}"
    cols, pw = range(pv), L * pv
    src = [f"def {name}(w, ldw, n0, x, K, a2, ao, k, h, d2, do, db1, mask, mo):"]
    src += [f"    a{r}_{c} = vfill(x, 0.0)" for r in range(rows) for c in cols]
    src += ["    for kk in range(K):",
            f"        xb = kk * {pw}",
            "        wb = kk * ldw + n0"]
    src += _panel_fma(rows, L, pv)
    src += [f"    mk{c} = vload(mask, mo + {L * c})" for c in cols]
    for r in range(rows):
        src += [f"    j = n0 + {r}",
                "    if j < h:",
                f"        s1 = vload(db1, j * {L})",
                "        kj = vbcast(k, j)" if fold else f"        s2 = vload(db1, (ldw + j) * {L})"]
        for c in cols:
            src += [f"        y = vload(a2, ao + j * {pw} + {L * c})",
                    f"        s = vmul(vfnma(y, y, y), mk{c})"]
            if fold:
                src.append(f"        d = vmul(vadd(a{r}_{c}, kj), s)")
            else:
                src += [f"        d = vmul(a{r}_{c}, s)",
                        f"        vstore(d2, do + (ldw + j) * {pw} + {L * c}, s)",
                        "        s2 = vadd(s2, s)"]
            src += [f"        vstore(d2, do + j * {pw} + {L * c}, d)",
                    "        s1 = vadd(s1, d)"]
        src.append(f"        vstore(db1, j * {L}, s1)")
        if not fold:
            src.append(f"        vstore(db1, (ldw + j) * {L}, s2)")
    return name, "\n".join(src)


def _outer_source(nj, nv, L, pv, suffix):
    """A weight-gradient tile: acc[co + j·lda + Lc] += Σ_q Σ_s a[ao + q·sa + j·PW + s] ·
    b[bo + q·sb + s·ldb + Lc] for j < nj rows of panels (a broadcast per sample) and nv
    vectors of sample-major rows, over npan panels q of PW samples s: a sum over samples
    as outer products, the accumulators in registers; ``fresh``: acc holds nothing yet
    (the sums start from zero, so acc need not be cleared)."""
    name = f"_outer{nj}x{nv}{suffix}"
    src = [f"def {name}(a, ao, sa, b, bo, sb, ldb, npan, acc, co, lda, fresh):"]
    src += [f"    s{j}_{c} = vfill(b, 0.0) if fresh else vload(acc, co + {j} * lda + {L * c})"
            for j in range(nj) for c in range(nv)]
    src += ["    for q in range(npan):",
            "        aq = ao + q * sa",
            "        bq = bo + q * sb",
            f"        for s in range({L * pv}):",
            "            bs = bq + s * ldb"]
    src += [f"            b{c} = vload(b, bs + {L * c})" for c in range(nv)]
    for j in range(nj):
        src.append(f"            w = vbcast(a, aq + {j * L * pv} + s)")
        src += [f"            s{j}_{c} = vfma(w, b{c}, s{j}_{c})" for c in range(nv)]
    src += [f"    vstore(acc, co + {j} * lda + {L * c}, s{j}_{c})"
            for j in range(nj) for c in range(nv)]
    return name, "\n".join(src)


def _define(name_source):
    """Compile generated source as if written in this file (so Numba caches it here)."""
    return define(*name_source, globals(), __file__)


def _tile(generate, *shape):
    """One tile for both precisions: its float64 and float32 kernels (generated with 8 and
    16 lanes), and a name that calls the one of its first argument's precision (inlined
    where it is called, so that a tile costs one call)."""
    f64, f32 = generate(*shape, LANES, PV, ""), generate(*shape, 2 * LANES, PV32[ISA], "_f32")
    by_dtype = {types.float64: _define(f64), types.float32: _define(f32)}
    params = f64[1].split("\n", 1)[0].partition("(")[2].rstrip("):")  # the generated def's
    scope = {}
    # Numba inlines an overload only where its parameters are named, not *args
    exec(f"def tile({params}):\n    pass\n"  # noqa: S102  (aepar's own generated source)
         f"def choose({params}):\n"
         f"    kernel = by_dtype.get(getattr({params.split(',')[0]}, 'dtype', None))\n"
         f"    if kernel is not None:\n"
         f"        return lambda {params}: kernel({params})\n", {"by_dtype": by_dtype}, scope)
    tile = scope["tile"]
    tile.__doc__ = generate.__doc__
    overload(tile, inline="always")(scope["choose"])
    return tile


hidden_tile = _tile(_hidden_source, RH)
output_full = _tile(_output_source, SB, TB, False, SG)
output_masked = _tile(_output_source, SB, TB, True, SG)
backward_fold = _tile(_backward_source, RH, True)
backward_split = _tile(_backward_source, RH, False)
outer_tile = _tile(_outer_source, OJ, OV)
