"""Property-based tests of the command lines: any combination of options, valid or not,
parses to a namespace whose values respect the documented ranges, or is refused with a
UserError of one line naming the option - never another exception (argparse's own
SystemExit included). The layer and extra-epoch lists and the block checks likewise."""
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aepar  # noqa: F401
from aepar import finetune, greedy, sparse, sync
from aepar.errors import UserError
from aepar.parallel.synchronized import parse_extras
from aepar.rows import check_blocks
from aepar.stack import parse_layers

# 4 x 250 command lines + 200 layer lists + 150 extra-epoch lists + 150 block checks = 1,500 cases
SETTINGS = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

NUMBERS = st.one_of(st.integers(-5, 10 ** 6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["nan", "inf", "-inf", "1e400", "0", "-0", "0.5", "1", "abc", "", "1e-300"]))
PATHS = st.sampled_from(["runs/x", "/", ".", "..", "out dir", "a/b/c"])

COMMON = {"--device": st.sampled_from(["cpu", "gpu", "tpu"]), "--kernels": st.sampled_from(["auto", "numpy", "x"]),
          "--dtype": st.sampled_from(["float64", "float32", "float16"]), "--seed": NUMBERS,
          "--out": PATHS, "--checkpoint-every": NUMBERS, "--checkpoint-minutes": NUMBERS, "--timeout": NUMBERS}
FLAGS = ["--quiet", "--overwrite"]
SPARSE = dict(COMMON, **{"--limit": NUMBERS, "--iterations": NUMBERS, "--patch": NUMBERS, "--hidden": NUMBERS,
                         "--rho": NUMBERS, "--weight-cost": NUMBERS, "--beta": NUMBERS})
LAYERWISE = dict(COMMON, **{"--epochs": NUMBERS, "--batch": NUMBERS, "--reduce-blocks": NUMBERS, "--lr": NUMBERS,
                            "--code-lr": NUMBERS, "--momentum": NUMBERS, "--final-momentum": NUMBERS,
                            "--weight-cost": NUMBERS, "--finetune-epochs": NUMBERS, "--finetune-lr": NUMBERS,
                            "--finetune-momentum": NUMBERS, "--finetune-batch": NUMBERS,
                            "--finetune-weight-decay": NUMBERS,
                            "--optimizer": st.sampled_from(["sgd", "adam", "lbfgs"]),
                            "--loss": st.sampled_from(["mse", "xent", "l1"]), "--layers": st.text(max_size=12)})
SYNC = dict(LAYERWISE, **{"--val-fraction": NUMBERS, "--dp-ranks": NUMBERS, "--extra": st.text(max_size=10),
                          "--handover": st.sampled_from(["plan", "newest", "never"])})

# documented ranges of what parses
RANGES = {"seed": lambda v: v >= 0, "samples": lambda v: v >= 1, "iterations": lambda v: v >= 1,
          "rho": lambda v: 0 < v < 1, "lam": lambda v: math.isfinite(v) and v >= 0,
          "beta": lambda v: math.isfinite(v) and v >= 0, "lr": lambda v: math.isfinite(v) and v >= 0,
          "finetune_lr": lambda v: math.isfinite(v) and v >= 0, "momentum": lambda v: 0 <= v < 1,
          "final_momentum": lambda v: 0 <= v < 1, "finetune_momentum": lambda v: 0 <= v < 1,
          "finetune_weight_decay": lambda v: math.isfinite(v) and v >= 0,
          "checkpoint_minutes": lambda v: math.isfinite(v) and v >= 0,
          "timeout": lambda v: v is None or (math.isfinite(v) and v > 0), "reduce_blocks": lambda v: v >= 1,
          "val_fraction": lambda v: 0 <= v <= 0.5, "batch": lambda v: v >= 1}


def argv_from(options):
    @st.composite
    def draw(d):
        argv = []
        for name in d(st.lists(st.sampled_from(sorted(options) + FLAGS), max_size=6)):
            argv.append(name)
            if name not in FLAGS:
                argv.append(d(options[name]))
        return argv
    return draw()


def parses_or_one_line(parse, argv):
    try:
        args = parse(argv)
    except UserError as exc:
        text = str(exc)
        assert "\n" not in text and text, repr(text)
        assert any(a.startswith("--") and a.split("=")[0] in text for a in argv) or "argument" in text, (argv, text)
        return None
    for name, ok in RANGES.items():
        if hasattr(args, name):
            assert ok(getattr(args, name)), (name, getattr(args, name), argv)
    return args


@SETTINGS
@given(argv_from(SPARSE))
def test_sparse_command_lines(argv):
    parses_or_one_line(sparse.build_parser().parse_args, argv)


@SETTINGS
@given(argv_from(LAYERWISE))
def test_greedy_command_lines(argv):
    parses_or_one_line(greedy.build_parser().parse_args, argv)


@SETTINGS
@given(argv_from(SYNC), st.sampled_from([None, "quick", "full"]))
def test_sync_command_lines(argv, preset):
    parses_or_one_line(sync.parse_args, (["--preset", preset] if preset else []) + argv)


@SETTINGS
@given(argv_from(dict(COMMON, **{"--finetune-epochs": NUMBERS, "--finetune-lr": NUMBERS, "--finetune-batch": NUMBERS,
                                  "--reduce-blocks": NUMBERS})))
def test_finetune_command_lines(argv):
    parses_or_one_line(finetune.build_parser().parse_args, ["--weights", "w.h5"] + argv)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.one_of(st.text(max_size=20), st.lists(st.integers(-3, 3000), max_size=6).map(lambda l: "-".join(map(str, l)))),
       st.integers(1, 1000))
def test_layer_lists(text, n_input):
    try:
        sizes = parse_layers(text, n_input)
    except UserError as exc:
        assert "\n" not in str(exc) and "--layers" in str(exc)
        return
    assert sizes[0] == n_input and len(sizes) >= 2 and all(s >= 1 for s in sizes)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.one_of(st.none(), st.text(max_size=12), st.lists(st.integers(-2, 50), max_size=6).map(
    lambda l: ",".join(map(str, l)))), st.integers(1, 6))
def test_extra_epoch_lists(text, n_layers):
    try:
        extras = parse_extras(text, n_layers)
    except UserError as exc:
        assert "\n" not in str(exc) and "--extra" in str(exc)
        return
    assert len(extras) == n_layers and extras[0] == 0 and min(extras) >= 0


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(0, 200))
def test_blocks_refuse_more_ranks_than_blocks_or_rows(ranks, count, rows):
    try:
        check_blocks(ranks, count, rows)
    except UserError as exc:
        assert "\n" not in str(exc) and (count < ranks or rows < count)
        return
    assert ranks <= count <= rows


@given(device=st.sampled_from(["cpu", "gpu"]), ranks=st.integers(1, 4), count=st.integers(1, 16),
       root=st.booleans(), quiet=st.booleans())
def test_the_gpu_blocks_hint_speaks_once_where_one_block_is_faster(device, ranks, count, root, quiet):
    """One line, from rank 0, when one GPU runs one rank in several blocks (their own
    products cost the GPU more than one of the batch); nothing anywhere else."""
    import contextlib
    import io
    from types import SimpleNamespace

    from aepar.cli import gpu_blocks_hint

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        gpu_blocks_hint(SimpleNamespace(size=ranks, is_root=root), SimpleNamespace(device=device), count, quiet)
    lines = out.getvalue().splitlines()
    if device == "gpu" and ranks == 1 and count > 1 and root and not quiet:
        assert len(lines) == 1 and "--reduce-blocks 1" in lines[0] and f"{count} blocks" in lines[0]
    else:
        assert lines == []
