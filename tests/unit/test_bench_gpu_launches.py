"""bench.gpu_launches counts a GPU step's host calls on the emulated GPU: the 8 blocks' step
stays within a small multiple of one block's (block by block it was eight to twelve times)."""
from bench import gpu_launches


def test_eight_blocks_ask_little_more_of_the_host_than_one(emulated_cupy, tmp_path):
    rows = gpu_launches.per_step(layers=(784, 16), rows=200)
    calls = {(r["workload"], r["blocks"]): r["calls"] for r in rows}
    assert set(calls) == {(w, b) for w in ("CD-1 step", "autoencoder layer step") for b in (8, 1)}
    for workload in ("CD-1 step", "autoencoder layer step"):
        assert 0 < calls[workload, 1] <= calls[workload, 8] <= 2.5 * calls[workload, 1], calls
    text = gpu_launches.table(rows, "python -m bench.gpu_launches")
    assert "| CD-1 step | 8 |" in text and "not times" in text
