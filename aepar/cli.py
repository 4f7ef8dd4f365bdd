"""What every runnable scheme shares: an argument parser that speaks once per job, the
argument types (so that an impossible value is one line and exit 2), and the options of
every run (device, seed, data, run directory, checkpoints, watchdog)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

from aepar.comm import world
from aepar.errors import UserError
from aepar.rows import DEFAULT_BLOCKS

__all__ = ["ArgumentParser", "add_common", "add_reduce_blocks", "progress", "gpu_blocks_hint", "positive_int",
           "non_negative_int", "seed", "learning_rate", "momentum", "non_negative_float", "unit_interval",
           "fraction_to_half", "positive_float", "add_data_options", "DatasetOption", "image_size"]


class ArgumentParser(argparse.ArgumentParser):
    """argparse that prints help on rank 0 only and turns bad options into UserError.

    Every rank parses the same argv, so a bad option is a collective error: rank 0 prints
    one line and every rank exits 2.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        module = self.prog.removeprefix("python -m ")
        if module.startswith("aepar."):  # the usage line as the user typed the program
            self.prog = f"aepar {module[6:]}" if os.environ.get("AEPAR_COMMAND") else f"python -m {module}"

    def error(self, message):
        error = UserError(message)
        error.collective = True
        raise error

    def print_help(self, file=None):
        if world().is_root:
            super().print_help(file)

    def print_usage(self, file=None):
        if world().is_root:
            super().print_usage(file)


# ---- argument types: argparse names the option and prints "invalid <__name__> value" -------
def _typed(name, convert, ok):
    def parse(text):
        value = convert(text)
        if not ok(value):
            raise ValueError(text)
        return value
    parse.__name__ = name
    return parse


def _finite(text) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


positive_int = _typed("positive integer", int, lambda v: v >= 1)
non_negative_int = _typed("non-negative integer", int, lambda v: v >= 0)
seed = _typed("seed (a non-negative integer)", int, lambda v: v >= 0)
learning_rate = _typed("learning rate (a finite number >= 0)", _finite, lambda v: v >= 0)
non_negative_float = _typed("finite number >= 0", _finite, lambda v: v >= 0)
positive_float = _typed("finite number > 0", _finite, lambda v: v > 0)
momentum = _typed("momentum (a number in [0, 1))", _finite, lambda v: 0 <= v < 1)
unit_interval = _typed("number strictly between 0 and 1", _finite, lambda v: 0 < v < 1)
fraction_to_half = _typed("fraction in [0, 0.5]", _finite, lambda v: 0 <= v <= 0.5)


def _plots_default() -> bool:
    """--plot's default: on unless $AEPAR_PLOTS says 0 (a test suite's or a sweep's many
    short runs, where drawing is a noticeable part of each)."""
    return os.environ.get("AEPAR_PLOTS", "1").strip().lower() not in ("0", "no", "false")


