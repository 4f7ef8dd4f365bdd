"""Eager training of K convolutional autoencoders (Bhargava & Surana).

1. The K CAEs (each from its own seed) are spread over the ranks (aepar.parallel.ensemble:
   one per rank, several per rank in turn, or groups of ranks training one data-parallel).
2. Round by round, every model still going trains one more epoch with Adam; its train and
   validation loss and wall time are logged and a snapshot ``{name}_epoch{E}.h5`` is saved.
3. A model stops *eagerly*, well before its validation loss reaches its minimum: after
   ``epochs``, at a ``budget`` of seconds, or by the ``rule`` (K, DELTA): the validation
   loss improved by less than the fraction DELTA over the last K epochs. (The monolithic
   baseline trains the same way, with ``patience`` instead.)
4. The snapshot to combine is picked per model: the last, a given epoch, or the newest
   whose training time fits a budget.

A model's steps are the same bits on any number of ranks (fixed blocks, fixed-tree sums),
so the weights do not depend on the ranks or the grouping. The ends of the rounds are the
safe points: checkpoints hold every model's state there.
"""
from __future__ import annotations

from dataclasses import dataclass

from aepar import metrics
from aepar.errors import Diverged

__all__ = ["Member", "new_record", "stop_reason", "train_members", "snapshot_name", "flat_states", "saved_states",
           "current_record", "pick_epoch", "load_snapshot", "SCHEME"]

SCHEME = "eager"


@dataclass
class Member:
    """One CAE being trained: the model, its optimiser, its record and its stopping rules."""

    name: str
    model: object
    optimizer: object
    record: dict

    @property
    def done(self) -> bool:
        return self.record["stopped"] is not None


def new_record() -> dict:
    return {"epochs": [], "stopped": None}


def stop_reason(record: dict, *, epochs: int, budget=None, rule=None, patience=None) -> str | None:
    """Why a CAE stops after its last epoch, or None: ``epochs`` run, ``budget`` seconds
    spent, the eager ``rule`` (K, DELTA) met, or ``patience`` epochs without a new best."""
    ep = record["epochs"]
    val = [e["val_loss"] for e in ep]
    if rule is not None and len(val) > rule[0]:
        before = val[-1 - rule[0]]
        gain = (before - val[-1]) / before if before > 0 else 0.0
        if gain < rule[1]:
            return f"eager rule: validation loss improved {100 * gain:.1f}% over {rule[0]} epochs"
    if patience is not None and len(val) > patience and min(val[-patience:]) >= min(val[:-patience]):
        return f"no new best validation loss in {patience} epochs"
    if budget is not None and ep and ep[-1]["cum_s"] >= budget:
        return f"budget of {budget:g} s spent"
    if len(ep) >= epochs:
        return f"{epochs} epochs"
    return None


