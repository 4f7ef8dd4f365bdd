"""Uniform noise as NumPy's PCG64 generators draw it, made by a compiled loop (Numba).

``uniform_rows(rngs, starts, out)`` gives :func:`kernels.ref.draws.uniform_rows`' numbers
and leaves every generator where that function would. NumPy draws each float32 through a
call of the bit generator; here the 128-bit LCG steps inline, two generators side by side
so that the core overlaps their multiplies, each output kept in a scratch row, and the
floats made from the scratch in a pass that vectorises (docs/performance-notes.md).

The states are read and written where NumPy keeps them (``bit_generator.ctypes.
state_address``: NumPy's ``pcg64_state``, a pointer to the 128-bit state and increment,
low word first, then the flag and value of the buffered half-output). That layout is
NumPy's, not a public interface, so the first call checks it: generators drawn both ways
(one with a buffered half) must give the same numbers and leave the same states, or
this set draws through NumPy as the reference does (another NumPy, a platform without
128-bit integers, whose PCG64 keeps the high word first). Generators other than PCG64
are drawn through NumPy too. See :mod:`kernels.ref.draws` for the arithmetic.
"""
import threading

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ..ref.draws import MULT, check_uniform_rows, uniform_rows as _numpy_rows

__all__ = ["uniform_rows"]

_I128, _I64, _I32 = ir.IntType(128), ir.IntType(64), ir.IntType(32)


@intrinsic
def _load_u64(typingctx, addr):
    """The uint64 at address ``addr``."""
    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], _I64.as_pointer()))
    return types.uint64(types.intp), codegen


@intrinsic
def _store_u64(typingctx, addr, value):
    def codegen(context, builder, signature, args):
        builder.store(args[1], builder.inttoptr(args[0], _I64.as_pointer()))
    return types.void(types.intp, types.uint64), codegen


@intrinsic
def _load_u32(typingctx, addr):
    """The uint32 at address ``addr``, widened."""
    def codegen(context, builder, signature, args):
        return builder.zext(builder.load(builder.inttoptr(args[0], _I32.as_pointer())), _I64)
    return types.uint64(types.intp), codegen


@intrinsic
def _store_u32(typingctx, addr, value):
    def codegen(context, builder, signature, args):
        builder.store(builder.trunc(args[1], _I32), builder.inttoptr(args[0], _I32.as_pointer()))
    return types.void(types.intp, types.uint64), codegen


@intrinsic
def _lcg_step(typingctx, lo, hi, inc_lo, inc_hi):
    """(lo, hi) of MULT s + inc (mod 2**128), s = hi 2**64 + lo: one 128-bit multiply."""
    def codegen(context, builder, signature, args):
        def wide(lo, hi):
            return builder.or_(builder.shl(builder.zext(hi, _I128), ir.Constant(_I128, 64)), builder.zext(lo, _I128))
        s = builder.add(builder.mul(wide(args[0], args[1]), ir.Constant(_I128, MULT)), wide(args[2], args[3]))
        low, high = builder.trunc(s, _I64), builder.trunc(builder.lshr(s, ir.Constant(_I128, 64)), _I64)
        return context.make_tuple(builder, signature.return_type, (low, high))
    return types.UniTuple(types.uint64, 2)(types.uint64, types.uint64, types.uint64, types.uint64), codegen


_SCALE = np.float32(2.0 ** -24)


@njit(cache=True, nogil=True, inline="always")
def _output(lo, hi):
    """PCG64's XSL-RR output of the state it has just stepped to."""
    x = hi ^ lo
    r = hi >> np.uint64(58)
    return (x >> r) | (x << ((np.uint64(64) - r) & np.uint64(63)))


@njit(cache=True, nogil=True, inline="always")
def _unit(u32):
    """NumPy's float32 of 32 random bits: the top 24 of them times 2**-24 (24 bits: the
    conversion from int32 is exact)."""
    return np.float32(np.int32(u32 >> np.uint64(8))) * _SCALE


