"""Data parallelism: shards of the samples per rank, gradients summed in one packed
collective per step."""
from __future__ import annotations


def shard(n: int, rank: int, size: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` samples; sizes differ by at most one."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


class GradientPacker:
    """One flat buffer for a list of gradient arrays, so a step costs one Allreduce.

    ``pack`` copies the gradients into the buffer, ``allreduce`` sums it over ranks,
    ``unpack`` copies the sums back. The buffer is allocated once.
    """

    def __init__(self, be, arrays: list):
        self.be = be
        self.shapes = [a.shape for a in arrays]
        self.sizes = [a.size for a in arrays]
        self.buffer = be.xp.empty(sum(self.sizes), dtype=arrays[0].dtype)

    def allreduce(self, comm, arrays: list, extra=None):
        """Sum ``arrays`` (and optional flat ``extra`` scalars) over ``comm`` in place.

        Returns the summed ``extra`` values (a host NumPy array) or None.
        """
        if comm.size == 1:
            return None if extra is None else self.be.to_host(self.be.xp.asarray(extra))
        xp = self.be.xp
        buf = self.buffer if extra is None else xp.empty(self.buffer.size + len(extra), self.buffer.dtype)
        offset = 0
        for a, n in zip(arrays, self.sizes):
            buf[offset:offset + n] = a.reshape(-1)
            offset += n
        if extra is not None:
            buf[offset:] = xp.asarray(extra, dtype=buf.dtype)
        comm.allreduce(buf)
        offset = 0
        for a, n in zip(arrays, self.sizes):
            a.reshape(-1)[...] = buf[offset:offset + n]
            offset += n
        return None if extra is None else self.be.to_host(buf[offset:])