def add_common(parser: argparse.ArgumentParser, *, scheme: str):
    """Options every scheme takes: device and data, then the run directory, checkpoints and
    the watchdog (see aepar.rundir and aepar.guard)."""
    g = parser.add_argument_group("device and data")
    g.add_argument("--device", choices=["cpu", "gpu"], default=os.environ.get("AEPAR_DEVICE", "cpu"),
                   help="cpu: Numba kernels; gpu: CuPy kernels, one GPU per local rank "
                        "(default: $AEPAR_DEVICE or cpu)")
    g.add_argument("--kernels", choices=["auto", "numpy", "numba", "cupy"], default="auto",
                   help="force a kernel set (numpy = the reference oracle); auto follows --device")
    g.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                   help="precision of weights and arithmetic (default float64)")
    g.add_argument("--seed", type=seed, default=0,
                   help="one seed for data, weights and sampling (>= 0; default 0)")
    g.add_argument("--data-dir", default=os.environ.get("AEPAR_DATA"),
                   help="directory with your own data files (default: $AEPAR_DATA, else the "
                        "embedded real data)")
    add_data_options(g)
    g.add_argument("--quiet", action="store_true",
                   help="no progress lines, tables or closing line on standard output (errors still go to "
                        "standard error)")
    g.add_argument("--plot", action=argparse.BooleanOptionalAction, default=_plots_default(),
                   help="draw the run's figures (metrics.png with Pillow; reconstructions and the scheme's own "
                        "with matplotlib); --no-plot: numbers only (default on; $AEPAR_PLOTS=0 turns it off)")
    r = parser.add_argument_group(
        "run directory and checkpoints",
        "A run writes only into its run directory. A path that exists and is not an aepar run "
        "directory is never touched. On SIGTERM, SIGUSR1 or SIGINT the run saves a checkpoint at "
        "the next step and exits with code 75; --resume DIR continues it (on any number of ranks) "
        "with the same result as an uninterrupted run.")
    r.add_argument("--out", default=None, metavar="DIR",
                   help=f"the run directory, which must not exist yet (default: a new numbered "
                        f"directory runs/{scheme}/NNN)")
    r.add_argument("--overwrite", action="store_true",
                   help="replace the aepar run in --out DIR (only the files it wrote are deleted)")
    r.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the interrupted run in DIR from its checkpoint, with its own options")
    r.add_argument("--resume-or-start", action="store_true",
                   help="with --out DIR: start the run when DIR does not exist, continue it when DIR holds "
                        "this run (same program and options) unfinished, exit 0 when it is complete; "
                        "what a job that may be requeued passes (jobs/train.sh)")
    r.add_argument("--checkpoint-every", type=non_negative_int, default=0, metavar="N",
                   help="also save a checkpoint every N epochs (iterations for L-BFGS); 0: only by "
                        "time and on signals (default 0)")
    r.add_argument("--checkpoint-minutes", type=non_negative_float, default=10.0, metavar="T",
                   help="save a checkpoint every T minutes (default 10; 0: never by time)")
    r.add_argument("--timeout", type=positive_float, default=None, metavar="SECONDS",
                   help="end the job, naming the rank, if a rank makes no progress for this long "
                        "(a stalled rank; default: no watchdog)")
    return g


def image_size(text: str) -> tuple:
    """"32x32" -> (32, 32): height x width."""
    parts = text.lower().split("x")
    h, w = (int(p) for p in parts) if len(parts) == 2 else (0, 0)
    if h < 1 or w < 1:
        raise ValueError(text)
    return h, w


image_size.__name__ = "size HxW (e.g. 32x32)"


class DatasetOption(argparse._StoreAction):
    """--dataset, remembering that it was given (a preset's value is not): --data and
    --dataset together are refused (aepar.data.files.check_source)."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.dataset_given = True
        super().__call__(parser, namespace, values, option_string)


def add_data_options(group):
    """--data PATH, the user's own file, and what describes it (aepar.data.files)."""
    group.add_argument("--data", default=None, metavar="PATH",
                       help="your own data instead of --dataset: a .npy (X), .npz (x and optional y), .h5/.hdf5 "
                            "(--data-x, --data-y), a .csv/.tsv table (labels: --data-y) or a folder of PNG/JPEG "
                            "images (one sub-folder per class for labels); uint8 is scaled to [0, 1] (docs/data.md)")
    group.add_argument("--data-x", default=None, metavar="NAME",
                       help="the samples' array in --data's .npz or HDF5 file (default x, X, data or images; in "
                            "HDF5 x, else its only dataset of 2+ dimensions)")
    group.add_argument("--data-y", default=None, metavar="NAME",
                       help="the labels' array in --data's .npz or HDF5 file, or column of its .csv/.tsv (a name "
                            "from its first line, or a number from 0) (default for .npz: y, Y, labels or targets; "
                            "HDF5 and tables: none)")
    group.add_argument("--test-data", default=None, metavar="PATH",
                       help="the test set, in --data's format (default: the file's test part, else "
                            "--test-fraction of its rows)")
    group.add_argument("--test-fraction", type=unit_interval, default=None, metavar="F",
                       help="of --data's rows held out as the test set, chosen by --seed (default 0.2)")
    group.add_argument("--image-size", type=image_size, default=None, metavar="HxW",
                       help="resize the images of a --data folder to H x W pixels (default: they must all be "
                            "of one size)")


def _name(parser) -> str:
    """How notes name the program: aepar.sparse, as its error lines do."""
    name = parser.prog.split()[-1]
    return name if name.startswith("aepar") else f"aepar.{name}"