@njit(cache=True, nogil=True, inline="always")
def _start(state_address, n):
    """A generator about to draw ``n`` numbers: (its pointer to state and increment, the
    state's words, the increment's words, its buffered flag and half, whether the first
    number is that half, the outputs it steps for the rest)."""
    pcg = np.intp(_load_u64(state_address))
    buffered, kept = _load_u32(state_address + 8), _load_u32(state_address + 12)
    take = buffered != 0 and n > 0
    fresh = n - 1 if take else n
    return (pcg, _load_u64(pcg), _load_u64(pcg + 8), _load_u64(pcg + 16), _load_u64(pcg + 24),
            buffered, kept, take, (fresh + 1) // 2)


@njit(cache=True, nogil=True, inline="always")
def _finish(dst, state_address, pcg, s_lo, s_hi, buffered, kept, take, outputs, scratch):
    """The numbers into ``dst`` (the buffered half first, if taken, then the scratch's
    outputs' halves, low then high, as NumPy takes them: the order they lie in memory),
    then the generator's state as NumPy leaves it: the last output's high half kept (and
    buffered if the count of fresh halves was odd)."""
    first = 1 if take else 0
    if take:
        dst[0] = _unit(kept)
        buffered = np.uint64(0)
    fresh = dst.size - first
    halves = scratch.view(np.uint32)
    for j in range(fresh):
        dst[first + j] = _unit(np.uint64(halves[j]))
    if outputs > 0:
        kept = scratch[outputs - 1] >> np.uint64(32)
        buffered = np.uint64(fresh % 2)
    _store_u64(pcg, s_lo)
    _store_u64(pcg + 8, s_hi)
    _store_u32(state_address + 8, buffered)
    _store_u32(state_address + 12, kept)


@njit(cache=True, nogil=True)
def _fill_rows(out, starts, addresses):
    """Rows starts[b]:starts[b + 1] of ``out`` from the generator at addresses[b], the
    generators two at a time (an odd one out paired with nothing: no rows, no steps, its
    state not written)."""
    flat, width = out.reshape(-1), out.shape[1]
    most = 0
    for b in range(addresses.size):
        most = max(most, (starts[b + 1] - starts[b]) * width)
    scratch = np.empty((2, most // 2 + 1), np.uint64)
    a_out, b_out = scratch[0], scratch[1]
    for b in range(0, addresses.size, 2):
        pair = b + 1 < addresses.size
        a_dst = flat[starts[b] * width:starts[b + 1] * width]
        b_dst = flat[starts[b + 1] * width:starts[b + 2] * width] if pair else a_dst[:0]
        b_addr = addresses[b + 1] if pair else addresses[b]
        a_pcg, a_lo, a_hi, a_ilo, a_ihi, a_buf, a_kept, a_take, a_steps = _start(addresses[b], a_dst.size)
        b_pcg, b_lo, b_hi, b_ilo, b_ihi, b_buf, b_kept, b_take, b_steps = _start(b_addr, b_dst.size)
        both = min(a_steps, b_steps)
        for j in range(both):  # two independent chains of multiplies
            a_lo, a_hi = _lcg_step(a_lo, a_hi, a_ilo, a_ihi)
            b_lo, b_hi = _lcg_step(b_lo, b_hi, b_ilo, b_ihi)
            a_out[j] = _output(a_lo, a_hi)
            b_out[j] = _output(b_lo, b_hi)
        for j in range(both, a_steps):
            a_lo, a_hi = _lcg_step(a_lo, a_hi, a_ilo, a_ihi)
            a_out[j] = _output(a_lo, a_hi)
        for j in range(both, b_steps):
            b_lo, b_hi = _lcg_step(b_lo, b_hi, b_ilo, b_ihi)
            b_out[j] = _output(b_lo, b_hi)
        _finish(a_dst, addresses[b], a_pcg, a_lo, a_hi, a_buf, a_kept, a_take, a_steps, a_out)
        if pair:
            _finish(b_dst, b_addr, b_pcg, b_lo, b_hi, b_buf, b_kept, b_take, b_steps, b_out)


def _addresses(rngs):
    """Where each generator keeps its state; None unless every one is a PCG64."""
    if not all(type(rng.bit_generator) is np.random.PCG64 for rng in rngs):
        return None
    return np.array([rng.bit_generator.ctypes.state_address for rng in rngs], dtype=np.intp)


def same_as_numpy() -> bool:
    """Whether this NumPy keeps PCG64's state as :func:`_fill_rows` reads it: three
    generators (one with a buffered half) and their twins drawn by both, every number and
    every state left behind equal."""
    try:
        ours = [np.random.Generator(np.random.PCG64(seed)) for seed in (20260, 20261, 20262)]
        ours[0].random(dtype=np.float32)
        twins = [np.random.Generator(np.random.PCG64()) for _ in ours]
        for twin, rng in zip(twins, ours):
            twin.bit_generator.state = rng.bit_generator.state
        starts = np.array([0, 3, 8, 9])
        got, want = np.empty((9, 5), np.float32), np.empty((9, 5), np.float32)
        _fill_rows(got, starts, _addresses(ours))
        _numpy_rows(twins, starts, want)
        return (np.array_equal(got.view(np.uint32), want.view(np.uint32))
                and all(a.bit_generator.state == b.bit_generator.state for a, b in zip(ours, twins)))
    except Exception:  # noqa: BLE001  (whatever went wrong: NumPy draws)
        return False


_CHECKED = []  # same_as_numpy(), once a process (the first of the threads that get here)
_CHECKING = threading.Lock()


def uniform_rows(rngs, starts, out):
    """Rows ``starts[i]:starts[i+1]`` of ``out`` (float32, C-contiguous) from ``rngs[i]``,
    as ``rngs[i].random(out=..., dtype=np.float32)``; returns ``out``."""
    check_uniform_rows(rngs, starts, out)
    if not _CHECKED:
        with _CHECKING:
            if not _CHECKED:
                _CHECKED.append(same_as_numpy())
    addresses = _addresses(rngs) if _CHECKED[0] else None
    if addresses is None:
        return _numpy_rows(rngs, starts, out)
    _fill_rows(out, np.asarray(starts, dtype=np.int64), addresses)
    return out