def train_members(be, ens, split, make, rules: dict, *, args, guard, ckpt, run, saved=None, outer=None,
                  say=None) -> dict:
    """Train the members of ensemble ``ens`` round by round (steps 1-3).

    ``make(index) -> (name, model)``: the CAE of model ``index`` (the same on every rank);
    ``rules``: :func:`stop_reason`'s keyword arguments; ``saved``: name -> host state
    (params, opt, record) of a checkpoint to go on from; ``outer() -> (params, opt_state,
    progress)``: what the rest of the run adds to every checkpoint; ``say(line, left=seconds)``:
    an epoch's progress line (aepar.cli.progress). Returns name -> host state of every member
    (rank 0; None elsewhere).
    """
    from aepar.guard import StepsOnly
    from aepar.parallel.data_parallel import reducer
    from aepar.rows import Shard

    sub, count = ens.sub, args.reduce_blocks
    members = _members(be, ens, make, args, saved)
    if members:  # this rank's CAEs are alike: one throw-away copy loads their kernels
        warm_up(be, make(next(iter(members))), split.train_x, count, args)
    train = Shard.of(be, split.train_x, count, sub.rank, sub.size)
    val = Shard.of(be, split.val_x, min(count, len(split.val_y)), sub.rank, sub.size)
    reduce, steps = reducer(sub), StepsOnly(guard, "the end of this round (every model's current epoch)")
    latest = dict(saved or {}) if ens.comm.is_root else None
    # the next round: the fewest epochs among the models still going
    epoch = min((len(s["record"]["epochs"]) for s in (saved or {}).values() if not s["record"]["stopped"]),
                default=0)
    eta = metrics.Eta(rules["epochs"], epoch)  # rounds; models stopped early make it shorter
    unsaved = False  # rounds trained since the last checkpoint
    with guard.training(SCHEME):
        while not ens.comm.bcast(all(s["record"]["stopped"] for s in latest.values())
                                     and len(latest) == ens.n_models if ens.comm.is_root else None):
            out, failed = {}, None
            for mb in members.values():
                if failed or mb.done or len(mb.record["epochs"]) > epoch:
                    continue
                failed = _one_epoch(mb, train, val, epoch, rules, be=be, sub=sub, reduce=reduce, steps=steps,
                                    guard=guard, run=run)
                if failed is None:
                    out[mb.name] = {"state": mb.model.state(), "record": mb.record}
            merged, summed, failed = ens.collect(out, guard.flags(), failed)
            if failed:  # every rank ends with it at the round's end
                err = Diverged(failed)
                err.collective = True
                raise err
            epoch += 1
            if ens.comm.is_root and merged:
                latest.update(merged)
                _end_of_round(run, merged, epoch, args, say, eta.left(epoch))
            checkpoint, stop = guard.decide(summed)
            unsaved = not (stop or checkpoint or guard.epoch_due(epoch))
            if not unsaved:
                _save(ckpt, latest, outer, f"{epoch} epochs", "signal" if stop else "periodic")
                if stop:
                    raise ckpt.interrupted()
    if unsaved:  # what follows (the next phase, the evaluations) resumes from here, not from rounds ago
        _save(ckpt, latest, outer, f"{epoch} epochs", "end of training")
    return latest


def warm_up(be, made, like, blocks, args):
    """One step of a throw-away copy of a run's CAE (``made``: ``make``'s (name, model)) on
    a batch of random images (rows of ``like``'s width) cut into the run's
    ``blocks``, with its own Adam, and its reconstruction error: the kernels its shapes
    take are compiled, or loaded from Numba's cache, here and not in the first timed
    epoch, which the budgets (``--budget``, ``--pick-by-budget``) and the figures of loss
    against seconds count."""
    from aepar.optim import Adam
    from aepar.resume import warm_up as warm_up_model
    from aepar.resume import warm_up_rows
    from aepar.rows import Shard

    model = made[1]
    x = Shard.of(be, warm_up_rows(model.batch, like.shape[1], blocks), blocks)
    warm_up_model(be, model, x, model.recon_error, optimizer=Adam(be, model.params, lr=args.cae_lr))


def _members(be, ens, make, args, saved) -> dict:
    """This rank's members (index -> Member), each with its own Adam, restored from ``saved``."""
    from aepar.optim import Adam

    members = {}
    for m in ens.mine:
        name, model = make(m)
        member = Member(name, model, Adam(be, model.params, lr=args.cae_lr), new_record())
        model.optimizer = member.optimizer
        if saved and name in saved:
            model.load_state(saved[name]["state"])
            member.record = saved[name]["record"]
        members[m] = member
    return members


def _one_epoch(mb, train, val, epoch, rules, *, be, sub, reduce, steps, guard, run) -> str | None:
    """One epoch of ``mb`` on the ranks of its group, logged and judged by ``rules``; the
    divergence message, or None."""
    from aepar.parallel.data_parallel import train_epoch

    t0 = sub.wtime()
    result = train_epoch(mb.model, train, epoch, sub, optimizer=mb.optimizer, guard=steps)
    be.synchronize()
    seconds = sub.allreduce(sub.wtime() - t0, op="max")
    val_loss = mb.model.recon_error(val, reduce)
    where = f"{mb.name} epoch {epoch + 1}"
    try:
        guard.check(val_loss, "the validation loss", where, run, sub)
        guard.check_params(mb.model.params, where, run, sub)
    except Diverged as e:
        return str(e)
    cum = (mb.record["epochs"][-1]["cum_s"] if mb.record["epochs"] else 0.0) + seconds
    mb.record["epochs"].append({"epoch": epoch + 1, "train_loss": result.means[0], "val_loss": val_loss,
                                "epoch_s": seconds, "cum_s": cum})
    mb.record["stopped"] = stop_reason(mb.record, **rules)
    return None


