"""The seed-002 CD-1 epoch in PyTorch on the CPU (or a CUDA GPU, for bench.gpu_epoch): a
bench-only peer for aepar's RBM, and (:class:`TorchAE`) one for its autoencoder layer
(``--pretrainer ae``).

Same recipe as :class:`aepar.models.rbm.RBM` with Bernoulli hidden units (DESIGN.md
"Stacked autoencoder", the 784-1000 layer): batch 100, learning rate 0.1 for weights and
biases, momentum, weight cost 2e-4 on W, hidden states sampled for the negative phase,
reconstruction kept as probabilities, statistics from hidden probabilities; one shuffle
per epoch. float32, ``torch.no_grad``, no autograd.

Two ways of writing it (``style``):

- ``"careful"`` (the peer bench.stacked compares against): what a performance-minded
  PyTorch user writes. Every buffer is allocated once; the GEMMs write in place
  (``addmm(out=)``, and the momentum step is two ``addmm_`` into the velocity with
  ``beta=momentum``); the shuffle gather is ``index_select(out=)``; the error is summed in
  a tensor and read once per epoch; and, what matters most, no subnormal floats: once
  the weights have grown, about a tenth of the hidden probabilities are below 1e-30 and
  some below float32's smallest normal number (sigmoid of < -87), and the arithmetic
  that meets subnormal numbers takes microcode assists: the plain version ran 3-4x
  slower. So the epoch runs under ``torch.set_flush_denormal(True)`` (restored after),
  which sets the mode of the calling thread only, and the probabilities below 2**-100
  are stored as 0 (``torch.threshold_``), as aepar's float32 kernels store them; without
  the latter the intra-op worker thread at 2 threads still met them (4x slower there).
- ``"plain"``: the straightforward version, the bench's peer before: fresh tensors for
  every intermediate, one ``float()`` per batch, the CPU's default subnormal handling.

aepar itself never imports torch; ``bench.stacked`` times both side by side.
Install: ``.venv/bin/pip install torch==2.13.0``.
"""
from __future__ import annotations


__all__ = ["available", "TorchRBM", "TorchAE", "STYLES", "LAYERS"]

STYLES = ("careful", "plain")
# the layers the benches time (their --rbm-layer / --layers), as their rows name them
LAYERS = {"rbm": "bernoulli", "ae": "autoencoder"}
# aepar's float32 kernels store probabilities below this as 0 (kernels/nb/rbm.py, _flush)
FLUSH = 2.0 ** -100


def available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class _TorchLayer:
    """What the peers share: the recipe's parameters (W ~ 0.1 N(0, 1) from ``seed``, zero
    biases and velocities), the thread count, the device, and the careful style's buffers
    (:meth:`_buffers`, allocated once)."""

    def __init__(self, n_in, n_out, *, lr=0.1, weight_cost=2e-4, momentum=0.9, batch=100, seed=0,
                 threads=1, style="careful", device="cpu"):
        import torch

        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, not {style!r}")
        torch.set_num_threads(int(threads))
        self.torch, self.style, self.device = torch, style, torch.device(device)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.W = 0.1 * torch.randn(n_in, n_out, generator=self.gen, dtype=torch.float32, device=self.device)
        self.bv = torch.zeros(n_in, device=self.device)
        self.bh = torch.zeros(n_out, device=self.device)
        self.vW, self.vbv, self.vbh = torch.zeros_like(self.W), torch.zeros_like(self.bv), torch.zeros_like(self.bh)
        self.lr, self.wc, self.m, self.batch = lr, weight_cost, momentum, batch
        if style == "careful":
            self._buffers(batch, n_in, n_out)


