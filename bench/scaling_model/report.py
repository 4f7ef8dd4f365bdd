"""The scaling model's outputs: predictions for 1-1024 ranks on each network profile, where
each scheme stops scaling, the plot and scaling_model.md; :func:`report` fits, validates,
predicts and writes them all from the measurement CSVs.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bench.common import write_rows
from bench.scaling_model.measure import (COMPUTE_CSV, CONTENTION_CSV, MPI_CSV, RESULTS, fastest_times, load_compute,
                                         load_steps,
                                         load_mpi, measured_on)
from bench.scaling_model.model import (OPS, PROFILES, RANKS, Compute, Network, Stack, efficiency,
                                       fit_tree_overhead, level_slowdowns, memory_slowdown, networks, sparse_run_s,
                                       stack_scheme_s, stops_scaling)
from bench.scaling_model.validate import OWN_LINKS, SIXTEEN, machine_label, machine_of, scaled_label, validate

PRED_CSV = RESULTS / "scaling_model.csv"
VALID_CSV = RESULTS / "scaling_model_validation.csv"
PNG = RESULTS / "scaling_model.png"
MD = RESULTS / "scaling_model.md"


# ==== predictions ================================================================================
WORKLOADS = {
    "sparse-10k": dict(scheme_set=("root",), samples=10000),
    "sparse-160k": dict(scheme_set=("root",), samples=160000),
    "stacked-b100": dict(scheme_set=("greedy", "data", "model", "sync", "hybrid"),
                         stack=Stack("MNIST 60k, batch 100", "rbm", (784, 1000, 500, 250, 30), n_train=60000,
                                     n_test=10000, batch=100, epochs=20, extras=(0, 5, 20, 40))),
    "stacked-b1000": dict(scheme_set=("greedy", "data", "model", "sync", "hybrid"),
                          stack=Stack("MNIST 60k, batch 1000", "rbm", (784, 1000, 500, 250, 30), n_train=60000,
                                      n_test=10000, batch=1000, epochs=20, extras=(0, 5, 20, 40))),
}



def predict_all(comp: Compute, nets: dict, machine: dict) -> list:
    """Every workload x scheme x profile x rank count. Speed-up and efficiency are against
    the scheme's own one-rank time (hybrid: sync's, the same plan in one process);
    ``speedup_vs_one_process`` against the fastest one-process run (the root-optimiser on
    one rank; for the stacked network one block on one rank: data's P = 1)."""
    rows, ones = [], {}
    for wname, w in WORKLOADS.items():
        for scheme in w["scheme_set"]:
            for pname, net in nets.items():
                times, info = {}, {}
                for p in RANKS:
                    shared = comp.shared("sparse" if scheme == "root" else "layers", min(p, net.ranks_per_node))
                    if scheme == "root":
                        r = sparse_run_s(comp, net, p, w["samples"], 400, scale=shared)
                        note = "" if r else f"{-(-w['samples'] // 128)} blocks of 128 < {p} ranks"
                    else:
                        st = w["stack"]
                        if scheme == "greedy":  # assumed: --reduce-blocks raised to the ranks when needed
                            st = Stack(**{**st.__dict__, "blocks": max(st.blocks, p)})
                        r = stack_scheme_s(comp, net, st, scheme, p, scale=shared)
                        note = "" if r else {"model": "one layer per rank: at most 4 ranks",
                                             "sync": "at most one rank per layer (hybrid beyond)",
                                             "hybrid": "needs more ranks than layers, at most batch (and blocks) "
                                                       "replicas per stage"}.get(scheme, "more ranks than the batch")
                    times[p] = r["seconds"] if r else None
                    info[p] = (r, note)
                if scheme in ("root", "sync", "data"):
                    ones[(wname, pname, scheme)] = times.get(1)
                if scheme == "hybrid":
                    times[1] = ones.get((wname, pname, "sync"))
                eff = efficiency(times)
                base = times.get(1)
                fastest1 = ones.get((wname, pname, "root" if scheme == "root" else "data"))
                for p in RANKS:
                    if scheme == "hybrid" and p == 1:
                        times[1] = None  # not a hybrid layout: the baseline only
                    r, note = info[p]
                    it = 400 if scheme == "root" else w["stack"].epochs
                    rows.append({
                        "workload": wname, "scheme": scheme, "profile": pname, "ranks": p,
                        "ranks_per_node": net.ranks_per_node, "runnable": r is not None,
                        "seconds": times[p], "iterations": it,
                        "iteration": "L-BFGS iteration" if scheme == "root" else "pre-training epoch of every layer",
                        "seconds_per_iteration": times[p] / it if times[p] is not None else None,
                        "compute_s": r.get("compute_s") if r else None, "comm_s": r.get("comm_s") if r else None,
                        "serial_s": r.get("serial_s") if r else None,
                        "speedup": base / times[p] if times[p] and base else None,
                        "speedup_vs_one_process": fastest1 / times[p] if times[p] and fastest1 else None,
                        "efficiency": eff.get(p) if times[p] is not None else None,
                        "detail": (r.get("layout") or r.get("mode") or "") if r else "",
                        "note": note or "predicted (model), not measured", **machine})
    return rows


# =============================================================================================


# ==== scaling_model.md ===========================================================================
def _stats(rows) -> tuple:
    errs = [r["abs_rel_error"] for r in rows if r["abs_rel_error"] is not None]
    return (len(errs), max(errs) if errs else None, float(np.median(errs)) if errs else None)


def _size(nbytes: int) -> str:
    """8 B, 32 KB, 8 MB: a message size for a table's head."""
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _pct(x):
    return f"{100 * x:.1f}%" if x is not None else "–"


def stop_table(pred: list) -> list:
    """Per (workload, scheme, profile): where efficiency first drops under 50% and where
    the time stops decreasing."""
    out = []
    keys = sorted({(r["workload"], r["scheme"], r["profile"]) for r in pred},
                  key=lambda k: (list(WORKLOADS).index(k[0]), k[1], list(PROFILES).index(k[2])))
    for w, s, pr in keys:
        times = {r["ranks"]: r["seconds"] for r in pred if (r["workload"], r["scheme"], r["profile"]) == (w, s, pr)}
        runnable = [p for p, t in times.items() if t is not None]
        if s == "hybrid":  # its one-rank baseline is sync on one rank (the same plan in one process)
            times[1] = next(r["seconds"] for r in pred if (r["workload"], r["scheme"], r["profile"], r["ranks"])
                            == (w, "sync", pr, 1))
        below, best, still = stops_scaling(times)
        out.append({"workload": w, "scheme": s, "profile": pr, "eff_below_50": below, "fastest_at": best,
                    "still_decreasing": still, "max_runnable": max(runnable) if runnable else None,
                    "best_s": times[best]})
    return out



def _head(machine, contended, how) -> list:
    """The title, what wrote it and when, on which machine."""
    L = ["# Scaling model: alpha-beta communication + measured compute, validated, extrapolated", "",
         f"Written by `{how}` on {time.strftime('%Y-%m-%d %H:%M')} "
         f"({machine['cpu_model']}, {machine['isa']}, {machine['cores']} cores, {machine['blas']}, "
         f"{machine['mpi']}). Model: `bench/scaling_model/` (its docstrings list the assumptions).", ""]
    L += ["Measured after the machine's other long benchmark ended; every measurement row carries "
          "the 1-minute load average at its time (1.0-1.9 here: this benchmark's own one or two "
          "processes).", ""]
    if contended:
        L += [f"**Timings contended**: {contended}", ""]
    return L


def _communication(links, resid, mpi_rows, tree_o) -> list:
    """Section 1: the fits of the collectives."""
    L = ["## 1. Communication fitted at np 2 (t = alpha + n / beta)", "",
         "Measured through aepar.comm (the wrappers the schemes call), 8 B - 64 MB, each operation "
         "timed alone after a barrier, per call the slowest rank's time; a trial is the fastest of its "
         "calls; "
         "3 rounds over all sizes x 3 trials. Fit on the fastest trial (this VM's timings of the same "
         "operation move 2-4x from one minute to the next, and other jobs' time slices hit whole trials: "
         "six runs of this measurement on one day gave allreduce beta 2.5-8.6 GB/s and one-way "
         "send beta 11-19 GB/s), least squares on the relative error, both parameters >= 0. "
         "The model's point-to-point term is the one-way `send`: half a ping-pong round trip "
         "(`sendrecv`, the textbook latency) was up to 5x slower for 1-4 MB here.", "",
         "| operation | what calls it | alpha (us) | beta (GB/s) | max rel. residual | t(8 B) | t(64 MB) |",
         "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    callers = {"bcast": "root-optimiser (θ each evaluation), model-parallel hand-over, TreeSum.allreduce",
               "reduce": "none (the sparse AE uses the fixed tree instead)",
               "allreduce": "data (15-618) per step; flags",
               "sendrecv": "(half a ping-pong round trip: the textbook latency; not used by the model)",
               "send": "one-way Send/Recv: every fixed-tree node, pipeline hand-overs (the model's p2p)",
               "tree_reduce": "root-optimiser (partials to the root)",
               "tree_allreduce": "greedy, sync/hybrid replicas per step: up the tree and back by Bcast",
               "tree_halving": "the same by halving (0.8.51 on: power-of-two ranks, 64 KB and more)"}
    meas = {(r["op"], int(r["bytes"])): float(r["seconds"]) for r in mpi_rows}
    for op in OPS:
        if op not in links:
            continue
        lk = links[op]
        small, big = meas.get((op, 8)), meas.get((op, 2 ** 26))
        L.append(f"| {op} | {callers[op]} | {lk.alpha * 1e6:.2f} | {lk.beta / 1e9:.2f} | {_pct(resid[op])} | "
                 f"{small * 1e6:.1f} us | {big * 1e3:.1f} ms |" if small and big else
                 f"| {op} | {callers[op]} | {lk.alpha * 1e6:.2f} | {lk.beta / 1e9:.2f} | {_pct(resid[op])} | – | – |")
    L += ["", "One Hockney line per operation misses the protocol switches (eager to rendezvous, cache "
          "to memory): the max residual says by how much. Inside a node the model takes each operation's "
          "measured points instead (its fastest trial per size, log-log between the sizes); the lines give "
          "the latencies of the bandwidth-optimal form.", "",
          "aepar's fixed tree adds its own time to each message: the tree_reduce rows of 2 KB and less "
          f"(one message and one add at np 2) took {tree_o * 1e6:.2f} us (median) more than the send fit "
          "and the add explain. That is TreeSum's Python around the message (its steps' loop, the receive "
          "buffer, the add's call; rows measured before 0.8.8, whose TreeSum walked its whole plan at every "
          "sum: under mpirun -np 2 on an Intel Xeon that version took about twice as long); the model "
          "charges it once per fixed-tree message, on every network. "
          "So the np 2 tree rows of section 4 are no longer independent of the model below 2 KB; the "
          "16-vCPU machine's tree rows (4 levels) still are.", ""]
    step_sums, straggle = load_steps(mpi_rows)
    if step_sums:
        L += ["A training step's sum, measured as a loop of steps issues it (each step about 5 ms of "
              "float32 products, the buffer written, a barrier, the sum): its time over the same operation "
              "alone at its fastest, and each rank's wait at the barrier for the slower one over the step's "
              "compute. The validation (section 4) prices every step's sum so, the wait growing with the "
              "ranks as the expected largest of that many normal draws; the predictions (section 5) do not.",
              "", "| operation | " + " | ".join(_size(n) for n in sorted(next(iter(step_sums.values())))) + " |",
              "| --- |" + " ---: |" * len(next(iter(step_sums.values())))]
        for op, table in step_sums.items():
            L.append(f"| {op} | " + " | ".join(f"{table[n]:.2f}x" for n in sorted(table)) + " |")
        L += ["", f"The wait for the slower rank: {straggle:.1%} of a step's compute.", ""]
    return L


def _compute(comp) -> list:
    """Section 2: the compute measured here."""
    sp = comp.sparse
    L = ["## 2. Compute measured here (one process, one thread; each figure the fastest of its repetitions)",
         "",
         f"- sparse AE 64-25 float64: {sp['block_s'] * 1e6:.1f} us per block of 128 patches "
         f"({sp['block_s'] / 128 * 1e9:.0f} ns per patch), serial part on the root {sp['serial_s'] * 1e3:.3f} ms "
         f"per evaluation (L-BFGS-B, assembly, Python), {sp['evals_per_iter']:.3f} evaluations per iteration; "
         f"cost+gradient of 10k patches {sp['cg_10k_s'] * 1e3:.3f} ms.",
         f"- one fused CD-1 epoch 784x1000, 50k rows, batch 100, float32: {comp.rbm_epoch_50k:.3f} s.",
         "- ranks sharing this machine (measure-contention: one process per core started together, the "
         "slowest copy's median over the same work alone, one thread each): "
         + ("; ".join(f"{fam} " + ", ".join(f"{n} at once {comp.shared(fam, n):.2f}x" for n in sorted(t) if n > 1)
                      for fam, t in sorted(comp.contention.items())) or "not measured")
         + " (applied to this machine's points and to the predictions, at the ranks per node; the "
         "16-vCPU machine's points take the same measurement made there, scaling_16core/contention.csv).",
         "- check of the composition: one-block steps timed inside train_epoch over the same step "
         "composed from the isolated measurements: "
         + ", ".join(f"{x:.2f}" for x in comp.in_loop_ratios)
         + f" (median {comp.in_loop:.2f}, applied to every gradient).",
         "- per layer (float32): one block's gradient at 100 rows, optimiser step (as train_epoch pays it after "
         "the gradients, where measured; alone in brackets), transform per 1000 rows, "
         "and 8 blocks in one step inside train_epoch (their factors, one sum of their products, the "
         "step) at batch 100 and 1000, against 8 one-block gradients of the same rows composed:", "",
         "| layer | gradient, 1 row (ms) | gradient, 100 rows (ms) | per row at 1024 (us) | step (ms) | "
         "transform / 1000 rows (ms) | 8 blocks, batch 100 (ms) | 8 blocks, batch 1000 (ms) |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def eight(k, batch):
        lay, rows = comp.layers[k], batch / 8
        if rows not in lay.get("block", {}):
            return "–"
        step = comp.blocks(k, 8, rows) + comp.mem_s("copy", lay["grad_bytes"]) + lay["apply"]
        return f"{step * 1e3:.2f} ({step / (8 * comp.leaf(k, rows) + lay['apply']):.2f}x)"
    for k, lay in comp.layers.items():
        alone = f" ({lay['apply_isolated'] * 1e3:.3f} alone)" if "apply_isolated" in lay else ""
        L.append(f"| {k} | {comp.leaf(k, 1) * 1e3:.3f} | {comp.leaf(k, 100) * 1e3:.3f} | "
                 f"{comp.leaf(k, 1024) / 1024 * 1e6:.1f} | {lay['apply'] * 1e3:.3f}{alone} | "
                 f"{lay['transform_row'] * 1e6:.3f} | {eight(k, 100)} | {eight(k, 1000)} |")
    return L


def _models(comp, tree_o) -> list:
    """Section 3: the models, in words."""
    sp = comp.sparse
    L = ["", "## 3. The models (per iteration; P ranks, blocks of the fixed decomposition)", "",
         f"- **root-optimiser** (aepar.sparse, per evaluation; {sp['evals_per_iter']:.3f} evaluations per "
         "L-BFGS iteration as measured): T = Bcast(8 (n_theta + 1) B = 26 KB, P) + block_s x ceil(blocks / P) + "
         "TreeReduce(8 (n_partials + 1) B = 40 KB over the blocks' tree, P) + serial_s (root: assembly, "
         "L-BFGS-B). Blocks of 128 patches: P <= blocks (79 for 10k patches).",
         "- **data-parallel** (15-618 `data`, per step of one batch): T = leaf(ceil(B / P) rows) + copy(g) + "
         "Allreduce(g, P) + step(g), g = the packed float32 gradient (3.1 MB for 784x1000); an epoch "
         "ceil(n / B) steps, then the transform of the rank's rows. P <= B.",
         "- **greedy** (fixed tree, per step): blocks(k, ceil(B / blocks)) ceil(k / threads) / k + "
         "TreeReduce(g) + Bcast(g) + copy(g) + step(g), k = ceil(blocks / P) (blocks raised to P beyond 8); "
         "blocks(k, r) = k times one block's share of the measured 8-block step at r rows per block "
         "(one block: leaf(r)). Threads: a layer whose rank's step is below aepar's SHARED_STEP_FLOPS "
         "trains on one thread, as aepar does; on more, the step and the transform are divided by what a "
         "second thread gained on that machine (block_tax.csv: 8-block layer-wise epochs at one thread over "
         "two, the median of CD-1, the autoencoder layer and greedy, each from its last day there), or split "
         "evenly where it was not measured.",
         "- **model-parallel** (per epoch slot; the slots are aepar.parallel.planner's): max over ranks "
         "(refresh of its input through the changed layers below + one one-block epoch of its layer) + one "
         "Bcast per trained layer's weights + 3 small Allreduces; between groups every rank passes the "
         "rows through the group. P <= layers.",
         "- **pipeline** (sync P <= layers / hybrid P > layers; aepar.parallel.planner's pipeline): the "
         "executor's plan (FLOP clock, extras 0,5,20,40) replayed with stage epochs = steps x greedy step "
         "over the stage's replicas (+ validation rows), hand-overs = transform of the stage's rows + "
         "Send/Recv of its activations (data mode) or the consumer's recompute (weights mode; the weights' "
         "message is not charged), the faster mode as `auto` picks.",
         "- Collectives: inside a node min(a tree of Li levels, each that operation as measured at np 2 (its "
         "points, section 1); 2 Li latencies + 2 (P-1)/P of what the bytes took at np 2); across nodes Le more "
         "levels at the profile's link (+ an add per byte for sums), min(that tree, 2x latency + 2 (P-1)/P n / "
         "beta). The fixed tree: TreeSum's own plan simulated "
         "message by message, each "
         f"message + {tree_o * 1e6:.2f} us of TreeSum's own time (section 1); its sum on every rank, where "
         "TreeSum halves (0.8.51 on: power-of-two ranks holding a node each, 64 KB and more), log2 P swaps of "
         "halving pieces with an add, then the pieces back, each swap two one-way sends (a record of older "
         "code, or without its aepar version, is priced up the tree and back by Bcast, as it ran). On the "
         "16-vCPU machine the "
         "bytes of those points move on its own link and memory (section 4). "
         "Compute: the busiest rank's, times the measured contention of the ranks sharing a node, times "
         "active threads / cores when oversubscribed (validation only).", ""]
    return L


def _own_links(links, here_send) -> list:
    """Section 4's inputs of the 16-vCPU machine, whose own links were measured: the link
    factor per size and the memory slowdown per tree level ([] where they are missing)."""
    if SIXTEEN not in links:
        return []
    (send, bandwidth, intra, source), (mpi, _, pair) = links[SIXTEEN], OWN_LINKS[SIXTEEN]
    n, levels = sorted(bandwidth), level_slowdowns(bandwidth, 16)
    if intra is not None:
        L = [f"**The 16-vCPU machine's links** ({SIXTEEN}; Intel Xeon family 6 model 207). Its collectives "
             "at 16 ranks (mpi_16ranks.csv: measure-mpi under `mpirun -np 16`) are predicted from that "
             f"machine's own np 2 points ({pair}: measure-mpi under `mpirun -np 2` there, fastest trials, in "
             "place of this machine's), as section 3 prices collectives, their bytes slowed as a level's copies share "
             "its memory. The inputs, measured there and not validated:", ""]
    else:
        L = [f"**The 16-vCPU machine's links** ({SIXTEEN}; Intel Xeon family 6 model 207). Its collectives "
             "at 16 ranks (mpi_16ranks.csv: measure-mpi under `mpirun -np 16`) are predicted from this "
             "machine's np 2 points as section 3 prices collectives, with their bytes moved as that machine moves "
             f"them ({pair}, that machine's own np 2 points, was not measured). Two inputs, measured there "
             "and not validated:", "",
             f"- its one-way `send` under `mpirun -np 16` ({mpi}'s send rows, fastest trials) over this "
             "machine's at np 2 (table): each operation's time beyond its smallest message's (what its "
             "bytes take) is multiplied by this factor at its size (log-log between the sizes). The "
             "latencies stay this machine's: a call timed there includes the ranks' skew leaving the "
             "barrier before it, which a tree pays once, not per level, and the small sends there do not "
             f"grow with the size ({send.t(8) * 1e6:.1f} us at 8 B, {send.t(64) * 1e6:.1f} us at 64 B)."]
    L += [
         "- its memory with ranks copying at once: a STREAM triad in "
         + ", ".join(str(k) for k in n) + " processes at once, the slowest process "
         + (", ".join(f"{bandwidth[k]:.1f}" for k in n) + f" GB/s ({source}, the same day)"
            if source.endswith(".txt") else ", ".join(f"{bandwidth[k]:.2f}" for k in n)
            + f" of its rate alone ({source}: measure-contention's memory triad)") + ". Level k of a "
         "binomial tree copies in 2^k processes at once and waits for its slowest pair: "
         + ", ".join(f"{x:.2f}x" for x in levels) + " at levels 1-4, a mean of "
         f"{memory_slowdown(bandwidth, 16):.2f}x over the tree of 16 ranks ("
         + ", ".join(f"{memory_slowdown(bandwidth, p):.2f}x over {p}" for p in (2, 4, 8)) + ").",
         "- not counted twice: " + ("the np 2 points ran two ranks alone on that machine" if intra is not None
                                     else "the send rows moved one pair's bytes while the other 14 ranks waited "
                                          "in the barrier, so they hold that machine's link with 16 ranks "
                                          "started but two copying")
         + f" ({levels[0]:.2f}x in the triad's terms); the triad's slowdown is what a level's pairs "
         "copying at once add.",
         "- the whole runs there (strong.csv, weak.csv) take the same links at their ranks. "
         + ("Its send and sendrecv rows at 16 ranks are not used" if intra is not None else
            "The send rows are inputs and sendrecv (half a ping-pong) is not used")
         + ": neither is in the tables below.", ""]
    if intra is not None:
        return L
    L += ["| bytes | send here, np 2 (us) | send there, np 16 (us) | factor on the bytes' time |",
          "| ---: | ---: | ---: | ---: |"]
    L += [f"| {int(b)} | {here_send.t(b) * 1e6:.1f} | {t * 1e6:.1f} | {t / here_send.t(b):.2f} |"
          for b, t in zip(send.sizes, send.times)]
    L.append("")
    return L


def _validation(valid, machine, scales, skipped, links=None, here_send=None, steps=None) -> list:
    """Section 4: the model against every measured point."""
    here = machine_of(machine)
    scaled = {r["machine"] for r in valid if not r["machine_match"] and r["kind"] != "collective"}
    L = ["## 4. Validation against every measured point", ""]
    L += ["Machines: each point is predicted on the machine it was measured on, named by the CPU, ISA and "
          f"cores its row records. Here is {machine_label(here)}. Elsewhere the model's compute is multiplied by "
          "the ratio of the *same* kernel timed on that machine and here, one thread each, one factor per "
          "kernel family: `sparse` (aepar's cost+gradient of 10k patches, peers.csv) for the sparse "
          "autoencoder, `layers` (one fused CD-1 epoch 784x1000, rbm_epoch.csv; where both machines ran "
          "bench.block_tax, the median of that ratio and of its layer-wise epochs' there at one thread) for the "
          "stacked schemes. "
          "Two CPUs' ratio differs by kernel, so a DGEMM or clock ratio would not do. Communication "
          "uses this machine's np 2 points (section 1) on every machine, on the 16-vCPU machine with "
          "their bytes on its own link and memory, and where a machine measured its own np 2 points those "
          "(below); elsewhere the model knows nothing of another machine's links, memory bandwidth or ranks "
          "sharing it. The factors used:", ""]
    L += [f"- {machine_label(k)}: " + ", ".join(f"{fam} {v:.3f}" for fam, v in sorted(f.items()))
          for k, f in sorted(scales.items()) if scaled_label(k) in scaled]
    if skipped:
        L += ["", "Left out, because that machine never timed the kernel its factor needs:", ""]
        L += [f"- {src}: {n} point(s) on {m}" for (src, m), n in sorted(skipped.items())]
    if steps:
        L += ["", "The np 2 points and a training step's sums measured on the point's machine (measure-mpi "
              "there, its step rows included; section 1), in place of this machine's:", ""]
        for (cpu, isa), (ratios, straggle, _, src) in sorted(steps.items()):
            spans = ", ".join(f"{op} {min(t.values()):.2f}-{max(t.values()):.2f}x" for op, t in sorted(ratios.items()))
            vector = "AVX-512" if "avx512f" in isa else "AVX2" if "avx2" in isa else isa
            L.append(f"- {cpu} ({vector}; `{src}`): a step's sum over the same "
                     f"op alone at its fastest, by size: {spans}; the wait for the slower rank {straggle:.1%} of a "
                     "step's compute")
    L += [""] + _own_links(links or {}, here_send)
    L += ["Time and code drift: a row records its machine but not the code it ran, so a point measured "
          "before a kernel change is held against today's compute (pretrain_accuracy.csv's greedy ran "
          "its 8 blocks before they became one factored sum). And a 2-vCPU VM drifts: on the AVX2 AMD EPYC, "
          "2026-11-29, measure-compute's one-block gradient of the 784-2000 layer at 100 rows took 27, 12, "
          "20 and 20 ms in four runs within two hours, and the same `mpirun -np 2 ... --scheme data --batch "
          "2000` run took 0.99-2.1 s in three consecutive tries on the AVX-512 EPYC: single points carry "
          "+-30% of machine noise whatever the model.", "",
          "| source | kind | points | machine | max abs. rel. error | median |",
          "| --- | --- | ---: | --- | ---: | ---: |"]
    for src in sorted({r["source"] for r in valid}):
        for kind in ("run", "speedup", "collective"):
            rs = [r for r in valid if r["source"] == src and r["kind"] == kind]
            if not rs:
                continue
            n, mx, md = _stats(rs)
            mach = rs[0]["machine"]
            L.append(f"| {src} | {kind} | {n} | {mach} | {_pct(mx)} | {_pct(md)} |")
    uniq = [r for r in valid if not r["duplicate_of"]]
    lines = []
    for label, sel in (("whole runs, all machines", lambda r: r["kind"] == "run"),
                       ("whole runs, one core per rank (not oversubscribed)",
                        lambda r: r["kind"] == "run" and not r["oversubscribed"]),
                       ("whole runs, this machine's kind only", lambda r: r["kind"] == "run" and r["machine_match"]),
                       ("speed-up ratios", lambda r: r["kind"] == "speedup"),
                       ("collectives alone, np 2 here (not oversubscribed)",
                        lambda r: r["kind"] == "collective" and not r["oversubscribed"] and r["ranks"] == 2
                        and r["machine_match"]),
                       ("collectives alone, np 2 on other machines",
                        lambda r: r["kind"] == "collective" and r["ranks"] == 2 and not r["machine_match"]),
                       ("collectives alone, np 16 on the 16-vCPU machine",
                        lambda r: r["kind"] == "collective" and r["ranks"] == 16)):
        n, mx, md = _stats([r for r in uniq if sel(r)])
        lines.append(f"| {label} | {n} | {_pct(mx)} | {_pct(md)} |")
    L += ["", "Over unique points (copies in makespan_quick.csv and the weak/strong shared point counted once):", "",
          "| subset | points | max abs. rel. error | median |", "| --- | ---: | ---: | ---: |"] + lines
    worst = sorted([r for r in uniq if r["abs_rel_error"] is not None], key=lambda r: -r["abs_rel_error"])[:6]
    L += ["", "Largest errors:", ""] + [
        f"- {r['source']}: {r['point']}, {r['ranks']} rank(s): measured {r['measured']:.4g}, predicted "
        f"{r['predicted']:.4g} ({100 * r['rel_error']:+.0f}%)" + (" - oversubscribed" if r["oversubscribed"] else "")
        for r in worst]
    L += ["", "Not validated: eager_*.csv (independent CAE ensembles, no per-step collective to model) and the "
          "simulated rows of makespan_*.csv (model output, not measurements).", ""]
    return L


def _stops(pred, ranks_per_node) -> list:
    """Section 5: where each scheme stops scaling."""
    L = [f"## 5. Where each scheme stops scaling ({ranks_per_node} ranks per node: the measured links inside a "
         "node, the profile between nodes)", "",
         "Profiles (typical MPI figures, not measured here):", ""]
    L += [f"- **{k}**: alpha {v['alpha'] * 1e6:g} us, beta {v['beta'] / 1e9:g} GB/s - {v['source']}"
          for k, v in PROFILES.items()]
    L += ["", "Workloads: sparse AE 64-25, 10k / 160k patches, 400 L-BFGS iterations (root-optimiser, "
          "aepar.sparse); stacked RBMs 784-1000-500-250-30, float32, 60k MNIST rows, 20 epochs per layer, "
          "batch 100 / 1000 (greedy: fixed tree with --reduce-blocks raised to the ranks; data: Allreduce; "
          "model: a layer per rank; sync: one rank per layer with extras 0,5,20,40; hybrid: sync + replicas). "
          "Efficiency = T(1) / (P T(P)) against the scheme's own one-rank time (hybrid: sync's).", "",
          "| workload | scheme | profile | efficiency < 50% at P | fastest at P | runs up to P | best seconds |",
          "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in stop_table(pred):
        fast = f"{r['fastest_at']}" + (" (still falling)" if r["still_decreasing"] else "")
        L.append(f"| {r['workload']} | {r['scheme']} | {r['profile']} | {r['eff_below_50'] or 'never'} | "
                 f"{fast} | {r['max_runnable']} | {r['best_s']:.4g} |")
    return L


def _left_out(links, own=None) -> list:
    """Section 6: what the model leaves out."""
    jump = {op: links[op].t(2 ** 26) / links[op].t(2 ** 24) for op in ("reduce", "allreduce") if op in links}
    own_points = (own or {}).get(SIXTEEN, (None, None, None))[2] is not None
    L = ["", "## 6. What the model leaves out", "",
         "- Memory-bandwidth contention between the ranks of a node, on machines where measure-contention "
         "did not run: ranks are modelled there as independent one-thread processes (compute / P), so "
         "predictions with many ranks per node are optimistic.",
         "- Another machine's collectives as such: they are this machine's np 2 points composed over "
         "binomial levels, with this machine's cache sizes and MPI's choices at np 2 in them (here a "
         "64 MB reduce / allreduce took " + " / ".join(f"{v:.0f}x" for v in jump.values())
         + " its 16 MB time, past the 32 MiB L3); Open MPI's own algorithms at 16 ranks (segmented, "
         "pipelined, bandwidth-optimal) are not modelled. "
         + ("The 16-vCPU machine's collectives are its own np 2 points composed the same way. "
            if own_points else "Only the bytes' time moves to the 16-vCPU machine's link and memory; the "
            "latencies are this machine's everywhere. ")
         + "Where a machine's own links were not measured, they are this machine's.",
         "- The memory slowdown of a tree level (the triad's) applies to all of its bytes, in cache or not; "
         "allreduce's levels are priced as the binomial tree's (2^k processes copying at level k), not as "
         "recursive doubling's (every rank at every level); the adds of the sums and TreeSum's own time per "
         "message stay this machine's.",
         "- Network topology, congestion and collective algorithms' real switch points: one alpha/beta per "
         "profile, binomial or bandwidth-optimal form chosen by the lower cost.",
         "- Stragglers and OS noise: the slowest rank is the one with the most blocks, never a slow node.",
         "- The fixed tree's messages are serialised per rank along TreeSum's plan; Open MPI's eager sends "
         "would let a sender run ahead (pessimistic for small messages).",
         "- Start-up (MPI_Init, data loading, compilation), checkpoints, test-set evaluations, fine-tuning.",
         "- The pipeline's waits are its plan's (FLOP clock) replayed with modelled stage costs; the "
         "real-time newest-wins hand-over is not modelled.",
         "- The compute per block is measured at 1-1024 rows and extrapolated linearly beyond; caches "
         "behave differently when a rank's data shrinks with P (superlinear effects are not modelled), "
         "and many blocks per rank (greedy's 8 gradient rows of 6 MB) spill the cache the isolated "
         "measurement keeps warm: greedy with 8 blocks is the most under-predicted scheme.",
         "- TreeSum.allreduce's Bcast of a freshly written buffer took 2-4x the Bcast fit for "
         "64 KB-2 MB here (cache and single-copy state): the composed tree_allreduce is optimistic "
         "there (scaling_model_mpi.csv rows in the validation). A greedy step's sum at 2 ranks on one "
         "node is therefore the call as measured, less the root's copy; beyond 2 ranks it is composed.",
         "- Fresh allocations: determinism.csv's RBM rows copy 4 leaves of 3 MB into new arrays "
         "each repetition (page faults); the model charges cache-speed copies and misses ~8 ms.",
         "- Oversubscription (validation only): compute x active ranks / cores; the pipeline's "
         "sleeping stages count by their average load (one replay, then a second with that factor).", ""]
    return L


def write_markdown(path, links, resid, mpi_rows, valid, pred, comp, machine, contended, scales, skipped,
                   ranks_per_node, how="python -m bench.scaling_model", tree_o=0.0, own=None, steps=None):
    sections = (_head(machine, contended, how), _communication(links, resid, mpi_rows, tree_o), _compute(comp),
                _models(comp, tree_o), _validation(valid, machine, scales, skipped, own, links.get("send"), steps),
                _stops(pred, ranks_per_node), _left_out(links, own))
    Path(path).write_text("\n".join(line for section in sections for line in section) + "\n")


# ==== the plot and the whole report ==============================================================
def plot(path, valid, pred):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels = [("root", "root-optimiser (aepar.sparse)"), ("data", "data-parallel, Allreduce (15-618 data)"),
              ("greedy", "greedy, fixed-tree sum"), ("model", "model-parallel (15-618)"),
              ("sync", "pipeline: sync (P <= 4), hybrid (P > 4)")]
    fig, grid = plt.subplots(2, 3, figsize=(15, 9.5))
    axes = list(grid.ravel())
    styles = {"10GbE": ":", "25GbE": "-.", "100GbE": "--", "IB-HDR": "-"}
    colors = {"sparse-10k": "C0", "sparse-160k": "C1", "stacked-b100": "C2", "stacked-b1000": "C3"}
    for ax, (scheme, title) in zip(axes, panels):
        schemes = ("sync", "hybrid") if scheme == "sync" else (scheme,)
        for w in WORKLOADS:
            for pr in PROFILES:
                rows = [r for r in pred if r["workload"] == w and r["profile"] == pr and r["scheme"] in schemes
                        and r["seconds"] is not None]
                base = next((r["seconds"] for r in pred if r["workload"] == w and r["profile"] == pr
                             and r["scheme"] == schemes[0] and r["ranks"] == 1), None)
                if rows and base:
                    pts = sorted((r["ranks"], base / r["seconds"]) for r in rows)
                    ax.plot(*zip(*pts), styles[pr], color=colors[w], lw=1.3)
        # measured: each run over the same series' one-rank run; pretrain_speedup's ratios as they are
        series = {}
        for r in valid:
            if r["scheme"] not in schemes or r["duplicate_of"] or r["predicted"] is None:
                continue
            if r["kind"] == "speedup":
                ax.plot(r["ranks"], r["measured"], "k^", ms=7)
                ax.plot(r["ranks"], r["predicted"], "^", mfc="none", mec="r", ms=11)
            elif r["kind"] == "run":
                series.setdefault(r["series"], {})[r["ranks"]] = r
        for by in series.values():
            for p, r in by.items():
                if p > 1 and 1 in by:
                    ax.plot(p, by[1]["measured"] / r["measured"], "ko", ms=6)
                    ax.plot(p, by[1]["predicted"] / r["predicted"], "o", mfc="none", mec="r", ms=11)
        ax.plot(RANKS, RANKS, color="0.75", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlim(0.8, 1300)
        ax.set_ylim(2 ** -3, 2 ** 10.5)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("ranks (MPI processes), 2 per node")
        ax.set_ylabel("speed-up over one rank (higher is better)")
        ax.grid(alpha=0.3)
    axes[-1].axis("off")
    handles = [Line2D([], [], color=c, lw=2, label=w) for w, c in colors.items()]
    handles += [Line2D([], [], color="k", ls=ls, label=f"predicted, {pr} between nodes") for pr, ls in styles.items()]
    handles += [Line2D([], [], color="0.75", label="ideal"),
                Line2D([], [], color="k", marker="o", ls="", label="measured (bench/results + this run)"),
                Line2D([], [], marker="o", mfc="none", mec="r", ls="", ms=10,
                       label="model at that measured point (its machine, its size)"),
                Line2D([], [], color="k", marker="^", ls="", label="measured speed-up over greedy (pretrain_speedup)"),
                Line2D([], [], marker="^", mfc="none", mec="r", ls="", ms=10, label="model at that point")]
    axes[-1].legend(handles=handles, loc="center", fontsize=9, frameon=False)
    fig.suptitle("Predicted speed-up of each scheme per network profile (lines) and measured points\n"
                 "sparse AE 10k / 160k patches; stacked RBMs 784-1000-500-250-30 on 60k rows, batch 100 / 1000",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(mpi_csv=MPI_CSV, compute_csv=COMPUTE_CSV, ranks_per_node: int = 2, contended: str = "",
           how: str = "python -m bench.scaling_model") -> int:
    links, resid, mpi_rows = load_mpi(Path(mpi_csv))
    comp = load_compute(Path(compute_csv), CONTENTION_CSV)
    machine = measured_on(Path(compute_csv))
    gamma = comp.gamma()
    tree_o = fit_tree_overhead(links["send"], fastest_times(mpi_rows, "tree_reduce"), gamma)
    step_sums, straggle = load_steps(mpi_rows)
    here = Network("this machine", links, None, ranks_per_node, gamma, tree_o, step_sums, straggle)
    points = validate(comp, here, mpi_rows, machine)
    valid = points.rows
    write_rows(VALID_CSV, valid)
    pred = predict_all(comp, networks(links, gamma, ranks_per_node, tree_o), machine)
    write_rows(PRED_CSV, pred)
    plot(PNG, valid, pred)
    write_markdown(MD, links, resid, mpi_rows, valid, pred, comp, machine, contended, points.scales, points.skipped,
                   ranks_per_node, how, tree_o, points.links, points.steps)
    for op in OPS:
        if op in links:
            print(f"{op:15s} alpha {links[op].alpha * 1e6:8.2f} us  beta {links[op].beta / 1e9:7.2f} GB/s  "
                  f"max residual {100 * resid[op]:.0f}%")
    n, mx, md = _stats([r for r in valid if not r["duplicate_of"] and r["kind"] == "run"])
    print(f"validation: {n} whole-run points, max |error| {_pct(mx)}, median {_pct(md)}")
    print(f"wrote {PRED_CSV}, {VALID_CSV}, {PNG}, {MD}")
    return 0
