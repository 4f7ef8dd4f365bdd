"""Ranks sharing one GPU give one rank's weights, bit for bit: synchronized and greedy
pre-training (the fixed blocks over the ranks) and eager CAEs with ``--device gpu`` as whole commands under
mpirun. On a GPU (``make test-gpu``) this is the multi-GPU code path on the hardware; on
the emulated one (``make test-gpu-emulated``) it is the same Python, launches and messages
(each rank's device buffers staged through the host) on the CPU stand-in for CuPy, eager
with two tiny CAEs there (its convolutions run as compiled C++ threads one after another)."""
import pytest

from bench.chaos import differences
from tests.conftest import EMULATED_GPU, HAVE_GPU, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.gpu,
              pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU/CuPy on this machine")]
DIGITS = ["--dataset", "mnist5k", "--limit", "500"]
RUNS = {
    "sync": ["-m", "aepar.sync", "--layers", "784-64-32", "--epochs", "1", "--extra", "0,1", "--finetune-epochs", "1",
             "--no-compare-greedy", *DIGITS],
    "greedy": ["-m", "aepar.pretrain", "--scheme", "greedy", "--layers", "784-64-32", "--epochs", "1",
               "--finetune-epochs", "1", *DIGITS],
    "eager": ["-m", "aepar.eager", "--epochs", "1", "--mono-epochs", "1", "--classify-epochs", "1",
              *(["--models", "2", "--filters", "2,4", "--mono-width", "1", "--limit", "100", "--batch", "20",
                 "--classify-batch", "20", "--dataset", "mnist5k"] if EMULATED_GPU else
                ["--preset", "small", "--limit", "600"])],
}


@pytest.mark.parametrize("scheme, ranks", [
    ("sync", 2), ("sync", 4), ("greedy", 4), ("eager", 2)])
def test_ranks_on_one_gpu_give_one_ranks_weights(scheme, ranks, tmp_path):
    def run(np_):
        out = tmp_path / f"np{np_}"
        done = run_mpi(np_, [*RUNS[scheme], "--device", "gpu", "--quiet", "--no-plot", "--out", str(out)], timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return out
    one, many = run(1), run(ranks)
    assert differences(one, many) == []
