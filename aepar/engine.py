"""The engine of the stacked-autoencoder schemes: one run of any scheme in :mod:`aepar.schemes`.

A run is one or two stages. A stage pre-trains the layers with its scheme, then applies the
task (:mod:`aepar.tasks`: fine-tuning or a classifier) on the data-parallel ranks. The main
stage runs the scheme asked for; ``--compare-greedy`` adds a greedy stage on the same rows
and seed, whose names go under ``greedy/``. Every stage and phase is resumable: a
checkpoint says which stage and phase it was taken in (``stage``, ``phase``) and holds what
the finished ones produced, so ``--resume`` goes on where the run stopped. The end of the
run is :func:`aepar.finish.finish`.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from aepar import schemes
from aepar.checkpoint import layers_to_params, restore_layers
from aepar.cli import progress
from aepar.data.files import fingerprinted
from aepar.errors import UserError
from aepar import metrics
from aepar.finish import Weights, finish
from aepar.parallel.subset import Subset, data_parallel_ranks
from aepar.report.stacked import TABLES_FILE, reconstructions_figure, tables
from aepar.resume import Checkpointer
from aepar.rundir import fingerprint
from aepar.stack import layers_from_args, warm_up
from aepar.tasks import run_task, task_table
from aepar.report.profile import profile_csv, profile_png, profile_rows
from aepar.trace import Trace

__all__ = ["Job", "check", "run_scheme"]

COMPARED = "greedy"  # --compare-greedy's stage


@dataclass
class Job:
    """What a scheme is given, and the entries it adds to the run's summary and weights."""
    be: object
    comm: object                 # the ranks that pre-train
    args: argparse.Namespace     # the stage's own copy (a scheme may adjust it, e.g. data's scaled rates)
    name: str                    # the scheme's name
    prog: str
    layers: list
    digits: object               # the training and test rows (less any held out)
    x_val: object                # rows held out to watch the stages on (may be empty)
    trace: Trace
    guard: object
    ckpt: Checkpointer
    loaded: tuple | None = None  # (params, opt_state, progress) of a checkpoint taken in this pre-training
    position: dict = field(default_factory=dict)  # that checkpoint's progress record
    prefix: str = ""             # before this stage's names in checkpoints and weights
    outer: object = None         # () -> (params, opt_state, progress) every checkpoint of the stage adds
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)  # file name -> draw(path), on rank 0
    state: dict = field(default_factory=dict)    # the scheme's own, from setup to pretrain

    @property
    def watch_x(self):
        """The rows the scheme reports its error on while training: the held-out ones, else the test rows."""
        return self.x_val if self.x_val.shape[0] else self.digits.test_x

    @property
    def shape(self) -> str:
        return "-".join(map(str, [self.layers[0].n_in] + [l.n_out for l in self.layers]))

    def say(self, message: str, **left):
        progress(self.comm, self.args.quiet, message, **left)

    def announce(self, how: str):
        """The stage's first line: network, recipe, how the scheme spreads it, backend."""
        a, be = self.args, self.be
        self.say(f"{self.prog}: {self.name}: {self.shape}, {a.pretrainer}, {a.epochs} epochs/layer, batch {a.batch}, "
                 f"{how}; {be.device}/{be.kernel_set}/{be.dtype}")


def prepare(name, digits, args):
    """The rows the scheme trains on and the rows it holds out (its ``prepare``, if any)."""
    scheme = schemes.get(name).load()
    if hasattr(scheme, "prepare"):
        return scheme.prepare(digits, args)
    return digits, digits.train_x[:0]


def check(args, ranks: int, n_layers: int, n_rows: int, name: str):
    """One line per impossible combination (every rank, no communication)."""
    schemes.get(name).load().check(args, ranks, n_layers, n_rows)
    if args.batch > n_rows:
        raise UserError(f"--batch {args.batch} exceeds the {n_rows} training rows"
                        + (f" (preset {args.preset} does not fit this data: give --dataset or --data-dir "
                           f"with more rows, or --batch)" if getattr(args, "preset", None) else ""))
    if args.task == "classify" and args.classify_batch > n_rows:
        raise UserError(f"--classify-batch {args.classify_batch} exceeds the {n_rows} training rows")
    if args.task == "classify" and args.compare_greedy:
        raise UserError("--compare-greedy compares reconstruction: not with --task classify")


