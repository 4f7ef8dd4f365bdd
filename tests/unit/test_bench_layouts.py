"""bench.layouts' table: per machine, the fastest round of each layout and its speed-up over
one process with one thread."""
from bench.layouts import layouts, table


def _row(ranks, threads, pre, fine, cpu="CPU A"):
    return {"ranks": str(ranks), "threads": str(threads), "pretrain_s": str(pre), "finetune_s": str(fine),
            "cpu_model": cpu, "isa": "avx2", "blas": "openblas", "cores": "2", "mpi": "Open MPI",
            "date": "2026-11-29", "command": "python -m bench.layouts", "source": "fashion-mnist"}


def test_the_layouts_of_a_machine():
    assert layouts(2) == [(1, 2), (2, 1), (1, 1)]
    assert layouts(1) == [(1, 1)]
    assert layouts(16) == [(1, 16), (16, 1), (4, 4), (1, 1)]


def test_each_machine_gets_its_section_with_the_fastest_round_and_the_ratio_to_one_thread():
    rows = [_row(1, 2, 6.0, 5.0), _row(1, 2, 7.0, 4.0), _row(1, 1, 9.0, 8.0), _row(1, 1, 12.0, 9.0),
            _row(2, 1, 6.5, 7.5, cpu="CPU B"), _row(1, 1, 13.0, 15.0, cpu="CPU B")]
    text = table(rows)
    assert text.count("## CPU A") == 1 and text.count("## CPU B") == 1
    assert "| 1 rank x 2 threads | 6.00 | 4.00 | 1.50x | 2.00x |" in text
    assert "| 2 ranks x 1 thread | 6.50 | 7.50 | 2.00x | 2.00x |" in text
    assert "python -m bench.layouts" in text and "2026-11-29" in text
