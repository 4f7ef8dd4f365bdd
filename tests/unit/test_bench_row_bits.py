"""bench.row_bits finds a product whose rows change with the rows beside them, and finds
none where every order gives the same sums."""
import csv

import numpy as np

from bench import row_bits
from tests.conftest import needs_cpu_fma

SMALL = dict(forward=((40, 24),), gradient=((16, 24),), rows=(26, 100), batches=(2, 8))


def reordered(xp, a, b):
    """The product with its sums in another order where the call has an even row count."""
    if a.shape[-2] % 2:
        return xp.matmul(a, b)
    return xp.matmul(a[..., ::-1], b[..., ::-1, :])


def test_exact_sums_agree_in_every_comparison(monkeypatch):
    # small integers: every product and sum exact, so no order of the sums can differ
    monkeypatch.setattr(row_bits, "product", reordered)
    rows = row_bits.measure(np, integers=True, **SMALL)
    assert {r["test"] for r in rows} == {"rows", "batched", "repeat", "gradient"}
    assert all(r["differing"] == 0 and r["max_rel_diff"] == 0 for r in rows)


def test_a_product_whose_rows_depend_on_the_call_is_found(monkeypatch):
    def shaky(xp, a, b):  # each row scaled by the call's row count and rank
        return (xp.matmul(a, b) * np.float32(1 + 1e-5 * (a.shape[-2] + a.ndim))).astype(np.float32)

    monkeypatch.setattr(row_bits, "product", shaky)
    rows = row_bits.measure(np, **SMALL)
    found = {r["test"] for r in rows if r["differing"]}
    assert found == {"rows", "batched", "gradient"}  # the repeat of one call is the same call
    assert all(0 < r["max_rel_diff"] < 1e-3 for r in rows if r["differing"])
    assert any("different bits in" in line for line in row_bits.summary(rows))


def test_main_merges_its_rows_per_device(tmp_path, monkeypatch):
    measure = row_bits.measure
    monkeypatch.setattr(row_bits, "measure", lambda xp: measure(xp, **SMALL))
    monkeypatch.setattr(row_bits, "OWN_BATCHES", (16, 40))
    monkeypatch.setattr(row_bits, "FORWARD", ((30, 50),))
    out = tmp_path / "row_bits.csv"
    assert row_bits.main(["--out", str(out)]) == 0
    assert row_bits.main(["--out", str(out)]) == 0  # a second run replaces the first's rows
    rows = list(csv.DictReader(out.open()))
    timed = [r for r in rows if r["test"].startswith("cpu ")]
    assert len(rows) - len(timed) == len(measure(np, **SMALL)) and {r["device"] for r in rows} == {"cpu"}
    assert all(r["cpu_model"] and r["benchmark"] == "row_bits" for r in rows)
    # the row kernels timed on this CPU: x @ W and h @ W.T per batch and shape, each against the BLAS
    assert [(r["test"], r["shape"], r["size"]) for r in timed] == [
        (test, "30x50", f"{batch} rows in 8 blocks") for batch in (16, 40)
        for test in ("cpu rows_times", "cpu rows_times_t")]
    assert all(float(r[k]) > 0 for r in timed for k in ("own_us", "blas_blocks_us", "blas_whole_us"))
    from aepar.kernels.nb.rowprod import MAX_ROWS
    assert {int(r["max_rows"]) for r in timed} == {MAX_ROWS}


def test_the_cpu_row_kernels_are_timed_on_their_products(monkeypatch):
    """What is timed as the row kernels is their product of the batch's rows (x @ W, h @ W.T)."""
    from aepar.kernels.nb import rowprod

    monkeypatch.setattr(row_bits, "OWN_BATCHES", (24,))
    monkeypatch.setattr(row_bits, "FORWARD", ((30, 50),))
    calls = []
    for name in ("rows_times", "rows_times_t"):
        real = getattr(rowprod, name)

        def spy(a, W, out, real=real, name=name):
            calls.append((name, a.shape, W.shape, out.shape))
            return real(a, W, out)
        monkeypatch.setattr(rowprod, name, spy)
    rows = row_bits.cpu_kernels(repeats=1)
    assert {r["test"] for r in rows} == {"cpu rows_times", "cpu rows_times_t"}
    assert set(calls) == {("rows_times", (24, 30), (30, 50), (24, 50)), ("rows_times_t", (24, 50), (30, 50), (24, 30))}


@needs_cpu_fma
def test_the_own_kernels_are_timed_against_cublas_a_call_per_block(emulated_cupy, monkeypatch):
    """On the emulated GPU (its timings mean nothing): every batch and shape gets a row with
    the CPU's bits, and the per-block side is cuBLAS's calls, not the set's block_outer_sum
    (which takes the own kernels for small blocks)."""
    monkeypatch.setattr(row_bits, "OWN_BATCHES", (16, 40))
    monkeypatch.setattr(row_bits, "FORWARD", ((30, 50),))
    monkeypatch.setattr(row_bits, "GRADIENT", ((30, 50),))
    from aepar.kernels.cp import rowprod

    launches = []
    real = rowprod.block_outer_sum
    monkeypatch.setattr(rowprod, "block_outer_sum", lambda *args: launches.append(1) or real(*args))
    rows = row_bits.own_kernels(emulated_cupy, repeats=1)
    assert [(r["test"], r["size"]) for r in rows] == [
        ("own rows_times", "16 rows in 8 blocks"), ("own block_outer_sum", "8 blocks of 4 rows"),
        ("own rows_times", "40 rows in 8 blocks"), ("own block_outer_sum", "8 blocks of 10 rows")]
    assert all(r["same_bits_as_cpu"] for r in rows)
    # per batch: each of the 3 instances timed (a warm-up and one call each), then its bits;
    # none by the cuBLAS side
    assert len(launches) == 2 * (3 * 2 + 3)
    assert all(r["own_us"] == r[f"own_{r['tiles']}_us"] for r in rows)
    assert all(r["tiles"] in ("wide", "thin") and r["own_wide_us"] and r["own_mid_us"] and r["own_thin_us"]
               for r in rows)
