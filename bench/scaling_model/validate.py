"""The model against every measured point in bench/results and this run's own: one row per
point with what was measured, what the model says there (on that point's machine, at its
size) and the relative error.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.common import read_rows
from bench.scaling_model.measure import (MPI_CSV, RESULTS, SPARSE_CSV, STACKED_CSV, load_mpi, load_steps,
                                         memory_bandwidth, read_bandwidth, read_contention)
from bench.scaling_model.model import (Compute, Network, Stack, collective_s, contention_factor,
                                       halving_allreduce_s, memory_slowdown, oversubscription, pipeline_s, relinked,
                                       sparse_run_s, stack_scheme_s, sums_by_halving, tree_allreduce_s, tree_reduce_s)

SIXTEEN = "scaling_16core"  # the seed's grid on the GPU machine's 16 vCPUs (its own peers.csv)
# machines with their own links measured, by results folder: measure-mpi under mpirun there (its
# one-way send), a memory-bandwidth probe with 1..N processes at once (a log's JSON lines) and,
# where bench.gpu_node's sixteen step ran, measure-mpi at 2 ranks there (its own points)
OWN_LINKS = {SIXTEEN: (f"{SIXTEEN}/mpi_16ranks.csv", "gpu/device_log_run5.txt", f"{SIXTEEN}/mpi_2ranks.csv")}


def machine_of(row: dict) -> tuple:
    """The machine a result row was measured on: its CPU name, ISA string and cores, as the
    row states them (``cpu_model``, or ``cpu`` in bench.pretrain's tables). The cores tell
    apart the 2-vCPU and 16-vCPU Xeons, whose older rows carry the same name and ISA."""
    return (row.get("cpu_model") or row.get("cpu") or "", row.get("isa") or "", str(row.get("cores") or ""))


def machine_label(key: tuple) -> str:
    """A short name for a machine in the tables: the CPU name, its widest vector ISA, its cores."""
    isa = "AVX-512" if "avx512f" in key[1] else "AVX2" if "avx2" in key[1] else key[1]
    return f"{key[0]} ({isa}, {key[2]} cores)"


def folder_of(source: str) -> str:
    """The results folder of a validation source ('' for bench/results itself)."""
    return source.rsplit("/", 1)[0] if "/" in source else ""


def own_links(results: Path = RESULTS) -> dict:
    """Per results folder of :data:`OWN_LINKS` whose files are there: (that machine's one-way
    send, a :class:`~bench.scaling_model.model.Curve` of its fastest trials; its memory
    bandwidth, processes at once -> the slowest process's rate, from measure-contention's
    triad in that folder's contention.csv where it ran, else the probe's log; its own np 2
    points, op -> Curve, or None where they were not measured; the bandwidth's file)."""
    out = {}
    for folder, (mpi, log, pair) in OWN_LINKS.items():
        send = load_mpi(results / mpi)[0].get("send") if (results / mpi).exists() else None
        intra = load_mpi(results / pair)[0] if (results / pair).exists() else None
        triad = memory_bandwidth(read_contention(results / folder / "contention.csv"))
        if send is not None:
            out[folder] = (send, triad or read_bandwidth(results / log), intra if intra and "send" in intra else None,
                           f"{folder}/contention.csv" if triad else log)
    return out


def scaled_label(key: tuple) -> str:
    """A validation row's machine when it is not this one: its compute was scaled to it."""
    return machine_label(key) + ", scaled"


LAYERWISE_EPOCHS = ("rbm", "ae", "greedy")  # bench.block_tax's layer-wise workloads (rbm... its RBM sizes)


def kernel_scales(comp: Compute, here: tuple, results: Path = RESULTS) -> dict:
    """Per machine of bench/results (:func:`machine_of`), the same kernels timed there over
    here, one thread each: ``sparse`` (aepar's cost+gradient of 10k patches per evaluation,
    peers.csv) and ``layers`` (one fused CD-1 epoch 784x1000 over 50,000 rows, batch 100,
    float32, rbm_epoch.csv; and where both machines ran bench.block_tax, the median of that
    ratio and of each layer-wise epoch's there, CD-1, the autoencoder layer and greedy, in
    one block and in 8, per batch, each from its last day on its machine: one epoch's ratio
    moves with a VM's drift, several timed on other days hold the middle).

    One factor per kernel family and machine, because two CPUs' ratio differs by kernel (a
    DGEMM or clock ratio would give one number for both). Like is divided by like: where
    the same benchmark file has a row of ``here``, that row is the denominator; only
    without one does the compute measured here stand in (the two harnesses differ by ~10%
    on the same machine). The machine must match exactly: several Xeons share the name
    "Intel(R) Xeon(R) Processor", and their rows differ by the ISA, the cores or the family
    and model later rows carry. The last row of each machine counts, on the host's own
    code path only (not an ``AEPAR_ISA`` row, whose isa says "[numba target ...]").
    """
    timed: dict = {}  # family -> machine -> seconds in that family's own unit
    for path in (results / "peers.csv", results / SIXTEEN / "peers.csv"):
        for r in read_rows(path):
            if r.get("implementation") == "aepar" and int(r.get("samples") or 0) == 10000 \
                    and "[" not in r.get("isa", "") and r.get("threads", "1") == "1":
                timed.setdefault("sparse", {})[machine_of(r)] = \
                    float(r["seconds_in_cost_gradient"]) / int(r["evaluations"])
    for r in read_rows(results / "rbm_epoch.csv"):
        fused = r["implementation"] == "aepar (numba kernels)" or "1 block" in r["implementation"]
        if r["implementation"].startswith("aepar") and fused and r["threads"] == "1" \
                and r.get("layer", "784x1000 bernoulli") in ("", "784x1000 bernoulli") \
                and r.get("batch") in (None, "", "100") and "[" not in r.get("isa", ""):
            timed.setdefault("layers", {})[machine_of(r)] = float(r["seconds"]) * 50000 / int(r["samples"])
    measured_here = {"sparse": comp.sparse.get("cg_10k_s"), "layers": comp.rbm_epoch_50k}
    out: dict = {}
    for family, per_machine in timed.items():
        base = per_machine.get(here) or measured_here[family]
        if not base:
            continue
        for key, seconds in per_machine.items():
            if key != here:
                out.setdefault(key, {})[family] = seconds / base
    for key, ratios in _block_tax_ratios(here, results).items():
        if key != here:
            own = out.setdefault(key, {})
            own["layers"] = float(np.median([own["layers"], *ratios] if "layers" in own else ratios))
    return out


def _layerwise_epochs(results: Path) -> dict:
    """block_tax.csv's layer-wise epochs (:data:`LAYERWISE_EPOCHS`: CD-1 at its layer sizes,
    the autoencoder layers, greedy) by aepar, each workload and batch from its last day on
    its machine (a later run of some workloads alone leaves the others' as they were), on
    the host's own code path (not an ``AEPAR_ISA`` row): (machine, workload,
    implementation, batch, threads) -> seconds."""
    rows = [r for r in read_rows(results / "block_tax.csv")
            if r.get("implementation", "").startswith("aepar") and r.get("workload", "").startswith(LAYERWISE_EPOCHS)
            and "[" not in r.get("isa", "")]

    def run_of(r):
        return machine_of(r), r["workload"], int(r["batch"])
    last: dict = {}
    for r in rows:
        last[run_of(r)] = max(last.get(run_of(r), ""), (r.get("date") or "")[:10])
    return {(machine_of(r), r["workload"], r["implementation"], int(r["batch"]), int(r["threads"])): float(r["seconds"])
            for r in rows if (r.get("date") or "")[:10] == last[run_of(r)]}


def _block_tax_ratios(here: tuple, results: Path) -> dict:
    """Per machine, its layer-wise epochs at one thread (:func:`_layerwise_epochs`) over
    ``here``'s same epoch (workload, one block or 8, batch); {} where ``here`` never ran it."""
    epochs = _layerwise_epochs(results)
    ratios: dict = {}
    for (key, *case, threads), seconds in epochs.items():
        base = epochs.get((here, *case, threads))
        if threads == 1 and base:
            ratios.setdefault(key, []).append(seconds / base)
    return ratios


def thread_speedups(results: Path = RESULTS) -> dict:
    """Per machine of bench/results (:func:`machine_of`), per batch: what a second thread
    gains on a layer-wise epoch of 8 blocks on one process, one thread's epoch over two
    threads' (:func:`_layerwise_epochs`: the median of CD-1 and the autoencoder layer at
    784x1000, and greedy, whose steps aepar shares between its threads; not the smaller RBMs
    of the RBM sizes' workloads, which it partly keeps on one). Between 1 and 2: drift may
    not make a second thread cost, nor gain more than a thread."""
    epochs = _layerwise_epochs(results)
    gains: dict = {}
    for (key, workload, implementation, batch, threads), seconds in epochs.items():
        two = epochs.get((key, workload, implementation, batch, 2))
        if workload in LAYERWISE_EPOCHS and implementation == "aepar, 8 blocks" and threads == 1 and two:
            gains.setdefault(key, {}).setdefault(batch, []).append(seconds / two)
    return {key: {batch: min(2.0, max(1.0, float(np.median(g)))) for batch, g in per.items()}
            for key, per in gains.items()}


def own_steps(results: Path = RESULTS) -> dict:
    """Per machine, by its CPU name and ISA (:func:`machine_of` but the cores: under mpirun
    a row names the cores its rank may use, one, not the machine's), its links and a
    training step's sums measured there: a results folder's mpi_2ranks.csv with
    measure-mpi's ``<op>_step`` and ``straggle`` rows (the ratios and the straggle fraction
    of :func:`~bench.scaling_model.measure.load_steps`; that machine's own np 2 points, op
    -> Curve, of :func:`~bench.scaling_model.measure.load_mpi`; the file)."""
    out = {}
    for path in sorted(results.glob("*/mpi_2ranks.csv")):
        links, _, rows = load_mpi(path)
        ratios, straggle = load_steps(rows)
        if rows and (ratios or straggle):
            out[machine_of(rows[0])[:2]] = (ratios, straggle, links, f"{path.parent.name}/{path.name}")
    return out


class Points:
    """The validation rows, added one measured point at a time, each on its own machine."""

    def __init__(self, here: dict, scales: dict, comp: Compute, folders: dict | None = None,
                 links: dict | None = None, speedups: dict | None = None, steps: dict | None = None):
        self.here, self.scales, self.rows, self.comp = machine_of(here), scales, [], comp
        self.speedups = speedups or {}  # :func:`thread_speedups`
        self.steps = steps or {}  # :func:`own_steps`
        self.cores = int(here.get("cores") or 1)
        self.skipped: dict = {}  # (source, machine) -> points left out: no kernel of theirs timed there
        # a results folder of one other machine -> its measure-contention table (contention.csv there)
        self.folders = folders or {}
        self.links = links or {}  # a results folder of one other machine -> :func:`own_links`' entry

    def network(self, source: str, net: Network, ranks: int, row: dict | None = None) -> Network:
        """The links of ``source``'s machine at ``ranks`` ranks: this machine's (``net``), or
        where that machine's own send and memory bandwidth were measured (``links``), those
        :func:`~bench.scaling_model.model.relinked` to them; where its own np 2 points were
        measured too, those in place of this machine's (its link is in them; the memory
        shared by a level's copies is not). Where ``row``'s machine measured its np 2 points
        and a training step's sums (``steps``, :func:`own_steps`), those in place of this
        machine's."""
        key = machine_of(row) if row is not None else None
        if row is not None:  # its sums as the code of its day took them
            net = replace(net, halving=sums_by_halving(row.get("aepar")))
        if key is not None and key != self.here and key[:2] in self.steps:
            ratios, straggle, intra, _ = self.steps[key[:2]]
            net = replace(net, intra={**net.intra, **intra}, step_sums=ratios, straggle=straggle)
        own = self.links.get(folder_of(source))
        if own is None:
            return net
        send, bandwidth, intra, _ = own
        if intra is not None:  # its own points: their link is that machine's already
            net, send = replace(net, intra={**net.intra, **intra}), intra["send"]
        return relinked(net, send, memory_slowdown(bandwidth, ranks))

    def scale(self, source: str, row: dict, family: str, ranks: int = 1) -> float | None:
        """The compute factor of ``row``'s machine for a kernel ``family``: here, how much
        ``ranks`` ranks sharing its cores slow each other (measure-contention); elsewhere
        the :func:`kernel_scales` factor, times that contention where the point's folder
        holds its machine's (``folders``); None (the point is left out, and counted) where
        that machine never timed the family's kernel."""
        key = machine_of(row)
        if key == self.here:
            return self.shared(family, ranks)
        sc = self.scales.get(key, {}).get(family)
        if sc is None:
            where = (source, machine_label(key))
            self.skipped[where] = self.skipped.get(where, 0) + 1
            return None
        return sc * contention_factor(self.folders.get(folder_of(source), {}), family, ranks)

    def speedup(self, row: dict, batch: int, threads: int) -> float | None:
        """What ``threads`` threads gain over one on ``row``'s machine, at the measured batch
        nearest ``batch`` (:func:`thread_speedups`, two threads only); None where it was not
        measured (the model then splits the blocks evenly over the threads)."""
        per_batch = self.speedups.get(machine_of(row))
        if threads != 2 or not per_batch:
            return None
        return per_batch[min(per_batch, key=lambda b: (abs(math.log(b / batch)), b))]

    def shared(self, family: str, ranks: int) -> float:
        """This machine's contention factor for ``ranks`` ranks on its cores."""
        return self.comp.shared(family, min(ranks, self.cores))

    def add(self, source, point, scheme, ranks, measured, pred, *, row, kind="run", scale=1.0, over=False,
            duplicate="", note="", series=None):
        rel = (pred - measured) / measured if pred is not None and measured else None
        key = machine_of(row)
        match = key == self.here
        self.rows.append({
            "source": source, "point": point, "series": series or f"{source}: {point}", "scheme": scheme,
            "ranks": ranks, "kind": kind, "machine": "same as here" if match else scaled_label(key),
            "measured_cpu": key[0], "measured": measured, "predicted": pred, "rel_error": rel,
            "abs_rel_error": abs(rel) if rel is not None else None, "machine_match": match,
            "compute_scale": scale, "oversubscribed": over, "duplicate_of": duplicate, "note": note})


def _sparse_points(pts: Points, comp, net):
    """The sparse autoencoder: strong.csv, weak.csv, this run's own and the 16-vCPU grid, each
    with the compute of its own machine (the cost+gradient timed there)."""
    seen = set()
    for src in ("strong.csv", "weak.csv", SPARSE_CSV.name, f"{SIXTEEN}/strong.csv", f"{SIXTEEN}/weak.csv"):
        for r in read_rows(RESULTS / src):
            p, s_, ev = int(r["processes"]), int(r["samples"]), int(r["evaluations"])
            sc = pts.scale(src, r, "sparse", p)
            if sc is None:
                continue
            cores = int(r.get("cores") or 2)
            pred = sparse_run_s(comp, pts.network(src, net, p), p, s_, int(r["iterations"]), evaluations=ev,
                                scale=sc, cores=cores)
            key = (src.rsplit("/", 1)[0] if "/" in src else src != SPARSE_CSV.name, p, s_)
            dup = src.replace("weak", "strong") if src.endswith("weak.csv") and key in seen else ""
            seen.add(key)
            pts.add(src, f"aepar.sparse {s_} patches, {r['iterations']} iterations ({ev} evaluations)", "root", p,
                    float(r["seconds"]), pred["seconds"], row=r, scale=sc, duplicate=dup,
                    series=f"{src}: aepar.sparse {s_} patches",
                    note="this run's own" if src == SPARSE_CSV.name else
                    "compute scaled by the cost+gradient timed on that machine; communication from the np 2 points "
                    "here" + (", on that machine's send and memory" if folder_of(src) in pts.links else ""))


def _xeon_sync_points(pts: Points, comp, net):
    """The synchronized pipeline on the Xeon (sync_measured_quick.csv; makespan_quick's copies)."""
    quick = Stack("mnist5k quick", "rbm", (784, 1000, 500, 250, 30), n_train=3599, n_val=401, batch=100,
                  epochs=10, extras=(0, 5, 20, 40), blocks=8)
    for src in ("sync_measured_quick.csv", "makespan_quick.csv"):
        for r in read_rows(RESULTS / src):
            if r["kind"] != "measured":
                continue
            p = int(r["ranks"])
            sc = pts.scale(src, r, "layers", p)
            if sc is None:
                continue
            pred = pipeline_s(comp, pts.network(src, net, p, r), quick, p, replicas=p > quick.n_layers, mode=r["mode"],
                              cores=2, scale=sc)
            pts.add(src, f"aepar.sync RBM 784-1000-500-250-30, 3599 rows, 10 epochs + 0,5,20,40, hand-over "
                         f"{r['mode']}", "sync", p, float(r["sync_s"]), pred["seconds"] if pred else None,
                    row=r, scale=sc, over=p > 2,
                    duplicate="sync_measured_quick.csv" if src == "makespan_quick.csv" else "",
                    note="compute scaled by one CD-1 epoch timed on both machines")


def _sweep_points(pts: Points, comp, net):
    """bench.pretrain's batch sweep and its speed-ups."""
    for r in read_rows(RESULTS / "pretrain_sweep.csv"):
        p, b, blocks = int(r["ranks"]), int(r["batch"]), int(r["blocks"])
        sc = pts.scale("pretrain_sweep.csv", r, "layers", p)
        if sc is None:
            continue
        st = Stack("sweep", "ae", (784, 2000, 1000), n_train=2000, n_test=1000, batch=b, epochs=2, blocks=blocks)
        threads = 2 if p == 1 else 1  # bench.pretrain lets a lone process use both cores
        pred = stack_scheme_s(comp, pts.network("pretrain_sweep.csv", net, p, r), st, r["scheme"], p,
                              threads=threads, cores=2, scale=sc, speedup=pts.speedup(r, b, threads))
        pts.add("pretrain_sweep.csv", f"{r['scheme']} AE 784-2000-1000, 2000 rows, batch {b}, {blocks} block(s), "
                                      f"s per epoch", r["scheme"], p, float(r["epoch_s"]),
                pred["seconds"] / 2 if pred else None, row=r, scale=sc)
    for r in read_rows(RESULTS / "pretrain_speedup.csv"):
        if not r["measured_speedup"]:
            continue
        p, b = int(r["ranks"]), int(r["batch"])
        sc = pts.scale("pretrain_speedup.csv", r, "layers", p)
        if sc is None:
            continue
        st = Stack("sweep", "ae", (784, 2000, 1000), n_train=2000, n_test=1000, batch=b, epochs=2, blocks=1)
        one = pts.scale("pretrain_speedup.csv", r, "layers")  # both runs on the row's machine
        base = stack_scheme_s(comp, net, st, "greedy", 1, cores=2, scale=one)
        blocks = p if r["scheme"] == "data" else 1
        pr = stack_scheme_s(comp, pts.network("pretrain_speedup.csv", net, p, r),
                            Stack(**{**st.__dict__, "blocks": blocks}), r["scheme"], p, cores=2, scale=sc)
        pts.add("pretrain_speedup.csv", f"{r['scheme']} speed-up over greedy (1 process, 1 block), batch {b}",
                r["scheme"], p, float(r["measured_speedup"]), base["seconds"] / pr["seconds"] if pr else None,
                row=r, kind="speedup", note="ratio of pretrain_sweep.csv's runs")


def _engine_points(pts: Points, comp, net):
    """bench.pretrain's accuracy runs and large batches: whole pre-trainings."""
    acc = Stack("accuracy", "ae", (784, 2000, 1000, 500, 100), n_train=4000, n_test=1000, batch=100, epochs=10,
                extras=(0, 1, 2, 2), blocks=8)
    for r in read_rows(RESULTS / "pretrain_accuracy.csv"):
        scheme = r["model"].split()[0]
        if scheme not in ("greedy", "data", "model", "sync", "hybrid") or "pre-training" not in r["model"]:
            continue
        p = int(r["ranks"])
        sc = pts.scale("pretrain_accuracy.csv", r, "layers", p)
        if sc is None:
            continue
        blocks = {"data": p, "model": 1}.get(scheme, 8)
        threads = 2 if p == 1 else 1
        pred = stack_scheme_s(comp, pts.network("pretrain_accuracy.csv", net, p, r),
                              Stack(**{**acc.__dict__, "blocks": blocks}), scheme, p,
                              threads=threads, cores=2, scale=sc, speedup=pts.speedup(r, acc.batch, threads))
        pts.add("pretrain_accuracy.csv", f"{scheme} AE 784-2000-1000-500-100, 4000 rows, 10 epochs, batch 100, "
                                         f"pre-training s", scheme, p, float(r["pretrain_s"]),
                pred["seconds"] if pred else None, row=r, scale=sc, over=p > 2)
    for r in read_rows(RESULTS / "pretrain_largebatch.csv"):
        sc = pts.scale("pretrain_largebatch.csv", r, "layers", int(r["ranks"]))
        if sc is None:
            continue
        batch = int(re.search(r"batch (\d+)", r["config"]).group(1))
        epochs = int(r["epochs"].split("+")[0])
        st = Stack("largebatch", "rbm", (784, 1000, 500, 250, 30), n_train=60000, n_test=10000, batch=batch,
                   epochs=epochs, blocks=int(r["ranks"]))
        pred = stack_scheme_s(comp, pts.network("pretrain_largebatch.csv", net, int(r["ranks"]), r), st, "data",
                              int(r["ranks"]), cores=2, scale=sc)
        pts.add("pretrain_largebatch.csv", f"data RBM 784-1000-500-250-30, Fashion-MNIST 60k, {epochs} epochs, "
                                           f"{r['config']}", "data", int(r["ranks"]), float(r["pretrain_s"]),
                pred["seconds"] if pred else None, row=r, scale=sc)


def _this_run_points(pts: Points, comp, net):
    """The same engine runs again here, now (measure-stacked)."""
    for r in read_rows(STACKED_CSV):
        p, b, scheme = int(r["ranks"]), int(r["batch"]), r["scheme"]
        if scheme == "sync":
            st = Stack("sync here", "rbm", (784, 1000, 500, 250, 30), n_train=3600, n_val=400, batch=b, epochs=10,
                       extras=(0, 5, 20, 40), blocks=int(r["blocks"]))
            pred = pipeline_s(comp, net, st, p, replicas=False, mode=r["mode"], cores=2, scale=pts.shared("layers", p))
            what = f"sync RBM 784-1000-500-250-30, 3600 + 400 rows, 10 epochs + 0,5,20,40, hand-over {r['mode']}"
        else:
            st = Stack("sweep", "ae", (784, 2000, 1000), n_train=2000, n_test=1000, batch=b, epochs=2,
                       blocks=int(r["blocks"]))
            pred = stack_scheme_s(comp, net, st, scheme, p, cores=2, scale=pts.shared("layers", p))
            what = f"{scheme} AE 784-2000-1000, 2000 rows, 2 epochs, batch {b}, {r['blocks']} block(s)"
        pts.add(STACKED_CSV.name, what, scheme, p, float(r["pretrain_s"]), pred["seconds"] if pred else None,
                row=r, note=f"this run, fastest of {r.get('repeats', 1)} ({r.get('all_seconds', '')})",
                series=f"{STACKED_CSV.name}: {what.split(',')[0]} {b}")


def _tree_op_s(comp, net, op, nbytes, p):
    """measure-mpi's ``tree_reduce`` (one block per rank), ``tree_allreduce`` (the
    reduction, the root's copy of the sum into the output, and its Bcast: measure-mpi takes
    that way whatever the code would, as the code did before 0.8.51) or ``tree_halving``."""
    if op == "tree_reduce":
        return tree_reduce_s(net, nbytes, p, p)
    if op == "tree_halving":
        return halving_allreduce_s(net, nbytes, p)
    return tree_allreduce_s(replace(net, halving=False), nbytes, p, p) + comp.mem_s("copy", nbytes)


def _sum_points(pts: Points, comp, net, mpi_rows):
    """The sums alone: determinism.csv (under mpirun), the 16-vCPU machine's collectives at
    np 16, and this run's fixed-tree timings."""
    for r in read_rows(RESULTS / "determinism.csv"):
        if not r.get("ranks"):
            continue
        p = int(r["ranks"])
        rbm = r["what"].startswith("RBM")
        count, nbytes = (8, 4 * (784 * 1000 + 784 + 1000 + 2)) if rbm else (79, 8 * 4940)
        k = -(-count // p)
        local = k * comp.mem_s("copy", nbytes) + (k - 1) * comp.mem_s("add", nbytes)
        if "fixed tree" in r["variant"]:
            comm = tree_allreduce_s(pts.network("determinism.csv", net, p, r), nbytes, p, count) if rbm else \
                tree_reduce_s(net, nbytes, p, count)
        else:
            comm = collective_s(net, "allreduce" if rbm else "reduce", nbytes, p)
        pts.add("determinism.csv", f"{r['what']}: {r['variant']}", "collective", p, float(r["seconds"]),
                (local + comm) * oversubscription(p, 2), kind="collective", row=r, over=p > 2,
                note="copies and local adds of the rank's blocks + the sum")
    # measure-mpi there, one block per rank: priced from np 2 points as collective_s does, on that
    # machine's links (its send rows are their input, so not validated; sendrecv is unused)
    src = f"{SIXTEEN}/mpi_16ranks.csv"
    for r in read_rows(RESULTS / src):
        p, n_, op = int(r["ranks"]), int(r["bytes"]), r["op"]
        if op not in ("bcast", "reduce", "allreduce", "tree_reduce", "tree_allreduce", "tree_halving"):
            continue
        there = pts.network(src, net, p, r)
        pred = collective_s(there, op, n_, p) if op in ("bcast", "reduce", "allreduce") else \
            _tree_op_s(comp, there, op, n_, p)
        pts.add(src, f"{op} {n_} B at {p} ranks", "collective", p, float(r["seconds"]), pred, kind="collective",
                row=r, series=f"{src}: {op}",
                note="measured there; predicted from np 2 points (a tree or the bandwidth-optimal form)"
                     + (", on that machine's own links and memory" if there is not net else ""))
    for r in mpi_rows:
        if r["op"] in ("tree_reduce", "tree_allreduce", "tree_halving"):
            n_ = int(r["bytes"])
            pred = _tree_op_s(comp, net, r["op"], n_, 2)
            pts.add(MPI_CSV.name, f"{r['op']} {n_} B (modelled from Send/Recv + add + Bcast fits)", "collective", 2,
                    float(r["seconds"]), pred, kind="collective", row=r,
                    note="the fixed tree composed from the other fits (+ the root's copy for tree_allreduce) "
                         "+ TreeSum's own time per message (fitted on the tree_reduce rows <= 2 KB)")


def _tree_sum_points(pts: Points, comp, net):
    """bench.tree_sum: the fixed-tree sum on every rank both ways, timed side by side (up the
    tree and back by Bcast, and by halving, which the bench takes at every size)."""
    src = "tree_sum.csv"
    for r in read_rows(RESULTS / src):
        p, n_ = int(r["ranks"]), int(r["bytes"])
        there = pts.network(src, net, p, r)
        for way, op in (("tree_bcast", "tree_allreduce"), ("halving", "tree_halving")):
            pred = _tree_op_s(comp, there, op, n_, p)
            pts.add(src, f"fixed-tree sum on every rank, {way.replace('_', ' + ')}, {r['vector']}", "collective", p,
                    float(r[f"{way}_ms"]) / 1e3, pred, kind="collective", row=r, series=f"{src}: {way}",
                    note="8 blocks, one node of the tree per rank; composed from the np 2 points")


def validate(comp: Compute, net: Network, mpi_rows: list, here: dict) -> Points:
    """Every measured point: its ``rows`` (what was measured, the model's figure on that
    point's machine, the relative error), the ``scales`` used and the points ``skipped``.
    Each is priced as the code of its day ran (``Network.halving`` from its row's ``aepar``
    version; older code for a point without one)."""
    net = replace(net, halving=False)
    pts = Points(here, kernel_scales(comp, machine_of(here)), comp,
                 folders={SIXTEEN: read_contention(RESULTS / SIXTEEN / "contention.csv")}, links=own_links(),
                 speedups=thread_speedups(), steps=own_steps())
    _sparse_points(pts, comp, net)
    _xeon_sync_points(pts, comp, net)
    _sweep_points(pts, comp, net)
    _engine_points(pts, comp, net)
    _this_run_points(pts, comp, net)
    _sum_points(pts, comp, net, mpi_rows)
    _tree_sum_points(pts, comp, net)
    return pts