def first_rank() -> bool:
    """Whether this process is rank 0 of its job, before MPI starts (the launchers' variables)."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if name in os.environ:
            return os.environ[name] == "0"
    return True


class _Renamed(argparse.Action):
    """An option's old name, kept for one release: it sets the new option and says so once."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if first_rank():  # one line per job
            print(f"{_name(parser)}: note: {option_string} is now {self.new}; the old name "
                  "goes in the next release", file=sys.stderr, flush=True)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def renamed(group, old: str, new: str, *, dest: str, value=None, **kwargs):
    """Keep option ``old`` working as ``new`` (which sets ``dest``) for one release, hidden
    from --help. ``value``: what a flag (no argument) sets; otherwise pass ``type``/``choices``."""
    if value is not None:
        kwargs.update(nargs=0, const=value)
    group.add_argument(old, dest=dest, action=_Renamed, new=new, default=argparse.SUPPRESS,
                       help=argparse.SUPPRESS, **kwargs)


def add_reduce_blocks(group):
    """--reduce-blocks R: how many fixed blocks the rows are cut into (aepar.rows)."""
    group.add_argument("--reduce-blocks", type=positive_int, default=DEFAULT_BLOCKS, metavar="R",
                       help=f"fixed blocks the rows are cut into; a step adds the blocks' gradients in one "
                            f"fixed tree, so up to R ranks (any number of threads) give bit-identical "
                            f"results (default {DEFAULT_BLOCKS}; 1 allows one rank only and runs on one thread, "
                            f"as threads take whole blocks: on the CPU about as fast at one thread (within a "
                            f"tenth for most layers and CPUs measured; one Xeon's AVX2 path up to a sixth faster "
                            f"with 1) and slower at several (bench/results/block_tax.md); on a GPU the default "
                            f"{DEFAULT_BLOCKS} blocks trained 1.8-2.4 times slower than 1 at batch 100, the CAE "
                            f"a tenth faster, on an H200 (aepar 0.8.28, bench/results/gpu/gpu_epoch.csv))")


def default_float32(parser):
    """float32 unless asked otherwise: on mnist5k it trains to the same errors as float64
    (within the run-to-run spread of CD sampling) with about half the CPU time."""
    parser.set_defaults(dtype="float32")
    describe_dtype(parser, "precision of weights and arithmetic (default float32 for this scheme)")


def describe_dtype(parser, text: str):
    """--dtype's help as a scheme states it (what its default is, and why)."""
    for action in parser._actions:
        if action.dest == "dtype":
            action.help = text


def progress(comm, quiet: bool, message: str, *, left: float | None | bool = False):
    """One progress line, rank 0 only. An epoch's line passes ``left``, the estimated
    seconds left (None: not known yet; aepar.metrics.Eta), and starts with the time:
    "[16:42:05] layer 2/4 epoch 3/10 ... , 1m20s left"."""
    if comm.is_root and not quiet:
        if left is not False:
            from aepar.metrics import left_text

            message = f"[{time.strftime('%H:%M:%S')}] {message}, {left_text(left)}"
        print(message, flush=True)


def gpu_blocks_hint(comm, be, count: int, quiet: bool):
    """On one GPU with one rank, one line (rank 0) saying that ``--reduce-blocks 1`` is the
    fast path there: the blocks' own products cost the GPU more than one product of the batch."""
    if be.device == "gpu" and comm.size == 1 and count > 1:
        progress(comm, quiet, f"note: {count} blocks on one GPU give the bits of 1-{count} ranks but train "
                              f"up to several times slower than --reduce-blocks 1 (see --help)")


def parse_with_preset(parser, presets: dict, argv=None, old_names: dict | None = None):
    """Parse ``argv`` with the values of its ``--preset`` (a key of ``presets``) as the
    defaults, so that options given explicitly win. ``old_names``: {old preset name: new},
    kept working for one release with a note."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=None)
    known, _ = pre.parse_known_args(argv)
    new = (old_names or {}).get(known.preset)
    if new is not None:
        if first_rank():
            print(f"{_name(parser)}: note: --preset {known.preset} is now --preset {new}; the old name "
                  "goes in the next release", file=sys.stderr, flush=True)
        argv = [{known.preset: new, f"--preset={known.preset}": f"--preset={new}"}.get(a, a) for a in argv]
        known.preset = new
    if known.preset in presets:
        parser.set_defaults(**presets[known.preset])
    return parser.parse_args(argv)
