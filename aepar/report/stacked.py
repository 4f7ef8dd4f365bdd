"""The paper's Tables 2 and 3 for stacked-autoencoder runs, side by side for several schemes.

Table 2: average squared reconstruction error per digit (Σ over pixels of (x − x̂)²,
averaged over images), training and test, after fine-tuning (and before, i.e. the
pre-trained stack alone), with the PCA baseline of the same data. Table 3: pre-training
and fine-tuning wall times.

Reads the ``summary.json`` that ``aepar.greedy`` and ``aepar.sync`` write: keys
``scheme``, ``error`` {"pretrained": {"train", "test"}, "finetuned": {...} | None},
``pca`` {"k", "train", "test"} (optional: :func:`pca_error`), ``pretrain_time_s``,
``finetune_time_s``.

    python -m aepar.report.stacked runs/greedy/summary.json runs/sync/summary.json [--out tables.md]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

__all__ = ["pca_error", "recipe", "table2", "table3", "tables", "hms", "reconstructions_figure", "main"]

TABLES_FILE = "tables.md"
SHOWN = 8  # test rows in reconstructions.png


def pca_error(train_x, test_x, k=30) -> dict:
    """Error per digit of reconstructing from the first ``k`` principal components.

    The components and the mean come from the training set (float64 SVD); the error is
    Σ_pixels (x − x̂)² averaged over images, as for the autoencoder.

    Returns
    -------
    dict
        {"k": k, "features": the input's width, "train": error on train_x, "test": error on
        test_x}; with k as wide as the input PCA reconstructs exactly, and is no baseline
    """
    train = np.asarray(train_x, dtype=np.float64)
    mean = train.mean(axis=0)
    k = int(min(k, *train.shape))
    # right singular vectors of the centred data = principal directions
    _, _, vt = np.linalg.svd(train - mean, full_matrices=False)
    basis = vt[:k].T

    def error(x):
        c = np.asarray(x, dtype=np.float64) - mean
        r = c - (c @ basis) @ basis.T
        return float(np.einsum("ij,ij->", r, r) / max(c.shape[0], 1))

    return {"k": k, "features": int(train.shape[1]), "train": error(train), "test": error(test_x)}


def reconstructions_figure(be, layers, params: dict, x, *, loss: str, prefix: str = ""):
    """``draw(path)`` of reconstructions.png: the first :data:`SHOWN` rows of ``x`` over
    their reconstructions by the pre-trained ``layers`` (unrolled) and, where ``params``
    holds it (``finetuned/*``), the fine-tuned network; None unless the rows are square
    images (aepar.report.figures.image_shape). Root only: local arithmetic, no ranks."""
    from aepar.report.figures import image_shape, reconstructions_png

    shape = image_shape(int(np.shape(x)[1]))
    if shape is None or not np.shape(x)[0]:
        return None
    shown = np.asarray(x[:SHOWN])
    tuned = {k[len(f"{prefix}finetuned/"):]: v for k, v in params.items() if k.startswith(f"{prefix}finetuned/")}

    def draw(path):
        from aepar.models.stacked import StackedAutoencoder
        from aepar.rows import Shard

        rows = Shard.of(be, shown, 1)
        model = StackedAutoencoder.from_layers(be, layers, loss=loss)
        out = [("pre-trained", be.to_host(model.reconstruct(rows).x))]
        if tuned:
            for k, v in tuned.items():
                model.params[k][...] = be.asarray(v)
            out.append(("fine-tuned", be.to_host(model.reconstruct(rows).x)))
        reconstructions_png(shown, out, shape, path)
    return draw


def hms(seconds) -> str:
    """3h 14m 43s / 2m 05s / 4.21s (the paper writes its times this way)."""
    if seconds is None:
        return "–"
    s = float(seconds)
    if s < 60:
        return f"{s:.2f}s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def _num(x, fmt="{:.2f}"):
    return "–" if x is None else fmt.format(x)


def _label(name, summary) -> str:
    """"greedy pre-training" for the pre-training schemes (the paper's wording), else the name."""
    return f"{name} pre-training" if summary.get("scheme") in ("greedy", "sync") else name


def recipe(ft) -> str:
    """"adam lr 0.004, cosine decay, weight decay 0.05 / xent, 10 epochs" from a summary's
    fine-tuning part."""
    if not ft or not ft.get("n_epochs"):
        return "none"
    decay = ", cosine decay" if ft.get("lr_decay") == "cosine" else ""
    decay += f", weight decay {ft['weight_decay']:g}" if ft.get("weight_decay") else ""
    n = ft.get("n_epochs")
    return f"{ft.get('optimizer')} lr {ft.get('lr'):g}{decay} / {ft.get('loss')}, {n} epoch{'' if n == 1 else 's'}"


def _row(cells):
    return "| " + " | ".join(cells) + " |"


def _baseline(pca) -> bool:
    """Whether PCA's error is a baseline to divide by: it keeps fewer components than the
    input has (else it reconstructs exactly, up to rounding) and its error is not zero."""
    return bool(pca and pca.get("test") and pca.get("k", 0) < pca.get("features", float("inf")))


def table2(summaries: dict) -> str:
    """Markdown Table 2 for {scheme name: summary}."""
    lines = ["Table 2. Average squared reconstruction error per digit",
             "",
             _row(["Algorithm", "Training error", "Test error", "Pre-trained only (train / test)",
                   "Test vs PCA", "Fine-tuning"]),
             _row(["---"] * 6)]
    pca = None
    for name, s in summaries.items():
        err = s.get("error") or {}
        pre = err.get("pretrained") or {}
        fin = err.get("finetuned") or {}
        test = fin.get("test", pre.get("test"))
        p = s.get("pca")
        pca = pca or p
        ratio = f"{test / p['test']:.2f}x" if _baseline(p) and test is not None else "–"
        label = _label(name, s) + ("" if fin else " (no fine-tuning)")
        lines.append(_row([label, _num(fin.get("train")), _num(fin.get("test")),
                           f"{_num(pre.get('train'))} / {_num(pre.get('test'))}", ratio,
                           recipe(s.get("finetune"))]))
    if pca:
        exact = "" if _baseline(pca) else ", exact: as wide as the input"
        lines.append(_row([f"PCA-{pca['k']} (same data{exact})", _num(pca.get("train")), _num(pca.get("test")),
                           "–", "1.00x" if not exact else "–", "–"]))
    return "\n".join(lines)


def table3(summaries: dict) -> str:
    """Markdown Table 3 (execution times) for {scheme name: summary}."""
    lines = ["Table 3. Execution times (wall clock, slowest rank)",
             "",
             _row(["Algorithm", "Pre-training time", "Fine-tuning time", "Ranks", "Device / dtype"]),
             _row(["---"] * 5)]
    for name, s in summaries.items():
        ft = s.get("finetune") or {}
        fine = s.get("finetune_time_s") if ft.get("n_epochs", 1) else None
        lines.append(_row([_label(name, s), hms(s.get("pretrain_time_s")), hms(fine),
                           str(s.get("ranks", "–")), f"{s.get('device', '–')} / {s.get('dtype', '–')}"]))
    return "\n".join(lines)


def _source_line(summaries: dict) -> str:
    sources = sorted({s.get("source", "") for s in summaries.values() if s.get("source")})
    return ("Data: " + "; ".join(sources)) if sources else ""


def tables(summaries: dict) -> str:
    """Both tables (and the data they were measured on) as one markdown text."""
    parts = [table2(summaries), "", table3(summaries)]
    src = _source_line(summaries)
    if src:
        parts += ["", src]
    return "\n".join(parts) + "\n"


def _load(path: str) -> tuple[str, dict]:
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    try:
        summary = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"aepar.report.stacked: error: {p}: {e}")
    return summary.get("scheme", p.parent.name), summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aepar.report.stacked",
                                     description="Tables 2 and 3 of Santara et al. from run summaries, side by side.")
    parser.add_argument("summaries", nargs="+", help="summary.json files or run directories")
    parser.add_argument("--out", help="also write the markdown here")
    args = parser.parse_args(argv)
    summaries = {}
    for path in args.summaries:
        name, s = _load(path)
        while name in summaries:
            name += "'"
        summaries[name] = s
    text = tables(summaries)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
