"""The seed-002 CD-1 epoch in PyTorch on the CPU: a bench-only peer for aepar's RBM.

Same recipe as :class:`aepar.models.rbm.RBM` (DESIGN.md "Stacked autoencoder"): batch 100,
learning rate 0.1 for weights and biases, momentum, weight cost 2e-4 on W, hidden states
sampled for the negative phase, reconstruction kept as probabilities, statistics from
hidden probabilities; one shuffle per epoch. float32, ``torch.no_grad``, in-place BLAS
calls (``addmm_``) - the way a careful PyTorch user writes it, no autograd.

aepar itself never imports torch; ``bench.stacked`` times both side by side.
Install: ``.venv/bin/pip install torch==2.13.0``.
"""
from __future__ import annotations

import time

__all__ = ["available", "TorchRBM"]


def available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class TorchRBM:
    """A Bernoulli-Bernoulli RBM trained by CD-1 with PyTorch tensors on the CPU."""

    def __init__(self, n_in, n_out, *, lr=0.1, weight_cost=2e-4, momentum=0.9, batch=100, seed=0,
                 threads=1):
        import torch

        torch.set_num_threads(int(threads))
        self.torch = torch
        self.gen = torch.Generator().manual_seed(seed)
        self.W = 0.1 * torch.randn(n_in, n_out, generator=self.gen, dtype=torch.float32)
        self.bv = torch.zeros(n_in)
        self.bh = torch.zeros(n_out)
        self.vW, self.vbv, self.vbh = torch.zeros_like(self.W), torch.zeros_like(self.bv), torch.zeros_like(self.bh)
        self.lr, self.wc, self.m, self.batch = lr, weight_cost, momentum, batch

    def train_epoch(self, data) -> float:
        """One CD-1 epoch over ``data`` (numpy or tensor, float32); mean squared error per sample."""
        torch = self.torch
        x = torch.as_tensor(data, dtype=torch.float32)
        n = x.shape[0]
        err = 0.0
        with torch.no_grad():
            perm = torch.randperm(n, generator=self.gen)
            for start in range(0, n, self.batch):
                v0 = x[perm[start:start + self.batch]]
                b = v0.shape[0]
                h0 = torch.sigmoid(torch.addmm(self.bh, v0, self.W))
                hs = (h0 > torch.rand(h0.shape, generator=self.gen)).to(torch.float32)
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

    def time_epoch(self, data) -> float:
        t0 = time.perf_counter()
        self.train_epoch(data)
        return time.perf_counter() - t0
