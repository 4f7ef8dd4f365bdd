"""bench.gpu_launches counts a GPU step's host calls on the emulated GPU: the 8 blocks' step
stays within a small multiple of one block's (block by block it was five to twelve times)."""
from bench import gpu_launches


def test_eight_blocks_ask_little_more_of_the_host_than_one(emulated_cupy, tmp_path):
    rows = gpu_launches.per_step(layers=(784, 16), rows=200, host_epochs=1, host_rows=300, cae_side=8)
    calls = {(r["workload"], r["blocks"]): r["calls"] for r in rows}
    workloads = ("CD-1 step", "autoencoder layer step", "fine-tuning step", "classifier step", "CAE step")
    assert set(calls) == {(w, b) for w in workloads for b in (8, 1)}
    for workload in workloads:
        assert 0 < calls[workload, 1] <= calls[workload, 8] <= 2.5 * calls[workload, 1], calls
    # the losses take all blocks in a call: a block's own head was 6 (the stack's) and 13 (the
    # classifier's) calls more a block
    assert calls["fine-tuning step", 8] <= 1.25 * calls["fine-tuning step", 1], calls
    assert calls["classifier step", 8] <= 1.5 * calls["classifier step", 1], calls
    # the CAE's small blocks take the row kernels, all blocks a launch (cuBLAS a block: 5.4x)
    assert calls["CAE step", 8] <= 1.25 * calls["CAE step", 1], calls
    assert all(r["host µs"] > 0 for r in rows), rows
    text = gpu_launches.table(rows, "python -m bench.gpu_launches")
    assert "| CD-1 step | 8 |" in text and "not times" in text and "own Python (µs) |" in text


def test_host_time_leaves_out_the_stand_ins_calls(emulated_cupy):
    """time_outside adds the stand-in's calls to ``inside`` (an outer call once, with the
    calls it makes) and keeps raw kernels from running; undone, both are as before."""
    import time

    import cupy
    import numpy as np

    inside = [0.0]
    a = cupy.asarray(np.arange(6, dtype=np.float32))
    real_take = cupy.take(a, cupy.asarray(np.array([1])))
    wrapped = gpu_launches.time_outside(cupy, inside)
    try:
        t0 = time.perf_counter()
        for _ in range(200):
            cupy.take(a, cupy.asarray(np.array([1])))
        spent = time.perf_counter() - t0
        assert 0.5 * spent < inside[0] <= spent
        kernel = cupy.RawKernel('extern "C" __global__ void k(float *x) { x[0] = 5.0f; }', "k")
        kernel((1,), (1,), (a,))
        assert float(a[0].get()) == 0.0  # not run
    finally:
        gpu_launches._undo(wrapped)
    kernel((1,), (1,), (a,))
    assert float(a[0].get()) == 5.0 and cupy.take(a, cupy.asarray(np.array([1]))).get() == real_take.get()