class TorchRBM(_TorchLayer):
    """A Bernoulli-Bernoulli RBM trained by CD-1 with PyTorch tensors on the CPU.

    Parameters
    ----------
    n_in, n_out : int
    lr, weight_cost, momentum : float
        The recipe (momentum 0.9: the epochs after the switch, most of a run).
    batch, seed : int
    threads : int
        ``torch.set_num_threads`` (intra-op threads: MKL and the element-wise loops).
    style : {"careful", "plain"}
        See the module docstring.
    """

    def _buffers(self, batch, n_in, n_out):
        torch, f32, dev = self.torch, self.torch.float32, self.device
        self._v0, self._v1, self._dv = (torch.empty(batch, n_in, dtype=f32, device=dev) for _ in range(3))
        self._h0, self._h1, self._hs, self._u, self._dh = (torch.empty(batch, n_out, dtype=f32, device=dev)
                                                           for _ in range(5))
        self._on = torch.empty(batch, n_out, dtype=torch.bool, device=dev)

    def train_epoch(self, data) -> float:
        """One CD-1 epoch over ``data`` (numpy or tensor, float32); mean squared error per sample."""
        torch = self.torch
        x = torch.as_tensor(data, dtype=torch.float32, device=self.device)
        with torch.no_grad():
            if self.style == "plain":
                return self._epoch_plain(x)
            flushing = torch.set_flush_denormal(True)
            try:
                return self._epoch_careful(x)
            finally:
                if flushing:  # leave the thread's floating-point mode as it was for the other peer
                    torch.set_flush_denormal(False)

    def _epoch_careful(self, x) -> float:
        torch = self.torch
        n, W, vW, m, lr = x.shape[0], self.W, self.vW, self.m, self.lr

        def flush(p):  # probabilities below 2**-100 -> 0, as aepar's kernels store them
            return torch.threshold_(p, FLUSH, 0.0)

        err = torch.zeros((), dtype=torch.float64, device=self.device)
        perm = torch.randperm(n, generator=self.gen, device=self.device)
        for start in range(0, n, self.batch):
            rows = perm[start:start + self.batch]
            b = rows.shape[0]
            v0, v1, dv = self._v0[:b], self._v1[:b], self._dv[:b]
            h0, h1, hs, u, dh, on = self._h0[:b], self._h1[:b], self._hs[:b], self._u[:b], self._dh[:b], self._on[:b]
            torch.index_select(x, 0, rows, out=v0)
            flush(torch.addmm(self.bh, v0, W, out=h0).sigmoid_())
            torch.rand(h0.shape, generator=self.gen, out=u)
            torch.gt(h0, u, out=on)
            hs.copy_(on)
            flush(torch.addmm(self.bv, hs, W.t(), out=v1).sigmoid_())
            flush(torch.addmm(self.bh, v1, W, out=h1).sigmoid_())
            # vW = m vW + lr ((v0' h0 - v1' h1) / b - wc W); W += vW
            vW.addmm_(v0.t(), h0, beta=m, alpha=lr / b)
            vW.addmm_(v1.t(), h1, alpha=-lr / b)
            vW.add_(W, alpha=-lr * self.wc)
            W.add_(vW)
            torch.sub(v0, v1, out=dv)
            torch.sub(h0, h1, out=dh)
            self.vbv.mul_(m).add_(dv.sum(0), alpha=lr / b)
            self.vbh.mul_(m).add_(dh.sum(0), alpha=lr / b)
            self.bv.add_(self.vbv)
            self.bh.add_(self.vbh)
            err += torch.dot(dv.view(-1), dv.view(-1))
        return float(err) / n

    def _epoch_plain(self, x) -> float:
        torch = self.torch
        n = x.shape[0]
        err = 0.0
        perm = torch.randperm(n, generator=self.gen, device=self.device)
        for start in range(0, n, self.batch):
            v0 = x[perm[start:start + self.batch]]
            b = v0.shape[0]
            h0 = torch.sigmoid(torch.addmm(self.bh, v0, self.W))
            hs = (h0 > torch.rand(h0.shape, generator=self.gen, device=self.device)).to(torch.float32)
            v1 = torch.sigmoid(torch.addmm(self.bv, hs, self.W.t()))
            h1 = torch.sigmoid(torch.addmm(self.bh, v1, self.W))
            # gradient ascent direction of CD-1, averaged over the batch
            dW = torch.mm(v0.t(), h0)
            dW.addmm_(v1.t(), h1, alpha=-1.0)
            dW.mul_(1.0 / b).add_(self.W, alpha=-self.wc)
            self.vW.mul_(self.m).add_(dW, alpha=self.lr)
            self.vbv.mul_(self.m).add_((v0 - v1).mean(0), alpha=self.lr)
            self.vbh.mul_(self.m).add_((h0 - h1).mean(0), alpha=self.lr)
            self.W.add_(self.vW)
            self.bv.add_(self.vbv)
            self.bh.add_(self.vbh)
            err += float(((v0 - v1) ** 2).sum())
        return err / n

