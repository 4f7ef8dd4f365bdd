"""Check a sweep's strong.csv / weak.csv (used by test_slurm.sh and test_sge.sh).

    python tests/cluster/check_csvs.py RUN --strong 1:2000,2:2000 --weak 1:2000,2:4000 \
        [--launcher "srun --mpi=pmix"] [--nodes 2:2,4:4]

Exits 1 with the reason if a row, column or time is wrong; prints a summary otherwise.
"""
import argparse
import csv
import sys
from pathlib import Path

NEED = {"scheme", "processes", "samples", "iterations", "evaluations", "seconds", "speedup",
        "efficiency", "cores", "cpu_model", "blas", "blas_coretype", "threads", "mpi", "launcher",
        "nodes"}


def points(text):
    return sorted(tuple(int(v) for v in item.split(":")) for item in text.split(",") if item)


def rows(path):
    with open(path, newline="") as f:
        r = list(csv.DictReader(f))
    assert r, f"{path} has no rows"
    missing = NEED - set(r[0])
    assert not missing, f"{path} lacks columns {sorted(missing)}"
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("--strong", required=True, type=points)
    p.add_argument("--weak", required=True, type=points)
    p.add_argument("--launcher", default="", help="launcher every row must name")
    p.add_argument("--nodes", type=points, default=[], help="P:N,... nodes the P-rank points must span")
    p.add_argument("--scheme", default="aepar.sparse")
    a = p.parse_args()
    run = Path(a.run)
    strong, weak = rows(run / "strong.csv"), rows(run / "weak.csv")
    got = sorted((int(r["processes"]), int(r["samples"])) for r in strong)
    assert got == a.strong, f"strong points {got}, expected {a.strong}"
    got = sorted((int(r["processes"]), int(r["samples"])) for r in weak)
    assert got == a.weak, f"weak points {got}, expected {a.weak}"
    for r in strong + weak:
        where = f"{r['processes']} processes x {r['samples']} samples"
        assert float(r["seconds"]) > 0, f"{where}: seconds {r['seconds']}"
        assert 0 < int(r["iterations"]) <= int(r["evaluations"]), f"{where}: iterations/evaluations"
        assert r["scheme"] == a.scheme, f"{where}: scheme {r['scheme']}"
        assert int(r["threads"]) >= 1 and int(r["cores"]) >= 1 and r["mpi"], f"{where}: machine columns"
        if r["processes"] == "1":
            assert (r["speedup"], r["efficiency"]) == ("1.000", "1.000"), f"{where}: {r['speedup']}"
        else:
            assert float(r["speedup"]) > 0 and float(r["efficiency"]) > 0, f"{where}: speedup"
        assert not a.launcher or r["launcher"] == a.launcher, f"{where}: launcher {r['launcher']!r}"
    for p, n in a.nodes:
        got = sorted({r["nodes"] for r in strong + weak if r["processes"] == str(p)})
        assert got == [str(n)], f"{p}-rank points ran on {got} nodes, expected {n}"
    print(f"CSVs ok: {len(strong)} strong + {len(weak)} weak rows; launcher "
          f"{strong[0]['launcher']!r}, mpi {strong[0]['mpi']!r}")
    for r in strong:
        print(f"    P={r['processes']} samples={r['samples']}: {r['seconds']} s, "
              f"speedup {r['speedup']}, nodes {r['nodes']}")


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, OSError) as exc:
        print(f"check_csvs: {exc}", file=sys.stderr)
        sys.exit(1)
