"""The reader of a user's own files (aepar.data.files): each format, with and without
labels, the split, the refusals (one line naming the file), and that a slice reads only
the rows it names."""
import argparse

import h5py
import numpy as np
import pytest

from aepar import backend
from aepar.data.files import Rows, check_source, load_user, read_data, require_labels
from aepar.errors import DataError, UserError
from aepar.rows import Shard


def _png_folder(root, sizes, classes=("cat", "dog"), mode="L"):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i, (h, w) in enumerate(sizes):
            shape = (h, w) if mode == "L" else (h, w, 3)
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(root / c / f"{i}.png")
    return root


def test_npy_unlabelled_split_and_source(tmp_path):
    x = np.random.default_rng(0).random((50, 7)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    d = load_user(tmp_path / "x.npy", seed=3)
    assert d.train_y is None and d.test_y is None and d.classes is None
    assert d.train_x.shape == (40, 7) and d.test_x.shape == (10, 7)
    rows = np.concatenate([np.asarray(d.train_x), np.asarray(d.test_x)])
    assert sorted(map(tuple, rows)) == sorted(map(tuple, x.astype(np.float64)))  # disjoint, every row
    assert np.all(np.diff(d.train_x.index) > 0)  # stored order: a rank's block is a narrow span
    for part in ("x.npy", "(50, 7) float32", "40 train / 10 test", "--test-fraction 0.2", "seed 3", "no labels"):
        assert part in d.source, d.source
    again = load_user(tmp_path / "x.npy", seed=3)
    assert np.array_equal(again.train_x.index, d.train_x.index)
    assert not np.array_equal(load_user(tmp_path / "x.npy", seed=4).train_x.index, d.train_x.index)


def test_npz_uint8_with_named_labels(tmp_path):
    x = np.arange(60 * 4, dtype=np.uint8).reshape(60, 4)
    y = np.array(["b", "a", "c"])[np.arange(60) % 3]
    np.savez(tmp_path / "d.npz", images=x, labels=y)
    d = load_user(tmp_path / "d.npz", test_fraction=0.25, seed=0)
    assert d.classes == ["a", "b", "c"]
    got = np.asarray(d.train_x)
    assert got.max() <= 1.0 and np.allclose(got, x[d.train_x.index] / 255.0)
    assert np.array_equal(d.train_y, np.searchsorted(["a", "b", "c"], y[d.train_x.index]))
    assert "'images'" in d.source and "'labels'" in d.source and "3 classes (a, b, c)" in d.source
    assert "uint8 scaled to [0, 1]" in d.source and "45 train / 15 test" in d.source


def test_npz_test_part_and_test_file(tmp_path):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", x=rng.random((20, 3)), y=np.arange(20) % 2, x_test=rng.random((5, 3)),
             y_test=np.arange(5) % 2)
    d = load_user(tmp_path / "d.npz")
    assert d.train_x.shape == (20, 3) and d.test_x.shape == (5, 3) and "test part" in d.source
    np.save(tmp_path / "t.npy", rng.random((6, 4)))
    with pytest.raises(DataError, match=r"t\.npy: samples of shape \(4,\)"):
        load_user(tmp_path / "d.npz", test_path=tmp_path / "t.npy")


def test_hdf5_named_datasets(tmp_path):
    rng = np.random.default_rng(2)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["grp/feat"] = rng.random((30, 6))
        f["lab"] = rng.integers(0, 4, 30)
    d = load_user(tmp_path / "d.h5", y_name="lab")  # the only 2-D dataset is X
    assert d.train_x.shape == (24, 6) and len(d.classes) <= 4 and "'grp/feat'" in d.source
    with h5py.File(tmp_path / "d.h5", "r") as f:
        assert np.array_equal(np.asarray(d.test_x), f["grp/feat"][()][d.test_x.index])
    with pytest.raises(DataError, match=r"d\.h5: no array 'nope' \(--data-x\)"):
        load_user(tmp_path / "d.h5", x_name="nope")