def run_scheme(be, comm, args, digits, run, guard, name, *, prog, extra=None) -> dict:
    """Pre-train with scheme ``name``, apply the task, compare with greedy if asked; write the
    run's results (rank 0). Returns the summary (rank 0's is complete)."""
    scheme = schemes.get(name).load()
    digits, x_val = prepare(name, digits, args)
    say = lambda m: progress(comm, args.quiet, m)  # noqa: E731
    ckpt = Checkpointer(run, comm, guard, getattr(scheme, "CHECKPOINT_AS", name),
                        fingerprint(*map(fingerprinted, (digits.train_x, x_val, digits.test_x)))
                        if comm.is_root else None, progress=say)
    metrics.of(run)  # metrics.csv's clock starts with the run
    loaded = ckpt.load()
    if loaded is not None:
        say(f"{prog}: resuming from {run.checkpoint_path} ({run.checkpoint_progress})")
    position = loaded[2] if loaded is not None else {}
    compare_position = position if position.get("stage") == "compare" else None
    if compare_position is not None:  # the main stage is done: its record and weights are in the checkpoint
        position = dict(position["main"], phase="done")
    warm_up(be, args.pretrainer, layers_from_args(be, args, digits.train_x.shape[1]), args.reduce_blocks)
    trace = Trace(comm)
    dp = Subset(comm, data_parallel_ranks(comm, args.dp_ranks)[:args.reduce_blocks])
    job = Job(be, comm, argparse.Namespace(**vars(args)), name, prog, layers_from_args(be, args, digits.train_x.shape[1]),
              digits, x_val, trace, guard, ckpt, position=position)
    main_params = _stage(job, scheme, loaded, dp.run)
    summary = dict(job.summary, dp_ranks=dp.size, **(extra or {}))
    greedy = None
    if args.compare_greedy:
        greedy, greedy_params = _compare(job, summary, main_params, loaded, compare_position, dp)
        main_params.update(greedy_params)
    with run.output("trace.json") as path:  # collective: every rank's events
        trace.to_chrome_json(path, extra={"scheme": name, **({"layout": job.config["layout"]}
                                                             if "layout" in job.config else {})})
    texts = {}
    if comm.is_root:  # where each rank's time went, per operation (aepar.report.profile)
        summary["profile"] = profile = profile_rows(trace.chrome_doc())
        texts["profile.csv"] = profile_csv(profile)
        if args.plot and any(r["epochs"] for r in profile):
            job.figures.setdefault("profile.png", lambda path: profile_png(
                profile, path, title=f"{name}, {comm.size} rank{'s' if comm.size > 1 else ''}: seconds per operation"))
    text = task_table(summary) if args.task == "classify" else tables(
        {COMPARED: greedy, name: summary} if greedy else {name: summary})
    if hasattr(scheme, "tables"):
        text += "\n" + scheme.tables(summary)
    config = {"sizes": summary["layers"], "pretrainer": args.pretrainer, "scheme": name, "epochs": args.epochs,
              "task": args.task, "finetune_epochs": args.finetune_epochs, "loss": args.loss,
              "optimizer": args.optimizer, "seed": args.seed, **job.config}
    if comm.is_root and args.task != "classify" and args.plot:
        draw = reconstructions_figure(be, job.layers, main_params, digits.test_x, loss=args.loss)
        if draw is not None:
            job.figures.setdefault("reconstructions.png", draw)
    finish(run, comm, summary, weights=Weights(name, main_params, args.epochs, config), tables=text,
           tables_file=TABLES_FILE, texts=texts, figures=job.figures, prog=prog, quiet=args.quiet, plot=args.plot)
    return summary


def _summary(job) -> dict:
    """What every stage's summary starts with."""
    d, be = job.digits, job.be
    return {"scheme": job.name, "task": job.args.task, "source": d.source, "n_train": int(d.train_x.shape[0]),
            "n_val": int(job.x_val.shape[0]), "n_test": int(d.test_x.shape[0]), "ranks": job.comm.size,
            "device": be.device, "kernels": be.kernel_set, "dtype": str(be.dtype),
            "blocks": job.args.reduce_blocks, "layers": [job.layers[0].n_in] + [l.n_out for l in job.layers],
            "pretrainer": job.args.pretrainer, "epochs_per_layer": job.args.epochs, "batch": job.args.batch,
            "seed": job.args.seed}


