"""bench.gpu_epoch off the GPU: impossible options and a missing GPU end with one line and
nothing written; the fallback data are real rows, repeated to the asked size."""
import numpy as np
import pytest

from bench import gpu_epoch
from tests.conftest import HAVE_GPU


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--batches", "100,x"], ["--batches", "0"], ["--repeats", "0"],
                                  ["--layers", "rbm,gan"], ["--layers", ","]])
def test_impossible_options_are_refused(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_epoch.main(argv + ["--out", str(tmp_path)])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(HAVE_GPU, reason="a GPU is here")
def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    assert gpu_epoch.main(["--rows", "10", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no usable GPU" in err[0]
    assert not list(tmp_path.iterdir())


def test_fallback_rows_repeat_the_embedded_digits(tmp_path, monkeypatch):
    from aepar.data import sources

    monkeypatch.setattr(sources, "FASHION_DIR", tmp_path / "none")  # as on a machine without it
    x, what = gpu_epoch.load_rows(9000, str(tmp_path))  # an empty directory: no IDX files there
    n = sources.load_digits("mnist5k", seed=0, dtype=np.float32).train_x.shape[0]
    assert x.shape == (9000, 784) and x.dtype == np.float32 and x.flags.c_contiguous
    assert "mnist5k" in what and np.array_equal(x[n:2 * n], x[:n])


@pytest.mark.parametrize("name", ["finetune", "cae"])
def test_whole_networks_are_timed_against_their_peers(name):
    """The fine-tuning and CAE rounds, run on the CPU backend (the peers on the CPU too):
    every implementation timed in each round, PyTorch's two optimisers where it is installed."""
    from aepar import backend
    from bench import torch_rbm

    be = backend.select("cpu", "numba", "float32")
    x = np.random.default_rng(0).random((240, 784), dtype=np.float32)
    times = gpu_epoch.network_epochs(be, x, 100, 2, name, warm=100, peer_device="cpu")
    expected = {gpu_epoch.AEPAR_8, gpu_epoch.AEPAR_1}
    if torch_rbm.available():
        expected |= {gpu_epoch.TORCH_ADAM, gpu_epoch.TORCH_FUSED}
    assert set(times) == expected
    assert all(len(ts) == 2 and min(ts) > 0 for ts in times.values())
