"""The hand-over between pipeline stages on different ranks: links, messages, receiving end.

Modes: ``"data"`` sends the transformed rows h = transform(x) from the producer's replicas
to the overlapping rows of the consumer's replicas; ``"weights"`` sends the parameters
(W, b_h) of every layer below (the chain that made the version) and the consumer
recomputes its input from its own copy of x, reusing the activations of the unchanged
bottom of the chain. Both give identical inputs. Every version also carries the (W, b_h)
snapshots of its chain, which is what a checkpoint needs to rebuild it.

A message is a small int64 header (kind, version, stop, chain length, then (layer,
version) per chain element) and then, for a version, one payload: the rows (train, then
val) in data mode, then the chain's (W, b_h) flattened. Transport: non-blocking
Isend/Irecv through aepar.comm (:class:`aepar.parallel.executor.Pipeline` polls them).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from aepar.comm import TAG_HDR, TAG_PAY
from aepar.rows import Blocks, Shard

# message kinds; one (source, destination) pair carries one stage boundary only, so the
# tags of aepar.comm do not collide
KIND_VERSION, KIND_FINAL = 0, 1


@dataclass
class InputRecord:
    """One version of a stage's input, as this rank holds it (its blocks only).

    ``chain``: ((layer, version), ...) of the layers whose transforms made it from x;
    ``params``: their (W, bh) snapshots, one dict per chain element.
    """

    version: int
    train: Shard
    val: Shard
    chain: tuple = ()
    params: tuple = ()


def frozen(layer, params):
    """A shallow copy of ``layer`` whose transform uses ``params`` (W, bh)."""
    f = copy.copy(layer)
    f.params = dict(layer.params, **params)
    return f


# ---- links between groups ------------------------------------------------------------------
def overlap(a: slice, b: slice) -> tuple[slice, slice] | None:
    """(piece in a's local rows, same piece in b's local rows) or None."""
    lo, hi = max(a.start, b.start), min(a.stop, b.stop)
    if hi <= lo:
        return None
    return slice(lo - a.start, hi - a.start), slice(lo - b.start, hi - b.start)


def piece_rows(piece) -> int:
    return 0 if piece is None else piece[0].stop - piece[0].start


def links_between(layout, mode: str, n_train: int, n_val: int, count: int, g_from: int) -> list:
    """[(sender rank, receiver rank, train pieces, val pieces)] from group g_from to g_from+1.

    Pieces are (sender-local slice, receiver-local slice) or None.
    """
    senders, receivers = layout.ranks[g_from], layout.ranks[g_from + 1]
    ns, nr = len(senders), len(receivers)
    links = []
    for j, rr in enumerate(receivers):
        if mode == "weights":
            links.append((senders[j % ns], rr, None, None))
            continue
        for i, sr in enumerate(senders):
            pt = overlap(Blocks.of(n_train, count, i, ns).rows, Blocks.of(n_train, count, j, nr).rows)
            pv = overlap(Blocks.of(n_val, count, i, ns).rows, Blocks.of(n_val, count, j, nr).rows)
            if pt is not None or pv is not None:
                links.append((sr, rr, pt, pv))
    return links


# ---- messages ----------------------------------------------------------------------------
def header_len(n_layers: int) -> int:
    return 4 + 2 * n_layers


def chain_size(layers) -> int:
    """Elements of the (W, b_h) of ``layers`` (the layers below a stage)."""
    return sum(l.n_in * l.n_out + l.n_out for l in layers)


def version_header(n_layers: int, version: int, chain: tuple) -> np.ndarray:
    header = np.zeros(header_len(n_layers), dtype=np.int64)
    header[0], header[1], header[3] = KIND_VERSION, version, len(chain)
    for k, (lay, ver) in enumerate(chain):
        header[4 + 2 * k], header[5 + 2 * k] = lay, ver
    return header


def final_header(n_layers: int, stop: bool) -> np.ndarray:
    """No more versions; ``stop``: the first stage has finished (no extra epoch starts)."""
    header = np.zeros(header_len(n_layers), dtype=np.int64)
    header[0], header[2] = KIND_FINAL, int(stop)
    return header


def chain_of(header) -> tuple:
    return tuple((int(header[4 + 2 * k]), int(header[5 + 2 * k])) for k in range(int(header[3])))


def pack_chain(xp, params):
    """The chain's (W, b_h) snapshots as one flat vector."""
    return xp.concatenate([a for p in params for a in (p["W"].reshape(-1), p["bh"])])


