"""Uniform noise exactly as NumPy's PCG64 generators draw it, block by block.

``uniform_rows(rngs, starts, out)`` fills rows ``starts[i]:starts[i+1]`` of the float32
array ``out`` with ``rngs[i].random(dtype=np.float32)`` and leaves each generator where
that call would. This set draws on the host; a set whose arrays live elsewhere (the GPU)
makes the same numbers there from the generators' states, with the arithmetic below.

PCG64 (O'Neill's XSL-RR 128/64, NumPy's default bit generator): the state is a 128-bit
LCG, s' = MULT * s + inc (mod 2**128), and each step outputs the 64 bits
rotr(hi(s') ^ lo(s'), s' >> 122). A float32 takes 32 bits: the low half of an output,
then its high half (NumPy keeps the high half in ``uinteger`` with ``has_uint32`` set
until the next draw); the float is (u >> 8) * 2**-24. Jumping n steps ahead is the LCG
raised to the n-th power: s_n = A_n * s + C_n, found by squaring in O(log n).

A set that draws elsewhere reads each generator's state before its draws and moves it on
after them, every step and block, on the host's path of a GPU step. Rather than through
``bit_generator.state`` (a dict made and parsed each time), :func:`pcg64_state` and
:func:`pcg64_skip` read and write the words where NumPy keeps them
(``bit_generator.ctypes.state_address``: a pointer to the 128-bit state and increment, low
word first, then the buffered half's flag and value), through NumPy views kept per
generator (:func:`pcg64_kept`). That layout is NumPy's, not a public interface: the first
use checks it against the dict (:func:`_views_match`), and the dict is used wherever it
differs.
"""
import ctypes
import functools

import numpy as np

__all__ = ["uniform_rows"]

MULT = 0x2360ED051FC65DA44385DF649FCCF645  # PCG's default 128-bit multiplier (NumPy's PCG64)
MASK = (1 << 128) - 1


def uniform_rows(rngs, starts, out):
    """Rows ``starts[i]:starts[i+1]`` of ``out`` (float32, C-contiguous) from ``rngs[i]``,
    as ``rngs[i].random(out=..., dtype=np.float32)``; returns ``out``."""
    check_uniform_rows(rngs, starts, out)
    for lo, hi, rng in zip(starts[:-1], starts[1:], rngs):
        rng.random(out=out[lo:hi], dtype=np.float32)
    return out


def check_uniform_rows(rngs, starts, out):
    if out.ndim != 2 or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"uniform_rows: out must be a C-contiguous float32 matrix, not {out.dtype} {out.shape}")
    starts = starts.tolist() if isinstance(starts, np.ndarray) else list(starts)  # a few offsets: Python's loop
    if len(starts) != len(rngs) + 1 or starts[0] != 0 or starts[-1] != out.shape[0] \
            or any(b < a for a, b in zip(starts[:-1], starts[1:])):
        raise ValueError(f"uniform_rows: starts {list(starts)} do not split {out.shape[0]} rows among "
                         f"{len(rngs)} generators")


@functools.lru_cache(maxsize=256)  # a run skips its streams by the same few counts, step after step
def jump(n: int, inc: int) -> tuple[int, int]:
    """(A, C) with s_{k+n} = A * s_k + C (mod 2**128) for the LCG of increment ``inc``."""
    acc_mult, acc_plus, mult, plus = 1, 0, MULT, inc
    while n:
        if n & 1:
            acc_mult = acc_mult * mult & MASK
            acc_plus = (acc_plus * mult + plus) & MASK
        plus = (mult + 1) * plus & MASK
        mult = mult * mult & MASK
        n >>= 1
    return acc_mult, acc_plus


def output(s: int) -> int:
    """The 64 bits PCG64 outputs for the state ``s`` it has just stepped to."""
    x = ((s >> 64) ^ s) & 0xFFFFFFFFFFFFFFFF
    r = s >> 122
    return ((x >> r) | (x << (64 - r))) & 0xFFFFFFFFFFFFFFFF


