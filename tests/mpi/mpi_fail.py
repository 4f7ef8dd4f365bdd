"""A CLI that fails in a chosen way, to check every rank ends (no hang)."""
import sys

import aepar  # noqa: F401
import numpy as np

from aepar.comm import run_main
from aepar.errors import UserError


def main(argv, comm):
    mode = argv[0]
    if mode == "user-all":  # bad input seen by every rank during set-up
        comm.agree(lambda: (_ for _ in ()).throw(UserError("--samples 1 is fewer than the 2 ranks")))
    if mode == "user-one":  # a rank alone finds bad input while the others wait
        if comm.rank == comm.size - 1:
            raise UserError("rank-local bad file")
        comm.Allreduce(np.zeros(1))
    if mode == "crash":  # an internal error on one rank while the others wait in a collective
        if comm.rank == comm.size - 1:
            raise RuntimeError("boom")
        comm.Allreduce(np.zeros(1))
    print("finished", flush=True)


if __name__ == "__main__":
    sys.exit(run_main(main, "mpi_fail", sys.argv[1:]))