def unpack_chain(flat, layers) -> tuple:
    """The (W, b_h) snapshots of ``layers`` (the layers below a stage) from a flat payload."""
    params, off = [], 0
    for layer in layers:
        w = flat[off:off + layer.n_in * layer.n_out].reshape(layer.n_in, layer.n_out)
        off += layer.n_in * layer.n_out
        params.append({"W": w, "bh": flat[off:off + layer.n_out]})
        off += layer.n_out
    return tuple(params)


def rows_payload(xp, dtype, ht: Shard, hv: Shard, pt, pv, weights):
    """Data mode: the receiver's pieces of the transformed train and val rows, then the chain."""
    empty = xp.empty(0, dtype)
    return xp.concatenate([ht.x[pt[0]].reshape(-1) if pt is not None else empty,
                           hv.x[pv[0]].reshape(-1) if pv is not None else empty, weights])


def place_rows(xp, dtype, sources, payloads, n_in: int, train_rows: int, val_rows: int):
    """Data mode: this rank's (train, val) input rows put together from every source's payload."""
    tx = xp.empty((train_rows, n_in), dtype=dtype)
    vx = xp.empty((val_rows, n_in), dtype=dtype)
    for src, payload in zip(sources, payloads):
        pt, pv = src.pieces
        nt = piece_rows(pt)
        if pt is not None:
            tx[pt[1]] = payload[:nt * n_in].reshape(nt, n_in)
        if pv is not None:
            vx[pv[1]] = payload[nt * n_in:src.rows].reshape(-1, n_in)
    return tx, vx


class Recompute:
    """Weights mode: this rank's input rows through a chain of (layer, version) snapshots,
    reusing the activations of the bottom it shares with the chain before."""

    def __init__(self, layers, x_train: Shard, x_val: Shard):
        self.layers, self.x_train, self.x_val = layers, x_train, x_val
        self.cache = []      # ((layer, version), train act, val act)

    def __call__(self, chain, params):
        k = 0
        while k < min(len(chain), len(self.cache)) and self.cache[k][0] == chain[k]:
            k += 1
        del self.cache[k:]
        xt, xv = (self.cache[k - 1][1], self.cache[k - 1][2]) if k else (self.x_train, self.x_val)
        for idx in range(k, len(chain)):
            f = frozen(self.layers[chain[idx][0]], params[idx])
            xt, xv = f.transform(xt), f.transform(xv)
            self.cache.append((chain[idx], xt, xv))
        return xt, xv


# ---- receiving end -----------------------------------------------------------------------
class Source:
    """Receiving end of one (producer rank -> this rank) link: header, then payload.

    ``pieces`` (train, val) and ``rows`` (payload elements of rows) are set by the owner.
    """

    def __init__(self, comm, xp, dtype, rank: int, size: int, hdr_len: int):
        self.comm, self.xp, self.dtype, self.rank, self.size, self.hdr_len = comm, xp, dtype, rank, size, hdr_len
        self.got = {}          # version -> (header, payload)
        self.final = False
        self.stop = False
        self.pay_req = self.pay_buf = self.pay_hdr = None
        self.hdr_req = None
        self.nbytes = 0
        self._post_header()

    def _post_header(self):
        self.hdr_buf = np.empty(self.hdr_len, dtype=np.int64)
        self.hdr_req = self.comm.Irecv(self.hdr_buf, self.rank, TAG_HDR)

    def poll(self):
        while True:
            if self.pay_req is not None:
                if not self.pay_req.test():
                    return
                self.got[int(self.pay_hdr[1])] = (self.pay_hdr, self.pay_buf)
                self.nbytes += int(self.pay_buf.nbytes)
                self.pay_req = self.pay_buf = self.pay_hdr = None
            if self.hdr_req is None or not self.hdr_req.test():
                return
            hdr = self.hdr_buf.copy()
            if hdr[0] == KIND_FINAL:
                self.final, self.stop, self.hdr_req = True, bool(hdr[2]), None
                return
            self.pay_hdr = hdr
            self.pay_buf = self.xp.empty(self.size, dtype=self.dtype)
            self.pay_req = self.comm.Irecv(self.pay_buf, self.rank, TAG_PAY)
            self._post_header()
