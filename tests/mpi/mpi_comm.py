"""Per-rank checks of aepar.comm; asserts results that hold at every size."""
import aepar  # noqa: F401  (threads before numpy)
import numpy as np

from aepar.comm import world
from aepar.errors import UserError
from aepar.parallel.blocks import TreeSum
from aepar.rows import block_bounds, rank_blocks, tree_sum


class FakeDeviceArray:
    """Stands in for a CuPy array: has __cuda_array_interface__, get() and set()."""

    __cuda_array_interface__ = {}

    def __init__(self, host):
        self.host = host

    def get(self):
        return self.host.copy()

    def set(self, host):
        self.host[...] = host


comm = world()
r, n = comm.rank, comm.size

# bcast overwrites every non-root buffer with the root's
buf = np.full(5, float(r))
comm.Bcast(buf, root=0)
assert np.all(buf == 0.0), buf
if n > 1:
    buf = np.full(3, float(r))
    comm.Bcast(buf, root=n - 1)
    assert np.all(buf == n - 1)

# allreduce: sum of ranks, any size
buf = np.arange(4, dtype=np.float64) + r
comm.Allreduce(buf)
assert np.allclose(buf, n * np.arange(4) + n * (n - 1) / 2), buf
buf = np.array([r], dtype=np.int64)
comm.Allreduce(buf, op="max")
assert buf[0] == n - 1

# reduce: the root gets the sum, other ranks' input is not mutated
mine = np.full(6, r + 1.0)
out = comm.Reduce(mine, root=0)
if comm.is_root:
    assert np.allclose(out, n * (n + 1) / 2)
else:
    assert out is None and np.all(mine == r + 1.0)

# sub-communicators: even/odd ranks
sub = comm.split(r % 2)
assert sub.size == len([q for q in range(n) if q % 2 == r % 2])
val = np.array([1.0])
sub.Allreduce(val)
assert val[0] == sub.size

# point to point ring with non-blocking requests
if n > 1:
    send = np.full(8, float(r))
    recv = np.empty(8)
    rreq = comm.Irecv(recv, source=(r - 1) % n, tag=7)
    sreq = comm.Isend(send, dest=(r + 1) % n, tag=7)
    sreq.wait()
    rreq.wait()
    assert np.all(recv == (r - 1) % n)

# host staging of device buffers (CUDA-aware MPI absent)
dev = FakeDeviceArray(np.full(4, float(r)))
comm.Bcast(dev, root=0)
assert np.all(dev.host == 0.0)
dev = FakeDeviceArray(np.ones(4))
comm.Allreduce(dev)
assert np.all(dev.host == n)

# agree: a UserError raised on one rank is raised on every rank
try:
    comm.agree(lambda: (_ for _ in ()).throw(UserError("bad on last rank")) if r == n - 1 else 1)
    raise AssertionError("agree did not raise")
except UserError as exc:
    assert "bad on last rank" in str(exc) and exc.collective

# blocks cover the samples exactly, sizes differ by at most one
for total in (n, 7 * n + 3, 1003):
    bounds = block_bounds(total, n)
    assert bounds[0] == 0 and bounds[-1] == total
    sizes = np.diff(bounds)
    assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1

# the fixed-tree sum: the same bits as one process adding all blocks, for every block count
for count in sorted({n, n + 1, 2 * n + 3, 8, 13}):
    if count < n:
        continue
    rng = np.random.default_rng(count)
    every = [rng.standard_normal(7) * 10.0 ** rng.integers(-8, 8) for _ in range(count)]
    want = tree_sum([v.copy() for v in every])
    first, stop = rank_blocks(count, r, n)
    mine = [every[b].copy() for b in range(first, stop)]
    out = np.empty(7)
    TreeSum(comm, count).allreduce([v.copy() for v in mine], out)
    assert np.array_equal(out, want), (count, out - want)
    got = TreeSum(comm, count).reduce([v.copy() for v in mine])
    assert (np.array_equal(got, want) if comm.is_root else got is None), count
    # the rows of one array (each node added a level at a time): the same bits
    out = np.empty(7)
    TreeSum(comm, count).allreduce(np.stack(mine), out)
    assert np.array_equal(out, want), (count, out - want)
    got = TreeSum(comm, count).reduce(np.stack(mine))
    assert (np.array_equal(got, want) if comm.is_root else got is None), count

# long vectors (from blocks.HALVING_BYTES): a power-of-two number of ranks with one node each
# take the halving exchange, the others the tree and the Bcast; the same bits either way,
# on every rank (an odd length splits unevenly at every level)
for count in sorted({n, 2 * n, 8, 16, 6}):
    if count < n:
        continue
    share = count // n
    tree = TreeSum(comm, count)
    assert tree.butterfly == (n > 1 and n & (n - 1) == 0 and count % n == 0 and share & (share - 1) == 0), count
    rng = np.random.default_rng(100 + count)
    every = [rng.standard_normal(20001) * 10.0 ** rng.integers(-8, 8, 20001) for _ in range(count)]
    want = tree_sum([v.copy() for v in every])
    first, stop = rank_blocks(count, r, n)
    out = np.empty(20001)
    tree.allreduce(np.stack([every[b] for b in range(first, stop)]), out)
    assert np.array_equal(out, want), (count, np.flatnonzero(out != want)[:5])
    assert all(np.array_equal(out, o) for o in comm.allgather(out)), count

print(f"ok rank {r} of {n}", flush=True)