def _stage(job, scheme, loaded, runner) -> dict:
    """Pre-train ``job.layers`` with ``scheme``, then the task through ``runner(fn(comm))``
    (the data-parallel ranks). Fills ``job.summary``; returns the weights to save (rank 0)."""
    be, comm, position = job.be, job.comm, job.position
    phase = position.get("phase", "pretrain")
    job.summary.update(_summary(job))
    scheme.setup(job)
    if phase == "pretrain":
        job.loaded = loaded if position else None
        record = scheme.pretrain(job)
    else:  # pre-trained before the checkpoint
        restore_layers(be, job.layers, loaded[0], {}, prefix=job.prefix)
        record = position["pretrain"]
    if hasattr(scheme, "summarize"):
        job.summary.update(scheme.summarize(job, record))
    else:
        job.say(f"pre-training ({job.name}): {record['time_s']:.1f}s")
        job.summary.update(pretrain=record, pretrain_time_s=record["time_s"])
    layer_params = {f"{job.prefix}{k}": v for k, v in layers_to_params(be, job.layers).items()}
    if phase == "done":
        entries = position["task"]
        params = {k: v for k, v in loaded[0].items() if not k.startswith(f"{COMPARED}/")}
    else:
        base = job.outer() if job.outer is not None else ({}, {}, {})
        outer = lambda: (dict(base[0], **layer_params), base[1], dict(base[2], pretrain=record))  # noqa: E731
        resume = loaded if phase in ("finetune", "classify") else None
        result = runner(lambda sub: run_task(be, sub, job.layers, job.digits, job.args, trace=job.trace,
                                             ckpt=job.ckpt, guard=job.guard, resume=resume, outer=outer,
                                             prefix=job.prefix))
        entries, params = comm.bcast(result[0] if result is not None else None), (result or ({}, {}))[1]
        params = dict(layer_params, **params)
    job.summary.update(entries)
    job.state["record"], job.state["task"] = record, entries
    return params


def _compare(job, summary, main_params, loaded, position, dp):
    """Greedy pre-training and the task on the same rows and seed, on the data-parallel
    ranks: its summary (on every rank) and weights (rank 0) under greedy/."""
    comm = job.comm
    greedy = schemes.get(COMPARED).load()
    done = {"pretrain": job.state["record"], "task": job.state["task"]}
    job.say(f"{job.prog}: greedy pre-training on the same data and seed, data-parallel over {dp.size} rank(s)")

    def stage(sub):
        g = Job(job.be, sub, argparse.Namespace(**vars(job.args)), COMPARED, job.prog,
                layers_from_args(job.be, job.args, job.digits.train_x.shape[1]), job.digits, job.x_val, job.trace,
                job.guard, job.ckpt, position=dict(position or {}), prefix=f"{COMPARED}/",
                outer=lambda: (main_params, {}, {"stage": "compare", "prefix": f"{COMPARED}/", "main": done}))
        with job.trace.within(f"compared {COMPARED}"):  # apart from the main scheme's events (its profile)
            params = _stage(g, greedy, loaded if position is not None else None, lambda fn: fn(sub))
        return g.summary, params

    result = dp.run(stage)
    g_summary = comm.bcast(result[0] if result is not None else None)
    params = result[1] if result is not None else {}
    ratio = g_summary["pretrain_time_s"] / summary["pretrain_time_s"] if summary["pretrain_time_s"] > 0 else None
    key = "finetuned" if job.args.finetune_epochs else "pretrained"
    ge, se = g_summary["error"], summary["error"]
    summary.update(greedy=g_summary, speedup_vs_greedy=ratio, test_error_vs_greedy=se[key]["test"] / ge[key]["test"])
    job.say(f"{job.prog}: pre-training greedy on {dp.size} rank(s) {g_summary['pretrain_time_s']:.1f}s vs "
            f"{job.name} on {comm.size} rank(s) {summary['pretrain_time_s']:.1f}s: {job.name} "
            f"{ratio or float('nan'):.2f}x as fast; test error/digit greedy {ge[key]['test']:.3f} vs {job.name} "
            f"{se[key]['test']:.3f}")
    return g_summary, params
