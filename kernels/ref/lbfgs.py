"""The L-BFGS two-loop recursion (NumPy reference), float64 on the host: the search
direction d = -H g from the last pairs (s, y) kept in a ring (Nocedal & Wright, Algorithm
7.4). Not a device kernel: the optimiser runs on the host whatever the backend."""
import numpy as np

__all__ = ["two_loop"]


def check_two_loop(S, Y, rho, count, g, d):
    m, n = S.shape
    if Y.shape != (m, n) or rho.shape != (m,) or g.shape != (n,) or d.shape != (n,):
        raise ValueError(f"two_loop: S and Y must be (m, n), rho (m,), g and d (n,); got {S.shape}, {Y.shape}, "
                         f"{rho.shape}, {g.shape}, {d.shape}")
    if count < 0:
        raise ValueError(f"two_loop: count must be >= 0, got {count}")


def two_loop(S, Y, rho, count, g, d):
    """d = -H g, written into ``d``. ``count`` pairs have been stored so far, pair k in row
    k % m of S (the steps s) and Y (the gradient changes y), rho[k % m] = 1 / (s·y); the
    last min(count, m) are used, the initial H the scalar (s·y)/(y·y) of the newest. With
    no pair, d = -g. Returns None."""
    check_two_loop(S, Y, rho, count, g, d)
    m = S.shape[0]
    rows = [(count - 1 - j) % m for j in range(min(count, m))]  # newest first
    q = -np.asarray(g, dtype=np.float64)
    alpha = []
    for r in rows:
        alpha.append(rho[r] * (S[r] @ q))
        q = q - alpha[-1] * Y[r]
    if rows:
        r = rows[0]
        q = q * ((S[r] @ Y[r]) / (Y[r] @ Y[r]))
    for a, r in reversed(list(zip(alpha, rows))):
        q = q + (a - rho[r] * (Y[r] @ q)) * S[r]
    d[...] = q