def test_image_folder_labels_sizes_and_resize(tmp_path):
    root = _png_folder(tmp_path / "imgs", [(8, 12)] * 5, mode="RGB")
    d = load_user(root)
    assert d.classes == ["cat", "dog"] and d.train_x.shape[1] == 3 * 8 * 12
    assert "colour images 8x12" in d.source and "2 classes (cat, dog)" in d.source
    mixed = _png_folder(tmp_path / "mixed", [(8, 8), (8, 8), (12, 8)])
    with pytest.raises(DataError) as e:
        load_user(mixed)
    assert str(e.value).startswith(str(mixed / "cat" / "2.png")) and "--image-size" in str(e.value)
    assert "\n" not in str(e.value)
    r = load_user(mixed, image_size=(4, 4))
    assert r.train_x.shape[1] == 16 and "resized" in r.source


@pytest.mark.parametrize("bad, match", [
    (lambda p: np.save(p / "a.npy", np.array([[0.0, np.nan], [1.0, 2.0]] * 5)), r"a\.npy: NaN or Inf"),
    (lambda p: np.save(p / "a.npy", np.ones((10, 2), dtype=np.complex64)), r"a\.npy: X holds complex64 values"),
    (lambda p: np.save(p / "a.npy", np.ones(10)), r"a\.npy: X has shape \(10,\)"),
    (lambda p: np.savez(p / "a.npz", x=np.ones((10, 2)), y=np.arange(9)), r"a\.npz: 9 labels for 10 samples"),
    (lambda p: np.savez(p / "a.npz", x=np.ones((10, 2)), y=np.ones(10) / 2), r"a\.npz: labels must be integers"),
    (lambda p: np.savez(p / "a.npz", z=np.ones((10, 2))), r"a\.npz: no samples"),
    (lambda p: (p / "a.json").write_text("[[1, 2]]\n"), r"a\.json: unknown format .json: give a .npy, .npz, "
                                                          r"\.h5/\.hdf5, \.csv/\.tsv file"),
    (lambda p: (p / "a.csv").write_text("1,2,3\n4,x,6\n"), r"a\.csv: line 2, column 2: 'x' is not a number"),
    (lambda p: (p / "a.csv").write_text("a,b,c\n1,2,3\n4,5\n"), r"a\.csv: line 3 has 2 columns, the first line 3"),
    (lambda p: (p / "a.csv").write_text("1,2\n3,4,5\n"), r"a\.csv: line 2 has 3 columns, the first line 2"),
    (lambda p: (p / "a.tsv").write_text("1\tnan\n2\t3\n"), r"a\.tsv: NaN or Inf"),
    (lambda p: (p / "a.csv").write_text("1;2\n3;4\n"), r"a\.csv: line 2, column 1: '3;4' is not a number "
                                                       r"\(separated by ';'\? a \.csv is read at ','\)"),
    (lambda p: (p / "a.csv").write_text(""), r"a\.csv: X has shape \(0, 1\): no samples"),
])
def test_refusals_name_the_file(tmp_path, bad, match):
    bad(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(UserError, match=match) as e:
        load_user(path)
    assert "\n" not in str(e.value)


def test_csv_and_tsv_tables_with_labels_by_name_or_number(tmp_path):
    """A table's samples are its columns other than --data-y's; a first line that is not
    all numbers names the columns; integer labels keep their numeric order, names sort as
    names; a line of another width or a value that is not a number is refused."""
    rng = np.random.default_rng(0)
    x = rng.random((40, 5)).round(4)
    y = np.array([2, 10, 7])[np.arange(40) % 3]
    lines = ["p0,p1,label,p2,p3,p4"] + [",".join(f"{v:g}" for v in (*r[:2], lab, *r[2:])) for r, lab in zip(x, y)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    for y_name in ("label", "2"):
        d = load_user(tmp_path / "d.csv", y_name=y_name, test_fraction=0.25)
        assert d.classes == ["2", "7", "10"] and d.train_x.shape == (30, 5)  # numbers, not names, in order
        assert np.array_equal(np.asarray(d.train_x), x[d.train_x.index])
        assert np.array_equal(d.train_y, np.searchsorted([2, 7, 10], y[d.train_x.index]))
        assert "CSV X (40, 5), columns named on its first line" in d.source
    unlabelled = load_user(tmp_path / "d.csv")
    assert unlabelled.train_y is None and unlabelled.train_x.shape == (32, 6)
    np.savetxt(tmp_path / "plain.tsv", x, delimiter="\t")
    d = load_user(tmp_path / "plain.tsv", test_fraction=0.25)
    assert "TSV X (40, 5)" in d.source and "named" not in d.source
    assert np.array_equal(np.asarray(d.test_x), x[d.test_x.index])
    (tmp_path / "names.csv").write_text("".join(f"{c},{i}.5\n" for i, c in enumerate("bacb" * 5)))
    d = load_user(tmp_path / "names.csv", y_name="0")
    assert d.classes == ["a", "b", "c"] and d.train_x.shape[1] == 1
    # as spreadsheets write them: a byte-order mark first, quoted names and values, Windows line ends
    (tmp_path / "sheet.csv").write_bytes(b'\xef\xbb\xbf"p0","label"\r\n"0.5","b"\r\n1.5,a\r\n' * 1
                                         + b"".join(b'%d.5,"c"\r\n' % i for i in range(8)))
    d = load_user(tmp_path / "sheet.csv", y_name="label", test_fraction=0.2)
    assert d.classes == ["a", "b", "c"] and "labels from column 'label'" in d.source
    assert sorted(np.concatenate([np.asarray(d.train_x), np.asarray(d.test_x)]).ravel()) == \
        [0.5, 0.5, 1.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5]
    (tmp_path / "marked.csv").write_bytes(b"\xef\xbb\xbf" + b"".join(b"%d,%d\n" % (i, -i) for i in range(10)))
    assert read_data(tmp_path / "marked.csv").x.shape == (10, 2)  # the mark is no column name
    with pytest.raises(DataError, match=r"d\.csv: no column 'nope' \(--data-y\): its 6 columns are named p0, p1"):
        load_user(tmp_path / "d.csv", y_name="nope")
    with pytest.raises(UserError, match=r"plain\.tsv: a table's samples are its columns other than --data-y"):
        load_user(tmp_path / "plain.tsv", x_name="x")


def test_labels_required_and_two_sources(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((10, 2)))
    d = load_user(tmp_path / "x.npy")
    with pytest.raises(UserError, match=r"x\.npy: no labels, and --task classify needs them.*--data-y"):
        require_labels(d, tmp_path / "x.npy", "--task classify")
    ns = argparse.Namespace(data="x.npy", dataset_given=True, data_x=None)
    with pytest.raises(UserError, match="--data and --dataset"):
        check_source(ns)
    with pytest.raises(UserError, match="--data-x describes the file of --data"):
        check_source(argparse.Namespace(data=None, data_x="x"))


class _Recorder:
    """An array that records the row ranges read from it."""

    def __init__(self, a):
        self.a, self.shape, self.dtype, self.reads = a, a.shape, a.dtype, []

    def __getitem__(self, key):
        self.reads.append((key.start, key.stop))
        return self.a[key]


def test_a_rank_reads_only_its_rows_and_gets_the_same_bits():
    be = backend.select("cpu", "numpy", "float32")
    full = np.random.default_rng(5).random((1000, 3))
    src = _Recorder(full)
    index = np.sort(np.random.default_rng(6).permutation(1000)[:800])
    rows = Rows(src, index, np.float32, flat=True, key="k")
    whole = np.asarray(Rows(full, index, np.float32, flat=True, key="k"))
    for rank in range(4):
        src.reads.clear()
        mine = Shard.of(be, rows, 4, rank, 4)
        assert np.array_equal(mine.x, Shard.of(be, whole, 4, rank, 4).x)  # same rows, same bits
        lo, hi = index[mine.blocks.rows.start], index[mine.blocks.rows.stop - 1] + 1
        assert src.reads and all(lo <= a and b <= hi for a, b in src.reads), (src.reads, lo, hi)
        assert sum(b - a for a, b in src.reads) <= hi - lo < 1000 // 2


def test_read_data_npy_is_memory_mapped(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((10, 2), dtype=np.uint8))
    assert isinstance(read_data(tmp_path / "x.npy").x, np.memmap)
