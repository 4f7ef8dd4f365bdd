"""The model against every measured point in bench/results and this run's own: one row per
point with what was measured, what the model says there (on that point's machine, at its
size) and the relative error.
"""
from __future__ import annotations

from pathlib import Path

from bench.common import read_rows
from bench.scaling_model.measure import MPI_CSV, RESULTS, SPARSE_CSV, STACKED_CSV
from bench.scaling_model.model import (Compute, Network, Stack, collective_s, oversubscription, pipeline_s,
                                       sparse_run_s, stack_scheme_s, tree_allreduce_s, tree_reduce_s)

SIXTEEN = "scaling_16core"  # the seed's grid on the GPU machine's 16 vCPUs (its own peers.csv)


def _same_cpu(row: dict, here: dict) -> bool:
    return (row.get("cpu_model") or row.get("cpu")) == here["cpu_model"] and row.get("isa", here["isa"]) == here["isa"]


def xeon_scales(comp: Compute) -> dict:
    """Compute on the Intel Xeon (AVX-512) the older results ran on, relative to this
    machine: the same kernels measured there (bench/results, one thread) and here.

    ``sparse``: aepar's cost+gradient of 10k patches per evaluation (peers.csv); ``rbm``:
    one fused CD-1 epoch 784x1000 over 50,000 rows, batch 100, float32 (rbm_epoch.csv). The
    latest row of each on the host's own code path (not the other shapes, not AEPAR_ISA's).
    """
    out = {}
    sparse = sparse_scale(RESULTS / "peers.csv", comp, "Xeon")
    if sparse is not None:
        out["sparse"] = sparse
    for r in read_rows(RESULTS / "rbm_epoch.csv"):
        fused = r["implementation"] == "aepar (numba kernels)" or "1 block" in r["implementation"]
        if r["implementation"].startswith("aepar") and fused and "Xeon" in r["cpu_model"] and r["threads"] == "1" \
                and r.get("layer", "784x1000 bernoulli") in ("", "784x1000 bernoulli") \
                and r.get("batch") in (None, "", "100") and "[" not in r.get("isa", "") and comp.rbm_epoch_50k:
            out["rbm"] = float(r["seconds"]) * 50000 / int(r["samples"]) / comp.rbm_epoch_50k
    return out


def sparse_scale(peers_csv: Path, comp: Compute, cpu: str = "") -> float | None:
    """aepar's cost+gradient of 10k patches per evaluation in ``peers_csv`` (one thread, the
    last such row whose CPU names ``cpu``, on the host's own code path: not an ``AEPAR_ISA``
    row, whose isa column says "[numba target ...]") over the same measured here."""
    out = None
    for r in read_rows(peers_csv):
        if r.get("implementation") == "aepar" and cpu in r.get("cpu_model", "") and int(r["samples"]) == 10000 \
                and "[" not in r.get("isa", ""):
            out = float(r["seconds_in_cost_gradient"]) / int(r["evaluations"]) / comp.sparse["cg_10k_s"]
    return out


class Points:
    """The validation rows, added one measured point at a time."""

    def __init__(self, here: dict):
        self.here, self.rows = here, []

    def add(self, source, point, scheme, ranks, measured, pred, *, kind="run", machine_match, scale=1.0,
            over=False, duplicate="", note="", series=None, cpu="", machine=""):
        rel = (pred - measured) / measured if pred is not None and measured else None
        machine = machine or ("same as here" if machine_match else "Xeon (scaled)")
        self.rows.append({
            "source": source, "point": point, "series": series or f"{source}: {point}", "scheme": scheme,
            "ranks": ranks, "kind": kind, "machine": machine, "measured_cpu": cpu or self.here["cpu_model"],
            "measured": measured, "predicted": pred, "rel_error": rel,
            "abs_rel_error": abs(rel) if rel is not None else None, "machine_match": machine_match,
            "compute_scale": scale, "oversubscribed": over, "duplicate_of": duplicate, "note": note})


def _sparse_points(pts: Points, comp, net, scales):
    """The sparse autoencoder: strong.csv, weak.csv (Xeon), this run's own (here), and the
    16-vCPU grid (its compute scaled by the cost+gradient timed there, its own peers.csv)."""
    seen = set()
    sixteen = sparse_scale(RESULTS / SIXTEEN / "peers.csv", comp)
    for src in ("strong.csv", "weak.csv", SPARSE_CSV.name, f"{SIXTEEN}/strong.csv", f"{SIXTEEN}/weak.csv"):
        other = src.startswith(SIXTEEN)
        for r in read_rows(RESULTS / src):
            p, s_, ev = int(r["processes"]), int(r["samples"]), int(r["evaluations"])
            match = not other and _same_cpu(r, pts.here)
            sc = sixteen if other else 1.0 if match else scales.get("sparse")
            if sc is None:
                continue
            cores = int(r.get("cores") or 2)
            pred = sparse_run_s(comp, net, p, s_, int(r["iterations"]), evaluations=ev, scale=sc, cores=cores)
            key = (src.rsplit("/", 1)[0] if other else src != SPARSE_CSV.name, p, s_)
            dup = src.replace("weak", "strong") if src.endswith("weak.csv") and key in seen else ""
            seen.add(key)
            pts.add(src, f"aepar.sparse {s_} patches, {r['iterations']} iterations ({ev} evaluations)", "root", p,
                    float(r["seconds"]), pred["seconds"], machine_match=match, scale=sc, duplicate=dup,
                    series=f"{src}: aepar.sparse {s_} patches", cpu=r.get("cpu_model", ""),
                    machine=f"{cores}-vCPU Xeon (scaled)" if other else "",
                    note=("compute scaled by the cost+gradient timed on that machine; communication from the "
                          "np 2 fit here") if other else
                    "compute scaled by the sparse cost+gradient measured on both machines" if not match else
                    "this run's own")