def pcg64_state(rng):
    """(state, inc, buffered, uinteger) of a Generator on PCG64; None for other bit generators."""
    kept = pcg64_kept(rng)
    if kept is not None:
        (lo, hi, inc_lo, inc_hi), (buffered, uinteger) = kept[1].tolist(), kept[2].tolist()
        return hi << 64 | lo, inc_hi << 64 | inc_lo, buffered, uinteger
    st = rng.bit_generator.state
    if st.get("bit_generator") != "PCG64":
        return None
    return st["state"]["state"], st["state"]["inc"], int(st["has_uint32"]), int(st["uinteger"])


def pcg64_skip(rng, count: int, state=None) -> None:
    """Leave ``rng`` (PCG64) where drawing ``count`` float32 uniforms would; ``state``: its
    :func:`pcg64_state`, when the caller has read it already."""
    state, inc, buffered, uinteger = state or pcg64_state(rng)
    if count <= 0:
        return
    fresh = count - buffered  # 32-bit halves taken from new outputs
    steps = (fresh + 1) // 2
    if steps:
        a, c = jump(steps, inc)
        state = (a * state + c) & MASK
        uinteger = output(state) >> 32  # NumPy keeps the last output's high half, used or not
    kept = pcg64_kept(rng)
    if kept is not None:
        kept[1][:2] = state & _WORD, state >> 64
        kept[2][:] = fresh % 2, uinteger
        return
    rng.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc},
                               "has_uint32": fresh % 2, "uinteger": uinteger}


def pcg64_kept(rng):
    """(the bit generator, a uint64 view of its words [state lo, hi, inc lo, hi], a uint32
    view of its buffered flag and half) of a Generator on PCG64, kept per bit generator (the
    entry holds it, so its id is not reused while kept); None for another bit generator,
    or where NumPy keeps them otherwise (:func:`_views_match`)."""
    bit_generator = rng.bit_generator
    kept = _VIEWS.get(id(bit_generator))
    if kept is not None and kept[0] is bit_generator:
        return kept
    if type(bit_generator) is not np.random.PCG64 or not _views_match():
        return None
    if len(_VIEWS) >= KEEP_VIEWS:
        _VIEWS.pop(next(iter(_VIEWS)))  # the oldest
    kept = _VIEWS[id(bit_generator)] = (bit_generator, *_views_of(bit_generator))
    return kept


_WORD = (1 << 64) - 1
KEEP_VIEWS = 1024  # generators whose views are kept (a run's blocks' streams, epoch after epoch)
_VIEWS: dict = {}  # id(bit generator) -> pcg64_kept's (the bit generator, its words, its flag and half)


def _views_of(bit_generator):
    address = bit_generator.ctypes.state_address
    pcg = ctypes.c_void_p.from_address(address).value
    return (np.ctypeslib.as_array((ctypes.c_uint64 * 4).from_address(pcg)),
            np.ctypeslib.as_array((ctypes.c_uint32 * 2).from_address(address + 8)))


@functools.cache  # once a process (two threads at once would each find the same)
def _views_match() -> bool:
    """Whether this NumPy keeps PCG64's words as :func:`_views_of` reads them: a generator
    with a buffered half read through the views gives its dict's values, and one moved
    on through them reads in its dict as moved on."""
    try:
        rng = np.random.Generator(np.random.PCG64(20261205))
        rng.random(3, dtype=np.float32)  # a buffered half
        words, flags = _views_of(rng.bit_generator)
        st = rng.bit_generator.state
        lo, hi, inc_lo, inc_hi = words.tolist()
        if ((hi << 64 | lo, inc_hi << 64 | inc_lo, *flags.tolist())
                != (st["state"]["state"], st["state"]["inc"], st["has_uint32"], st["uinteger"])):
            return False
        words[:2], flags[:] = (5, 7), (0, 9)
        st = rng.bit_generator.state
        return (st["state"]["state"], st["has_uint32"], st["uinteger"]) == (7 << 64 | 5, 0, 9)
    except Exception:  # noqa: BLE001  (whatever went wrong: the dict)
        return False
