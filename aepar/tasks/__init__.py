"""Tasks applied after any pre-training scheme: fine-tuning the unrolled autoencoder
(``reconstruct``) or a classifier on the encoder (``classify``). Tasks never import
schemes: they take the layers a scheme trained."""
from __future__ import annotations

from aepar.cli import progress
from aepar.report.stacked import pca_error
from aepar.tasks.classify import table
from aepar.tasks.finetune import finetune_and_evaluate

__all__ = ["run_task", "task_table"]


def run_task(be, comm, layers, digits, args, *, trace=None, ckpt=None, guard=None, resume=None, outer=None,
             prefix="") -> tuple[dict, dict]:
    """Apply ``args.task`` to pre-trained ``layers`` over the ranks of ``comm``.

    Returns (the summary's entries, the trained network's host arrays named for weights.h5
    under ``prefix``: ``classifier/*``, or ``finetuned/*`` when there were fine-tuning epochs).
    ``resume``: a checkpoint taken during this task; ``outer``: what every checkpoint adds.
    """
    if args.task == "classify":
        from aepar.tasks.classify import classify_and_evaluate

        result = classify_and_evaluate(be, comm, layers, digits, args, trace=trace, ckpt=ckpt, guard=guard,
                                       resume=resume, outer=outer, prefix=prefix)
        model = result.pop("model")
        entries = {"classify": result, "finetune_time_s": result["time_s"],
                   "accuracy": {"pretrained": result["before"], "finetuned": result["after"]}}
        return entries, {f"{prefix}classifier/{k}": be.to_host(v) for k, v in model.params.items()}
    k = int(layers[-1].n_out)
    pca = comm.bcast(pca_error(digits.train_x, digits.test_x, k=k) if comm.is_root else None)
    progress(comm, args.quiet, f"PCA-{pca['k']} baseline: train error/digit {pca['train']:.3f}  test {pca['test']:.3f}")
    result = finetune_and_evaluate(be, comm, layers, digits, args, trace=trace, ckpt=ckpt, guard=guard,
                                   resume=resume, outer=outer, prefix=prefix)
    model = result.pop("model")
    entries = {"pca": pca, "finetune": result, "finetune_time_s": result["time_s"],
               "error": {"pretrained": result["before"],
                         "finetuned": result["after"] if args.finetune_epochs else None}}
    params = {f"{prefix}finetuned/{k}": be.to_host(v) for k, v in model.params.items()} if args.finetune_epochs else {}
    return entries, params


def task_table(summary: dict) -> str:
    """The classification table of a run's summary (the reconstruct task's are aepar.report.stacked's)."""
    return table(dict(summary, classify=dict(summary["classify"], init="pretrained")))
