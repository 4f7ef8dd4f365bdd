"""What the schemes do when clusters misbehave: ``python -m bench.reliability``.

Runs the real commands, on this machine, and counts the outcomes of each kind of case
(bench/results/reliability.csv, one row per run; reliability.md, the counts):

- faults injected with AEPAR_FAULT into every scheme (sparse, greedy, finetune, sync) at
  2 and 4 ranks, early and late: ``raise`` and ``kill`` must end the job with the rank
  named, ``nan`` with a divergence (exit 3), ``stall`` within --timeout naming the stalled
  rank (exit 124), all with nothing half-written; the time from the fault to the end of
  the job is measured. ``sigterm``/``sigusr1``/``sigint`` must save a checkpoint and exit
  75, and ``--resume`` on another number of ranks must end with the parameters of an
  uninterrupted run, bit for bit;
- corrupt or foreign input files through the commands that read them, at 1 and 2 ranks:
  one line naming the file, exit 2, nothing written;
- impossible options at 1 and 2 ranks: one line naming the option, exit 2;
- --out pointing at things that are not a new directory, at 1 and 2 ranks: refused
  without touching them.

It takes about 15 minutes on 2 cores. The property-based tests in ``make test``
(tests/unit/test_properties_*.py) add 3,250 generated inputs to readers, checkpoints and
command lines.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PY = sys.executable

SCHEMES = {
    "sparse": ("aepar.sparse", ["--samples", "2000", "--iterations", "150"]),
    "greedy": ("aepar.greedy", ["--dataset", "mnist5k", "--layers", "784-64-16", "--epochs", "3",
                                "--finetune-epochs", "2", "--limit", "800"]),
    "finetune": ("aepar.finetune", ["--dataset", "mnist5k", "--limit", "800", "--epochs", "4"]),
    "sync": ("aepar.sync", ["--dataset", "mnist5k", "--layers", "784-64-32-16-8", "--epochs", "3",
                            "--extra", "0,1,1,1", "--limit", "800", "--finetune-epochs", "1", "--no-plot"]),
}
EXPECTED = {"raise": 1, "kill": None, "nan": 3, "stall": 124, "sigterm": 75, "sigusr1": 75, "sigint": 75}


def launcher() -> list[str]:
    return os.environ.get("MPIRUN", str(Path(PY).parent / "mpirun") + " --oversubscribe").split()


def run(module, args, ranks, env=None, timeout=300):
    full = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **(env or {}))
    cmd = ([PY, "-m", module] if ranks == 1 else launcher() + ["-np", str(ranks), PY, "-m", module]) + list(map(str, args))
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=ROOT, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, t0, time.time()
    except subprocess.TimeoutExpired:
        return "hang", "", "", t0, time.time()


def ours(stderr, prog):
    return [l for l in stderr.splitlines() if l.startswith(f"{prog}:") and "AEPAR_FAULT" not in l]


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".aepar-" in p.name]


def same_bits(a: Path, b: Path) -> bool:
    import numpy as np

    from aepar import checkpoint

    pa, pb = checkpoint.load(a / "weights.h5").params, checkpoint.load(b / "weights.h5").params
    return set(pa) == set(pb) and all(np.array_equal(pa[k], pb[k]) for k in pa)


# ---- faults ---------------------------------------------------------------------------------
def faults(work: Path, kinds, ranks_list, steps) -> list[dict]:
    rows = []
    refs = {}
    stack = None
    for scheme, (module, args) in SCHEMES.items():
        args = list(args)
        if scheme == "finetune":
            if stack is None:
                stack = work / "stack"
                run("aepar.greedy", SCHEMES["greedy"][1] + ["--quiet", "--out", stack], 1)
            args = ["--weights", stack / "weights.h5"] + args
        ref = refs[scheme] = work / f"ref-{scheme}"
        run(module, args + ["--quiet", "--out", ref], 1)
        for kind in kinds:
            for ranks in ranks_list:
                for step in steps:
                    out = work / f"{scheme}-{kind}-{ranks}-{step}"
                    fault_rank = ranks - 1
                    rc, so, se, t0, t1 = run(module, args + ["--quiet", "--timeout", "5", "--out", out], ranks,
                                             env={"AEPAR_FAULT": f"{fault_rank}:{step}:{kind}"})
                    fired = re.search(r"AEPAR_FAULT: \w+ on rank \d+, step \d+ .* at t=([0-9.]+)", se)
                    lines = ours(se, module)
                    named = any(f"rank {fault_rank}" in l for l in se.splitlines())
                    problems = []
                    want = EXPECTED[kind]
                    if rc == "hang":
                        problems.append("hang")
                    elif want is None and rc == 0 or want is not None and rc != want:
                        problems.append(f"exit {rc}, not {want if want is not None else 'non-zero'}")
                    if kind in ("raise", "kill", "stall") and not named:
                        problems.append("rank not named")
                    if kind == "nan" and not any("diverged:" in l for l in lines):
                        problems.append("no divergence line")
                    if kind.startswith("sig"):
                        resumed_ranks = 1 if ranks > 1 else 2
                        if rc == 75:
                            rc2 = run(module, ["--resume", out, "--quiet"], resumed_ranks)[0]
                            if rc2 != 0 or not same_bits(ref, out):
                                problems.append(f"resume on {resumed_ranks} rank(s): exit {rc2}, "
                                                f"{'bits differ' if rc2 == 0 else 'no result'}")
                    elif out.exists() and not (out / "checkpoint.h5").exists():
                        problems.append("run directory without a checkpoint left")
                    if leftovers(work):
                        problems.append(f"left {leftovers(work)}")
                    rows.append({"category": "fault", "scheme": scheme, "case": kind, "ranks": ranks, "step": step,
                                 "fired": bool(fired), "exit": rc, "wall_s": round(t1 - t0, 2),
                                 "end_after_fault_s": round(t1 - float(fired.group(1)), 2) if fired else None,
                                 "outcome": "as documented" if not problems else "; ".join(problems),
                                 "message": (lines[-1] if lines else "")[:160]})
                    print(f"fault {scheme} {kind} np{ranks} step {step}: {rows[-1]['outcome']} "
                          f"({rows[-1]['end_after_fault_s']} s after the fault)", flush=True)
    return rows


# ---- bad files ---------------------------------------------------------------------------------
def _idx(path, dims, data, magic=None, gz=False):
    header = struct.pack(">I", magic if magic is not None else (0x08 << 8 | len(dims))) + b"".join(
        struct.pack(">I", d) for d in dims)
    body = header + data
    (gzip.open if gz else open)(path, "wb").write(body)


def _mnist_dir(d: Path, **broken):
    """A valid small IDX set in ``d`` with one part replaced by ``broken``."""
    import numpy as np

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for stem, n in (("train", 300), ("t10k", 100)):
        imgs = broken.get(f"{stem}_images")
        if imgs is None:
            _idx(d / f"{stem}-images-idx3-ubyte", (n, 28, 28), rng.integers(0, 256, (n, 28, 28), dtype=np.uint8).tobytes())
        else:
            imgs(d / f"{stem}-images-idx3-ubyte")
        labs = broken.get(f"{stem}_labels")
        if labs is None:
            _idx(d / f"{stem}-labels-idx1-ubyte", (n,), rng.integers(0, 10, n, dtype=np.uint8).tobytes())
        else:
            labs(d / f"{stem}-labels-idx1-ubyte")
    return d


def bad_files(work: Path, ranks_list) -> list[dict]:
    import numpy as np

    from aepar import checkpoint

    cases = {}  # name -> (module, args, the path the line must name)

    def idx_case(name, **broken):
        d = _mnist_dir(work / "files" / name, **broken)
        cases[name] = ("aepar.greedy", ["--data-dir", d, "--layers", "784-16-4", "--epochs", "1",
                                        "--finetune-epochs", "0"], d)

    idx_case("idx truncated images", train_images=lambda p: _idx(p, (300, 28, 28), b"\0" * 1000))
    idx_case("idx zero images", train_images=lambda p: _idx(p, (0, 28, 28), b""))
    idx_case("idx header overflows", train_images=lambda p: _idx(p, (2 ** 31, 2 ** 31, 2 ** 30), b"\0" * 64))
    idx_case("idx wrong magic", train_images=lambda p: _idx(p, (300, 28, 28), b"\0" * 300 * 784, magic=0x1234))
    idx_case("idx labels out of range", train_labels=lambda p: _idx(p, (300,), bytes([12] * 300)))
    idx_case("idx label count mismatch", train_labels=lambda p: _idx(p, (299,), bytes(299)))
    idx_case("idx garbage", train_images=lambda p: p.write_bytes(b"not an idx file at all" * 10))
    idx_case("idx corrupt gzip", train_images=lambda p: Path(str(p) + ".gz").write_bytes(b"\x1f\x8b\x08" + b"x" * 50))
    idx_case("idx empty file", train_images=lambda p: p.write_bytes(b""))
    idx_case("idx is a directory", train_images=lambda p: p.mkdir())
    empty = work / "files" / "empty dir"
    empty.mkdir(parents=True)
    cases["data dir with nothing usable"] = ("aepar.greedy", ["--data-dir", empty, "--layers", "784-16-4"], empty)

    def cifar_case(name, batch):
        d = work / "files" / name
        d.mkdir(parents=True)
        for b in ("data_batch_1", "test_batch"):
            (d / b).write_bytes(pickle.dumps(batch, protocol=2) if not isinstance(batch, bytes) else batch)
        cases[name] = ("aepar.greedy", ["--dataset", "cifar10", "--data-dir", d, "--layers", "3072-16-4",
                                        "--epochs", "1", "--finetune-epochs", "0"], d)

    good = np.zeros((20, 3072), np.uint8)
    cifar_case("cifar wrong shape", {b"data": np.zeros((20, 100), np.uint8), b"labels": [0] * 20})
    cifar_case("cifar labels out of range", {b"data": good, b"labels": [11] * 20})
    cifar_case("cifar missing labels", {b"data": good})
    cifar_case("cifar not a pickle", b"\x80\x02garbage")
    cifar_case("cifar float labels", {b"data": good, b"labels": [0.5] * 20})

    def mat_case(name, write):
        p = work / "files" / f"{name}.mat"
        write(p)
        cases[name] = ("aepar.sparse", ["--images", p, "--samples", "200", "--iterations", "2"], p)

    from scipy.io import savemat

    mat_case("mat truncated", lambda p: p.write_bytes(b"MATLAB 5.0 MAT-file" + bytes(100)))
    mat_case("mat wrong variable", lambda p: savemat(p, {"OTHER": np.zeros((64, 64, 2))}))
    mat_case("mat 2-d images", lambda p: savemat(p, {"IMAGES": np.zeros((64, 64))}))
    mat_case("mat too small for the patch", lambda p: savemat(p, {"IMAGES": np.zeros((4, 4, 3))}))

    stack = work / "stack" / "weights.h5"
    if not stack.exists():
        run("aepar.greedy", SCHEMES["greedy"][1] + ["--quiet", "--out", stack.parent], 1)
    good_ck = checkpoint.load(stack)

    def ck_case(name, params=None, scheme="greedy", raw=None):
        p = work / "files" / f"{name}.h5"
        if raw is not None:
            p.write_bytes(raw)
        else:
            checkpoint.save(p, scheme=scheme, params=params if params is not None else good_ck.params)
        cases[name] = ("aepar.finetune", ["--weights", p, "--dataset", "mnist5k", "--limit", "300", "--epochs", "1"], p)

    nan_params = dict(good_ck.params)
    nan_params["layer1/W"] = np.full_like(nan_params["layer1/W"], np.nan)
    int_params = dict(good_ck.params)
    int_params["layer1/W"] = np.zeros(int_params["layer1/W"].shape, np.int32)
    ck_case("checkpoint with NaN weights", nan_params)
    ck_case("checkpoint with integer weights", int_params)
    ck_case("checkpoint of another scheme", scheme="sparse")
    ck_case("checkpoint truncated", raw=stack.read_bytes()[:2000])
    ck_case("checkpoint not HDF5", raw=b"hello")
    missing = {k: v for k, v in good_ck.params.items() if not k.startswith("layer2/")}
    ck_case("checkpoint lacking a layer's biases", dict(missing, **{"layer2/W": good_ck.params["layer2/W"]}))

    rows = []
    for name, (module, args, path) in cases.items():
        for ranks in ranks_list:
            out = work / "outs" / f"{name}-{ranks}".replace(" ", "_")
            rc, so, se, t0, t1 = run(module, [*args, "--quiet", "--out", out], ranks, timeout=120)
            lines = ours(se, module)
            ok = (rc == 2 and len(lines) == 1 and str(path) in lines[0] and "Traceback" not in se
                  and not out.exists() and not leftovers(out.parent if out.parent.exists() else work))
            rows.append({"category": "bad file", "scheme": module, "case": name, "ranks": ranks, "exit": rc,
                         "wall_s": round(t1 - t0, 2),
                         "outcome": "one line naming the file, exit 2, nothing written" if ok else
                         f"exit {rc}, {len(lines)} line(s)" + (", traceback" if "Traceback" in se else ""),
                         "message": (lines[0] if lines else se[-160:])[:200]})
            print(f"bad file {name} np{ranks}: {rows[-1]['outcome']}", flush=True)
    return rows


# ---- options and --out ---------------------------------------------------------------------------
OPTIONS = [
    ("aepar.greedy", ["--lr", "nan"], "--lr"), ("aepar.greedy", ["--lr", "-1"], "--lr"),
    ("aepar.greedy", ["--momentum", "1"], "--momentum"), ("aepar.greedy", ["--seed", "-1"], "--seed"),
    ("aepar.greedy", ["--layers", "783-64"], "--layers"), ("aepar.greedy", ["--epochs", "0"], "--epochs"),
    ("aepar.greedy", ["--reduce-blocks", "1"], "--reduce-blocks"), ("aepar.greedy", ["--batch", "x"], "--batch"),
    ("aepar.sparse", ["--rho", "1"], "--rho"), ("aepar.sparse", ["--lam", "inf"], "--lam"),
    ("aepar.sparse", ["--samples", "100"], "--samples"), ("aepar.sparse", ["--hidden", "0"], "--hidden"),
    ("aepar.sync", ["--extra", "1,1,1,1"], "--extra"), ("aepar.sync", ["--val-fraction", "0.9"], "--val-fraction"),
    ("aepar.sync", ["--finetune-lr", "inf"], "--finetune-lr"), ("aepar.sync", ["--timeout", "0"], "--timeout"),
    ("aepar.finetune", ["--weights", "nowhere.h5"], "nowhere.h5"),
    ("aepar.sparse", ["--checkpoint-minutes", "-1"], "--checkpoint-minutes"),
]


def options(work: Path, ranks_list) -> list[dict]:
    rows = []
    for module, args, name in OPTIONS:
        for ranks in ranks_list:
            if ranks == 1 and name in ("--reduce-blocks", "--samples"):
                continue  # these are impossible for the ranks only
            out = work / "opts" / f"{module}-{name.strip('-')}-{ranks}"
            extra = ["--dataset", "mnist5k", "--limit", "300"] if module != "aepar.sparse" else []
            rc, so, se, t0, t1 = run(module, [*extra, *args, "--quiet", "--out", out], ranks, timeout=120)
            lines = ours(se, module)
            ok = rc == 2 and len(lines) == 1 and name in lines[0] and not out.exists()
            rows.append({"category": "impossible option", "scheme": module, "case": " ".join(args), "ranks": ranks,
                         "exit": rc, "wall_s": round(t1 - t0, 2),
                         "outcome": "one line naming it, exit 2" if ok else f"exit {rc}, {len(lines)} line(s)",
                         "message": (lines[0] if lines else se[-160:])[:200]})
            print(f"option {module} {' '.join(args)} np{ranks}: {rows[-1]['outcome']}", flush=True)
    return rows


def outs(work: Path, ranks_list) -> list[dict]:
    users = work / "user"
    (users / "thesis" / "sub").mkdir(parents=True)
    (users / "thesis" / "thesis.tex").write_text("thesis")
    (users / "thesis" / "sub" / "data.csv").write_text("1,2")
    (users / "notes.txt").write_text("notes")
    (users / "empty").mkdir()
    done = work / "done"
    run("aepar.sparse", ["--samples", "200", "--iterations", "3", "--quiet", "--out", done], 1)

    def snapshot():
        return sorted((str(p), p.read_bytes() if p.is_file() else None) for p in users.rglob("*"))
    before = snapshot()
    cases = [("a user's directory", ["--out", users / "thesis"]), ("the same with --overwrite",
             ["--out", users / "thesis", "--overwrite"]), ("a user's file", ["--out", users / "notes.txt"]),
             ("an empty directory", ["--out", users / "empty"]), ("the working directory", ["--out", "."]),
             ("an ancestor of it", ["--out", ".."]), ("the root", ["--out", "/"]),
             ("the home directory", ["--out", os.path.expanduser("~")]),
             ("a complete run, no flag", ["--out", done]), ("--resume of a complete run", ["--resume", done]),
             ("--resume of a user's directory", ["--resume", users / "thesis"])]
    rows = []
    for name, args in cases:
        for ranks in ranks_list:
            rc, so, se, t0, t1 = run("aepar.sparse", ["--samples", "200", "--iterations", "3", *args], ranks)
            lines = ours(se, "aepar.sparse")
            ok = rc == 2 and len(lines) == 1 and snapshot() == before and not leftovers(users)
            rows.append({"category": "--out", "scheme": "aepar.sparse", "case": name, "ranks": ranks, "exit": rc,
                         "wall_s": round(t1 - t0, 2),
                         "outcome": "refused in one line, nothing touched" if ok else f"exit {rc}, {len(lines)} line(s)",
                         "message": (lines[0] if lines else se[-160:])[:200]})
            print(f"--out {name} np{ranks}: {rows[-1]['outcome']}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.reliability", description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="faults,files,options,out")
    p.add_argument("--kinds", default=",".join(EXPECTED))
    p.add_argument("--ranks", default="2,4", help="ranks of the fault runs (default 2,4)")
    p.add_argument("--steps", default="3,15", help="steps the faults fire at (default 3,15)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="aepar-reliability-") as tmp:
        work = Path(tmp)
        if "faults" in parts:
            rows += faults(work, args.kinds.split(","), [int(r) for r in args.ranks.split(",")],
                           [int(s) for s in args.steps.split(",")])
        if "files" in parts:
            rows += bad_files(work, [1, 2])
        if "options" in parts:
            rows += options(work, [1, 2])
        if "out" in parts:
            rows += outs(work, [1, 2])
    from aepar.machine import describe

    machine = describe()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    keys += list(machine)
    with open(out / "reliability.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({**r, **machine})
    md = ["# Reliability: faults, bad files, impossible options, --out (bench/reliability.py)", "",
          f"Machine: {machine['cpu_model']}, {machine['cores']} cores, {machine['mpi']}", "",
          "| category | case | runs | as documented | other outcomes | end after the fault (s, max) |",
          "| --- | --- | --- | --- | --- | --- |"]
    groups = {}
    for r in rows:
        groups.setdefault((r["category"], r["case"] if r["category"] == "fault" else "all"), []).append(r)
    for (cat, case), rs in groups.items():
        good = [r for r in rs if r["outcome"] in ("as documented", "one line naming the file, exit 2, nothing written",
                                                  "one line naming it, exit 2", "refused in one line, nothing touched")]
        ends = [r["end_after_fault_s"] for r in rs if r.get("end_after_fault_s") is not None]
        other = sorted({r["outcome"] for r in rs} - {r["outcome"] for r in good})
        md.append(f"| {cat} | {case} | {len(rs)} | {len(good)} | {'; '.join(other) or '-'} | "
                  f"{max(ends):.1f} |" if ends else f"| {cat} | {case} | {len(rs)} | {len(good)} | "
                  f"{'; '.join(other) or '-'} | - |")
    (out / "reliability.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    print(json.dumps({"runs": len(rows)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
