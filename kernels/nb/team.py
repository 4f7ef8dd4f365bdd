"""Helper threads that wait for work in compiled code: the fork-join of kernels whose
shares are short and come often (a sparse autoencoder's evaluation runs two rounds of
shares a few hundred microseconds long, hundreds of times a second).

A hand-off through Python (a lock released, then the interpreter lock taken by the woken
thread and given back) costs tens of microseconds a share on a VM, and every helper's
Python runs one after another under the interpreter lock. Here each helper loops in a
compiled ``serve`` function (written by the kernel family that uses the team, from
:func:`wait_for_work` and :func:`finish`): it spins on its slot of a shared int64 array,
runs its share without the interpreter lock and counts it done; the caller posts the
work, runs its own share and spins until every helper's count has moved. A helper that
finds no work for :data:`SPIN_NS` parks on a Python lock (so it burns no core while
the program does other things) and is woken through it; where the helpers and the caller
outnumber this process's cores, nobody spins.

The shares' arithmetic is the same whichever thread runs them, so the results are those
of running the shares one after another.
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np
from llvmlite import binding as ll
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..memory import zeros

__all__ = ["Team", "shared", "forget", "wait_for_work", "finish", "PARK", "STOP", "REBIND", "SPIN_NS"]

SLOT = 16                       # int64s per helper: two cache lines, none shared with another
STATE, OP, DONE = 0, 1, 2       # a slot's words
IDLE, PARKED, POSTED = 0, 1, 2  # its states
PARK, STOP, REBIND = 0, -1, -2  # what serve returns to the helper's Python (jobs are > 0)
SPIN_NS = 1_000_000             # how long a helper waits spinning before it parks
YIELD_NS = 30_000               # a caller spinning longer yields its core on each look
_CLOCK_MONOTONIC = 6 if sys.platform == "darwin" else 1
_X86 = ll.get_process_triple().startswith(("x86_64", "i386", "i686"))


def _slot_ptr(context, builder, sig, args):
    ary = context.make_array(sig.args[0])(context, builder, value=args[0])
    return cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]])


def _int64_array(a):
    return isinstance(a, types.Array) and a.dtype == types.int64 and a.ndim == 1


@intrinsic
def _load(typingctx, a, i):
    """a[i], read with acquire order (each look reads memory again)."""
    if not (_int64_array(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_slot_ptr(context, builder, sig, args), "acquire", 8)

    return types.int64(a, i), codegen


@intrinsic
def _store(typingctx, a, i, v):
    """a[i] = v with release order: what was written before is seen with it."""
    if not (_int64_array(a) and isinstance(i, types.Integer) and v == types.int64):
        return None

    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _slot_ptr(context, builder, sig, args), "release", 8)
        return context.get_dummy_value()

    return types.none(a, i, v), codegen


@intrinsic
def _swap_if(typingctx, a, i, expected, new):
    """a[i] = new if a[i] == expected, atomically; returns what a[i] held."""
    if not (_int64_array(a) and isinstance(i, types.Integer) and expected == types.int64 and new == types.int64):
        return None

    def codegen(context, builder, sig, args):
        pair = builder.cmpxchg(_slot_ptr(context, builder, sig, args), args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return types.int64(a, i, expected, new), codegen


@intrinsic
def _now_ns(typingctx):
    """CLOCK_MONOTONIC in nanoseconds, from the C library's clock_gettime (through the
    vDSO on Linux: no system call)."""
    def codegen(context, builder, sig, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        spec = cgutils.alloca_once(builder, ir.LiteralStructType([i64, i64]))  # struct timespec
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32, spec.type]), "clock_gettime")
        builder.call(fn, [ir.Constant(i32, _CLOCK_MONOTONIC), spec])
        sec = builder.load(cgutils.gep_inbounds(builder, spec, 0, 0))
        nsec = builder.load(cgutils.gep_inbounds(builder, spec, 0, 1))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)

    return types.int64(), codegen


@intrinsic
def _pause(typingctx):
    """The spin-wait hint (x86's pause): the spinning thread leaves the core's resources
    to the other; nothing where there is none."""
    def codegen(context, builder, sig, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def _sched_yield(typingctx):
    """The C library's sched_yield: another runnable thread of this core goes first."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@njit(cache=True, nogil=True)
def wait_for_work(ctrl, k, budget):
    """Helper k's wait: the op posted to it (> 0 a job, < 0 for its Python), or PARK once
    ``budget`` nanoseconds passed without one (the slot is then PARKED, and the
    caller wakes it through its lock)."""
    at = k * SLOT
    start = _now_ns()
    while True:
        if _load(ctrl, at + STATE) == POSTED:
            return _load(ctrl, at + OP)
        if _now_ns() - start > budget and _swap_if(ctrl, at + STATE, IDLE, PARKED) == IDLE:
            return PARK
        _pause()


@njit(cache=True, nogil=True)
def finish(ctrl, k):
    """Helper k's share is done: its slot is IDLE (open to the next post) before its count
    moves, so the caller that sees the count can post again at once."""
    at = k * SLOT
    _store(ctrl, at + STATE, IDLE)
    _store(ctrl, at + DONE, _load(ctrl, at + DONE) + 1)


@njit(cache=True, nogil=True)
def _post(ctrl, k, op):
    """Hands ``op`` to helper k; True if it was parked (its lock must be released)."""
    at = k * SLOT
    _store(ctrl, at + OP, op)
    if _swap_if(ctrl, at + STATE, IDLE, POSTED) == PARKED:
        _store(ctrl, at + STATE, POSTED)
        return True
    return False


@njit(cache=True, nogil=True)
def _join(ctrl, expected):
    """Spins until helper k's count reaches expected[k], for every k; past YIELD_NS
    each look yields the core (helpers that share it with the caller get to run)."""
    start = _now_ns()
    for k in range(expected.size):
        while _load(ctrl, k * SLOT + DONE) < expected[k]:
            if _now_ns() - start > YIELD_NS:
                _sched_yield()
            else:
                _pause()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Team:
    """``size`` helper threads, each looping in ``serve(ctrl, k, budget, *args[k])``.

    ``serve`` is a compiled loop: ``op = wait_for_work(ctrl, k, budget)``; a job (op > 0)
    runs and is followed by ``finish(ctrl, k)``; anything else is returned. :meth:`run`
    posts a job to every helper and runs the caller's own share with ``job``. The
    arguments each helper's loop holds are set with :meth:`bind` (a hand-off through
    Python, so callers bind once and run many times). A share that raises is raised by
    :meth:`run` once every share has ended.
    """

    def __init__(self, size: int, serve, job):
        self.size, self.serve, self.job = int(size), serve, job
        self.ctrl = zeros(SLOT * self.size, np.int64)  # each slot from a cache line's start
        self.ctrl[STATE:SLOT * self.size:SLOT] = PARKED
        self.budget = SPIN_NS if self.size + 1 <= _usable_cores() else 0
        self.busy = threading.Lock()  # one run at a time
        self.args = [None] * self.size
        self.bound = None  # what the caller bound last (its own token of the args)
        self.errors = [None] * self.size
        self._wake = [threading.Lock() for _ in range(self.size)]
        self._posted = np.zeros(self.size, np.int64)  # jobs and binds posted to each helper
        self.closed = False
        self.threads = [threading.Thread(target=self._help, args=(k,), name=f"aepar-team-{k + 1}", daemon=True)
                        for k in range(self.size)]
        for k, thread in enumerate(self.threads):
            self._wake[k].acquire()
            thread.start()

    def _help(self, k):
        self._wake[k].acquire()  # every slot starts PARKED: the first bind wakes it
        while True:
            if self.args[k] is None:  # woken without arguments: closed before any bind
                finish(self.ctrl, k)
                return
            try:
                op = self.serve(self.ctrl, k, self.budget, *self.args[k])
            except BaseException as exc:  # the share raised: handed to run(), which raises it
                self.errors[k] = exc
                finish(self.ctrl, k)
                continue
            if op == PARK:
                self._wake[k].acquire()
                continue
            if op == STOP:
                self.args[k] = None  # its arrays go with it
                finish(self.ctrl, k)
                return
            finish(self.ctrl, k)  # REBIND, acknowledged

    def holds(self, token) -> bool:
        """Whether the arguments bound last came with ``token`` (the same objects one by one)."""
        return (self.bound is not None and len(self.bound) == len(token)
                and all(a is b for a, b in zip(self.bound, token)))

    def _post_all(self, op):
        for k in range(self.size):
            if _post(self.ctrl, k, op):
                self._wake[k].release()
        self._posted += 1

    def bind(self, args: list, token=None):
        """Helper k's loop holds ``args[k]`` (a tuple) from now on; ``token`` is kept as
        :attr:`bound`, for the caller to tell whether its args are the ones bound."""
        self.args, self.bound = list(args), token
        self._post_all(REBIND)
        _join(self.ctrl, self._posted)

    def run(self, op: int, own: tuple):
        """Job ``op`` on every helper and ``job(op, *own)`` on this thread; returns when
        all are done."""
        if self.size and self.args[0] is None:
            raise RuntimeError("Team.run: bind() the helpers' arguments first")
        self._post_all(op)
        try:
            self.job(op, *own)
        finally:  # nobody writes into shared buffers when an error goes up
            _join(self.ctrl, self._posted)
            raised = [exc for exc in self.errors if exc is not None]
            self.errors = [None] * self.size
        if raised:
            raise raised[0]

    def close(self):
        """Ends the helpers (the team is not used again)."""
        if not self.closed:
            self.closed = True
            self._post_all(STOP)


_TEAMS: dict = {}


def shared(size: int, serve, job) -> Team | None:
    """This process's team of ``size`` helpers for ``serve`` and ``job``, made on first
    use (and made again for another size); None while the old one is in use."""
    team = _TEAMS.get((serve, job))
    if team is not None and (team.size != size or team.closed):
        if not team.busy.acquire(blocking=False):
            return None
        team.close()
        team.busy.release()
        team = None
    if team is None:
        team = _TEAMS[(serve, job)] = Team(size, serve, job)
    return team


def forget(token) -> None:
    """Ends the shared team whose helpers hold the arguments bound with ``token`` (the
    same objects one by one), so that their arrays can be freed; a team in use is left."""
    for key, team in list(_TEAMS.items()):
        if team.holds(token) and team.busy.acquire(blocking=False):
            try:
                team.close()
                team.bound = None
                del _TEAMS[key]
            finally:
                team.busy.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_TEAMS.clear)  # their threads are not in the child
