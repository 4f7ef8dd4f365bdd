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


def test_the_caes_one_block_is_also_timed_with_its_convolutions_through_cublas(monkeypatch):
    """Where the kernel set's convolutions have a bound for the row kernels (the GPU set's
    MAX_IMAGES; here planted on the CPU set's), the CAE's one block is timed a second time
    with the bound at 0 (cuBLAS, as before 0.8.29), the bound restored after each epoch."""
    import importlib

    from aepar import backend
    from bench import cae_speed

    be = backend.select("cpu", "numba", "float32")
    conv = importlib.import_module(be.K.__name__ + ".conv")
    monkeypatch.setattr(conv, "MAX_IMAGES", 64, raising=False)
    seen, real = [], cae_speed.aepar_epoch

    def recording(*a, **k):
        model, epoch = real(*a, **k)
        return model, lambda: seen.append(conv.MAX_IMAGES) or epoch()
    monkeypatch.setattr(cae_speed, "aepar_epoch", recording)
    x = np.random.default_rng(0).random((200, 784), dtype=np.float32)
    times = gpu_epoch.network_epochs(be, x, 100, 2, "cae", warm=100, peer_device="cpu")
    assert len(times[gpu_epoch.AEPAR_1_CUBLAS]) == 2 and gpu_epoch.AEPAR_1 in times
    assert seen.count(0) == 3 and conv.MAX_IMAGES == 64  # its warm-up and two epochs; the rest at 64


def test_the_eight_blocks_are_also_timed_with_the_mid_tiles_where_the_thin_are_taken(monkeypatch):
    """Where the kernel set's row kernels have a mid instance (the GPU set's; here planted
    on the CPU set's rowprod), the 8 blocks are timed again with tiles_for giving the mid
    tiles where it gives the thin, its kept launch plans dropped around each call, and
    tiles_for restored after: the model's warm-up and every timed epoch under the mid."""
    import functools
    import importlib

    from aepar import backend

    be = backend.select("cpu", "numba", "float32")
    rowprod = importlib.import_module(be.K.__name__ + ".rowprod")
    cleared = []

    @functools.lru_cache
    def plan():
        return None
    monkeypatch.setattr(plan, "cache_clear", lambda: cleared.append(1), raising=False)
    monkeypatch.setattr(rowprod, "TILES", {"": 64, "_mid": 32, "_thin": 16}, raising=False)
    monkeypatch.setattr(rowprod, "tiles_for", lambda M, N, stack=1: "_thin" if M < 64 else "", raising=False)
    monkeypatch.setattr(rowprod, "_plan", plan, raising=False)
    real, seen = rowprod.tiles_for, []

    def ours(blocks):  # what epochs() makes: a model warmed up, then its epoch
        seen.append(("made", rowprod.tiles_for(10, 10)))
        return lambda: seen.append(("epoch", rowprod.tiles_for(100, 10), rowprod.tiles_for(10, 10)))
    impls = {}
    gpu_epoch._add_mid_tiles(be, impls, ours)
    times = gpu_epoch.in_turns(be, impls, 2)
    assert len(times[gpu_epoch.AEPAR_8_MID]) == 2 and rowprod.tiles_for is real
    assert seen == [("made", "_mid"), ("epoch", "", "_mid"), ("epoch", "", "_mid")] and len(cleared) == 6