def _xeon_sync_points(pts: Points, comp, net, scales):
    """The synchronized pipeline on the Xeon (sync_measured_quick.csv; makespan_quick's copies)."""
    quick = Stack("mnist5k quick", "rbm", (784, 1000, 500, 250, 30), n_train=3599, n_val=401, batch=100,
                  epochs=10, extras=(0, 5, 20, 40), blocks=8)
    sc = scales.get("rbm")
    for src in ("sync_measured_quick.csv", "makespan_quick.csv"):
        for r in read_rows(RESULTS / src):
            if r["kind"] != "measured" or sc is None:
                continue
            p = int(r["ranks"])
            pred = pipeline_s(comp, net, quick, p, replicas=p > quick.n_layers, mode=r["mode"], cores=2, scale=sc)
            pts.add(src, f"aepar.sync RBM 784-1000-500-250-30, 3599 rows, 10 epochs + 0,5,20,40, hand-over "
                         f"{r['mode']}", "sync", p, float(r["sync_s"]), pred["seconds"] if pred else None,
                    machine_match=False, scale=sc, over=p > 2,
                    duplicate="sync_measured_quick.csv" if src == "makespan_quick.csv" else "", cpu="Intel Xeon",
                    note="Xeon; compute scaled by one CD-1 epoch measured on both machines")


def _sweep_points(pts: Points, comp, net):
    """bench.pretrain's batch sweep and its speed-ups (AMD EPYC Zen 4, this kind of machine)."""
    sweep = read_rows(RESULTS / "pretrain_sweep.csv")
    for r in sweep:
        p, b, blocks = int(r["ranks"]), int(r["batch"]), int(r["blocks"])
        st = Stack("sweep", "ae", (784, 2000, 1000), n_train=2000, n_test=1000, batch=b, epochs=2, blocks=blocks)
        threads = 2 if p == 1 else 1  # bench.pretrain lets a lone process use both cores
        pred = stack_scheme_s(comp, net, st, r["scheme"], p, threads=threads, cores=2)
        pts.add("pretrain_sweep.csv", f"{r['scheme']} AE 784-2000-1000, 2000 rows, batch {b}, {blocks} block(s), "
                                      f"s per epoch", r["scheme"], p, float(r["epoch_s"]),
                pred["seconds"] / 2 if pred else None, machine_match=_same_cpu(r, pts.here))
    for r in read_rows(RESULTS / "pretrain_speedup.csv"):
        if not r["measured_speedup"]:
            continue
        p, b = int(r["ranks"]), int(r["batch"])
        st = Stack("sweep", "ae", (784, 2000, 1000), n_train=2000, n_test=1000, batch=b, epochs=2, blocks=1)
        base = stack_scheme_s(comp, net, st, "greedy", 1, cores=2)
        blocks = p if r["scheme"] == "data" else 1
        pr = stack_scheme_s(comp, net, Stack(**{**st.__dict__, "blocks": blocks}), r["scheme"], p, cores=2)
        pts.add("pretrain_speedup.csv", f"{r['scheme']} speed-up over greedy (1 process, 1 block), batch {b}",
                r["scheme"], p, float(r["measured_speedup"]), base["seconds"] / pr["seconds"] if pr else None,
                kind="speedup", machine_match=_same_cpu(r, pts.here), note="ratio of pretrain_sweep.csv's runs")


def _engine_points(pts: Points, comp, net):
    """bench.pretrain's accuracy runs and large batches: whole pre-trainings."""
    acc = Stack("accuracy", "ae", (784, 2000, 1000, 500, 100), n_train=4000, n_test=1000, batch=100, epochs=10,
                extras=(0, 1, 2, 2), blocks=8)
    for r in read_rows(RESULTS / "pretrain_accuracy.csv"):
        scheme = r["model"].split()[0]
        if scheme not in ("greedy", "data", "model", "sync", "hybrid") or "pre-training" not in r["model"]:
            continue
        p = int(r["ranks"])
        blocks = {"data": p, "model": 1}.get(scheme, 8)
        pred = stack_scheme_s(comp, net, Stack(**{**acc.__dict__, "blocks": blocks}), scheme, p,
                              threads=2 if p == 1 else 1, cores=2)
        pts.add("pretrain_accuracy.csv", f"{scheme} AE 784-2000-1000-500-100, 4000 rows, 10 epochs, batch 100, "
                                         f"pre-training s", scheme, p, float(r["pretrain_s"]),
                pred["seconds"] if pred else None, machine_match=_same_cpu(r, pts.here), over=p > 2)
    for r in read_rows(RESULTS / "pretrain_largebatch.csv"):
        b = 5000 if "5000" in r["config"] else 100
        st = Stack("largebatch", "rbm", (784, 1000, 500, 250, 30), n_train=60000, n_test=10000, batch=b, epochs=5)
        pred = stack_scheme_s(comp, net, st, "data", int(r["ranks"]), cores=2)
        pts.add("pretrain_largebatch.csv", f"data RBM 784-1000-500-250-30, Fashion-MNIST 60k, 5 epochs, {r['config']}",
                "data", int(r["ranks"]), float(r["pretrain_s"]), pred["seconds"] if pred else None,
                machine_match=_same_cpu(r, pts.here))