class TorchAE(_TorchLayer):
    """The tied-weight autoencoder layer of :class:`aepar.models.ae_layer.AELayer` in PyTorch:
    h = sigmoid(x W + bh) (``code="identity"``: x W + bh, a stack's top layer), x^ =
    sigmoid(h W' + bv), the gradient of 1/2 sum (x^ - x)^2 over the batch divided by its
    size, v = momentum v - lr (g + weight_cost W) for W (no cost on the biases), p += v; the
    same recipe and W init as :class:`TorchRBM`.

    ``"careful"`` writes the gradient by hand into buffers allocated once (five GEMMs, two
    of them ``addmm_`` straight into W's velocity), sums the error in a tensor read once per
    epoch and flushes subnormals as :class:`TorchRBM` does (aepar's autoencoder layer keeps
    its sigmoid's subnormal tails, which a pre-activation reaches only below -87); ``"plain"``
    lets autograd take the gradient of the batch's loss, with fresh tensors each step and
    one ``float()`` per batch.
    """

    def __init__(self, n_in, n_out, *, code="sigmoid", **recipe):
        if code not in ("sigmoid", "identity"):
            raise ValueError(f"code must be sigmoid or identity, not {code!r}")
        self.sigmoid_code = code == "sigmoid"
        super().__init__(n_in, n_out, **recipe)

    def _buffers(self, batch, n_in, n_out):
        torch, dev = self.torch, self.device
        self._x, self._y, self._dy = (torch.empty(batch, n_in, device=dev) for _ in range(3))
        self._h, self._dh = (torch.empty(batch, n_out, device=dev) for _ in range(2))

    def train_epoch(self, data) -> float:
        """One epoch over ``data`` (numpy or tensor, float32); mean over rows of sum (x^ - x)^2."""
        torch = self.torch
        x = torch.as_tensor(data, dtype=torch.float32, device=self.device)
        if self.style == "plain":
            return self._epoch_plain(x)
        flushing = torch.set_flush_denormal(True)
        try:
            with torch.no_grad():
                return self._epoch_careful(x)
        finally:
            if flushing:
                torch.set_flush_denormal(False)

    def _epoch_careful(self, x) -> float:
        torch = self.torch
        n, W, vW, m, lr = x.shape[0], self.W, self.vW, self.m, self.lr
        err = torch.zeros((), dtype=torch.float64, device=self.device)
        perm = torch.randperm(n, generator=self.gen, device=self.device)
        for start in range(0, n, self.batch):
            rows = perm[start:start + self.batch]
            b = rows.shape[0]
            xb, y, dy, h, dh = self._x[:b], self._y[:b], self._dy[:b], self._h[:b], self._dh[:b]
            torch.index_select(x, 0, rows, out=xb)
            torch.addmm(self.bh, xb, W, out=h)
            if self.sigmoid_code:
                h.sigmoid_()
            torch.addmm(self.bv, h, W.t(), out=y).sigmoid_()
            torch.sub(y, xb, out=dy)
            err += torch.dot(dy.view(-1), dy.view(-1))
            dy.mul_(y).mul_(1.0 - y)                      # d(loss)/d(pre-activation) of x^
            torch.mm(dy, W, out=dh)                       # ... of h
            if self.sigmoid_code:
                dh.mul_(h).mul_(1.0 - h)
            # vW = m vW - lr ((x' dh + dy' h) / b + wc W); W += vW
            vW.mul_(m).add_(W, alpha=-lr * self.wc)
            vW.addmm_(xb.t(), dh, alpha=-lr / b)
            vW.addmm_(dy.t(), h, alpha=-lr / b)
            W.add_(vW)
            self.vbv.mul_(m).add_(dy.sum(0), alpha=-lr / b)
            self.vbh.mul_(m).add_(dh.sum(0), alpha=-lr / b)
            self.bv.add_(self.vbv)
            self.bh.add_(self.vbh)
        return float(err) / n

    def _epoch_plain(self, x) -> float:
        torch = self.torch
        n, err = x.shape[0], 0.0
        params = (self.W, self.bv, self.bh)
        for p in params:
            p.requires_grad_(True)
        try:
            perm = torch.randperm(n, generator=self.gen, device=self.device)
            for start in range(0, n, self.batch):
                xb = x[perm[start:start + self.batch]]
                h = xb @ self.W + self.bh
                h = torch.sigmoid(h) if self.sigmoid_code else h
                y = torch.sigmoid(h @ self.W.t() + self.bv)
                sq = ((y - xb) ** 2).sum()
                for p in params:
                    p.grad = None
                (0.5 * sq / xb.shape[0]).backward()
                with torch.no_grad():
                    for p, v, wc in zip(params, (self.vW, self.vbv, self.vbh), (self.wc, 0.0, 0.0)):
                        v.mul_(self.m).add_(p.grad + wc * p, alpha=-self.lr)
                        p.add_(v)
                err += float(sq.detach())
        finally:
            for p in params:
                p.requires_grad_(False)
        return err / n