def _end_of_round(run, merged, epoch, args, say, left=None):
    """Root: every model's snapshot and metrics.csv row of this round, and one line."""
    from aepar import checkpoint

    rows = metrics.of(run)
    for name, state in sorted(merged.items()):
        e = len(state["record"]["epochs"])
        last = state["record"]["epochs"][-1]
        rows.add("pretrain", e, stage=name, train_loss=last["train_loss"], val_loss=last["val_loss"], lr=args.cae_lr)
        with run.output(snapshot_name(name, e)) as path:
            checkpoint.save(path, scheme=SCHEME, params=_part(state["state"], "params/"), epoch=e,
                            config={"model": name, "record": state["record"]["epochs"][-1], "lr": args.cae_lr})
    if say is not None:
        say(f"epoch {epoch:3d}  " + "  ".join(
            f"{n} val {s['record']['epochs'][-1]['val_loss']:7.3f}" + (" (stopped)" if s["record"]["stopped"] else "")
            for n, s in sorted(merged.items())), left=left)


def snapshot_name(name: str, epoch: int) -> str:
    return f"{name}_epoch{epoch:03d}.h5"


def _part(state: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def flat_states(states) -> tuple:
    """(params, opt_state, progress) of a checkpoint holding ``states`` (name -> host state)."""
    params, opt, records = {}, {}, {}
    for name, s in (states or {}).items():
        params.update({f"{name}/{k}": v for k, v in s["state"].items() if k.startswith("params/")})
        opt.update({f"{name}/{k}": v for k, v in s["state"].items() if k.startswith("opt/")})
        records[name] = s["record"]
    return params, opt, {"records": records}


def _save(ckpt, latest, outer, label, why):
    """The run's checkpoint: every member's latest state (rank 0's), plus ``outer()``."""
    params, opt, prog = outer() if outer is not None else ({}, {}, {})
    mine = flat_states(latest)
    ckpt.save({**params, **mine[0]}, {**opt, **mine[1]},
              dict(prog, records={**prog.get("records", {}), **mine[2]["records"]}), label, why)


def saved_states(resume) -> dict:
    """name -> host state from a checkpoint's (params, opt_state, progress)."""
    if resume is None:
        return {}
    params, opt, prog = resume
    both = {**params, **opt}
    return {name: {"state": _part(both, f"{name}/"), "record": current_record(record)}
            for name, record in prog.get("records", {}).items()}


# Fallback: the epoch records' names for their times before they took the ``_s`` suffix,
# as a checkpoint written by an older aepar holds them.
OLD_EPOCH_NAMES = {"seconds": "epoch_s", "cum_seconds": "cum_s"}


def current_record(record: dict) -> dict:
    """``record`` with every epoch's older time names read as today's."""
    epochs = [{OLD_EPOCH_NAMES.get(k, k): v for k, v in e.items()} for e in record["epochs"]]
    return {**record, "epochs": epochs}


def pick_epoch(record: dict, args) -> int:
    """The snapshot (1-based epoch) of a model to combine (step 4)."""
    ep = record["epochs"]
    if args.pick_epoch is not None:
        return min(args.pick_epoch, len(ep))
    if args.pick_by_budget is not None:
        fits = [e["epoch"] for e in ep if e["cum_s"] <= args.pick_by_budget]
        return fits[-1] if fits else 1
    return len(ep)


def load_snapshot(model, run, name, epoch, comm=None):
    """Give ``model`` the weights of its snapshot after ``epoch`` (read on rank 0, sent to
    every rank of ``comm``; None: rank 0 alone). Returns the model."""
    from aepar import checkpoint

    params = None
    if comm is None or comm.is_root:
        params = checkpoint.load(run.written(snapshot_name(name, epoch)), scheme=SCHEME).params
    if comm is not None:
        params = comm.bcast(params)
    model.load_state({f"params/{k}": v for k, v in params.items()})
    return model