def _this_run_points(pts: Points, comp, net):
    """The same engine runs again here, now (measure-stacked)."""
    for r in read_rows(STACKED_CSV):
        p, b, scheme = int(r["ranks"]), int(r["batch"]), r["scheme"]
        if scheme == "sync":
            st = Stack("sync here", "rbm", (784, 1000, 500, 250, 30), n_train=3600, n_val=400, batch=b, epochs=10,
                       extras=(0, 5, 20, 40), blocks=int(r["blocks"]))
            pred = pipeline_s(comp, net, st, p, replicas=False, mode=r["mode"], cores=2)
            what = f"sync RBM 784-1000-500-250-30, 3600 + 400 rows, 10 epochs + 0,5,20,40, hand-over {r['mode']}"
        else:
            st = Stack("sweep", "ae", (784, 2000, 1000), n_train=2000, n_test=1000, batch=b, epochs=2,
                       blocks=int(r["blocks"]))
            pred = stack_scheme_s(comp, net, st, scheme, p, cores=2)
            what = f"{scheme} AE 784-2000-1000, 2000 rows, 2 epochs, batch {b}, {r['blocks']} block(s)"
        pts.add(STACKED_CSV.name, what, scheme, p, float(r["pretrain_s"]), pred["seconds"] if pred else None,
                machine_match=True, note=f"this run, fastest of {r.get('repeats', 1)} ({r.get('all_seconds', '')})",
                series=f"{STACKED_CSV.name}: {what.split(',')[0]} {b}")


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
            comm = tree_allreduce_s(net, nbytes, p, count) if rbm else tree_reduce_s(net, nbytes, p, count)
        else:
            comm = collective_s(net, "allreduce" if rbm else "reduce", nbytes, p)
        pts.add("determinism.csv", f"{r['what']}: {r['variant']}", "collective", p, float(r["seconds"]),
                (local + comm) * oversubscription(p, 2), kind="collective", machine_match=_same_cpu(r, pts.here),
                over=p > 2, note="copies and local adds of the rank's blocks + the sum")
    # measure-mpi there, one block per rank, against this machine's np 2 fits over log2 P levels
    for r in read_rows(RESULTS / SIXTEEN / "mpi_16ranks.csv"):
        p, n_, op = int(r["ranks"]), int(r["bytes"]), r["op"]
        if op in ("bcast", "reduce", "allreduce"):
            pred = collective_s(net, op, n_, p)
        elif op in ("tree_reduce", "tree_allreduce"):
            pred = (tree_reduce_s if op == "tree_reduce" else tree_allreduce_s)(net, n_, p, p)
        else:
            continue
        pts.add(f"{SIXTEEN}/mpi_16ranks.csv", f"{op} {n_} B at {p} ranks", "collective", p, float(r["seconds"]),
                pred, kind="collective", machine_match=False, cpu=r.get("cpu_model", ""),
                machine=f"{r['cores']}-vCPU Xeon", series=f"{SIXTEEN}/mpi_16ranks.csv: {op}",
                note="measured there; predicted from this machine's np 2 fits over log2 P levels")
    for r in mpi_rows:
        if r["op"] in ("tree_reduce", "tree_allreduce"):
            n_ = int(r["bytes"])
            pred = tree_reduce_s(net, n_, 2, 2) + (collective_s(net, "bcast", n_, 2) if r["op"] == "tree_allreduce"
                                                   else 0)
            pts.add(MPI_CSV.name, f"{r['op']} {n_} B (modelled from Send/Recv + add + Bcast fits)", "collective", 2,
                    float(r["seconds"]), pred, kind="collective", machine_match=True,
                    note="the fixed tree composed from the other fits, not fitted itself")


def validate(comp: Compute, net: Network, mpi_rows: list, here: dict) -> list:
    """One row per measured point: what was measured, the model's figure, the relative error."""
    scales = xeon_scales(comp)
    pts = Points(here)
    _sparse_points(pts, comp, net, scales)
    _xeon_sync_points(pts, comp, net, scales)
    _sweep_points(pts, comp, net)
    _engine_points(pts, comp, net)
    _this_run_points(pts, comp, net)
    _sum_points(pts, comp, net, mpi_rows)
    return pts.rows
