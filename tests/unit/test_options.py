"""One name per concept: every renamed option's old name still sets the new one, with one
note on stderr, and is hidden from --help; docs/options.md lists exactly these."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from aepar import classify, eager, finetune, pretrain, sparse, sync

ROOT = Path(__file__).resolve().parents[2]
W = ["--weights", "w.h5"]
# program, its parse(argv), old argv, new argv, the attribute both set
RENAMED = [
    ("aepar.finetune", lambda a: finetune.build_parser().parse_args(W + a), ["--epochs", "3"], ["--finetune-epochs", "3"], "finetune_epochs"),
    ("aepar.finetune", lambda a: finetune.build_parser().parse_args(W + a), ["--lr", "0.5"], ["--finetune-lr", "0.5"], "finetune_lr"),
    ("aepar.finetune", lambda a: finetune.build_parser().parse_args(W + a), ["--batch", "7"], ["--finetune-batch", "7"], "finetune_batch"),
    ("aepar.finetune", lambda a: finetune.build_parser().parse_args(W + a), ["--momentum", "0.3"], ["--finetune-momentum", "0.3"], "finetune_momentum"),
    ("aepar.finetune", lambda a: finetune.build_parser().parse_args(W + a), ["--from-pretrained"], ["--start-from", "pretrained"], "start_from"),
    ("aepar.classify", lambda a: classify.build_parser().parse_args(W + a), ["--from-finetuned"], ["--start-from", "finetuned"], "start_from"),
    ("aepar.sparse", lambda a: sparse.build_parser().parse_args(a), ["--lam", "0.2"], ["--weight-cost", "0.2"], "lam"),
    ("aepar.sparse", lambda a: sparse.build_parser().parse_args(a), ["--samples", "256"], ["--limit", "256"], "samples"),
    ("aepar.eager", eager.parse, ["--lr", "0.01"], ["--cae-lr", "0.01"], "cae_lr"),
    ("aepar.eager", eager.parse, ["--groups", "2"], ["--rank-groups", "2"], "rank_groups"),
    ("aepar.eager", eager.parse, ["--preset", "large"], ["--preset", "full"], "dataset"),
    ("aepar.pretrain", pretrain.parse_args, ["--group", "2"], ["--layer-group", "2"], "group"),
    ("aepar.sync", sync.parse_args, ["--handover", "newest"], ["--schedule", "newest"], "handover"),
    ("aepar.pretrain", pretrain.parse_args, ["--handover", "newest"], ["--schedule", "newest"], "handover"),
]


@pytest.mark.parametrize("prog, parse, old, new, dest", RENAMED, ids=[f"{r[0]} {r[2][0]}" for r in RENAMED])
def test_an_old_name_sets_the_new_option_with_one_note(capsys, prog, parse, old, new, dest):
    got_new = parse(new)
    assert capsys.readouterr().err == ""
    got_old = parse(old)
    err = capsys.readouterr().err.strip().splitlines()
    assert getattr(got_old, dest) == getattr(got_new, dest)
    assert len(err) == 1 and f"{old[1] if old[0] == '--preset' else old[0]}" in err[0] and "is now" in err[0], err


@pytest.mark.parametrize("build", [finetune.build_parser, classify.build_parser, sparse.build_parser, eager.build_parser,
                                   pretrain.build_parser, sync.build_parser])
def test_help_names_only_the_new_options(build):
    text = build().format_help()
    for old in ("--from-pretrained", "--from-finetuned", "--lam ", "--samples", "--groups", "--group ", "--handover ",
                "--preset large"):
        assert old not in text, old
    assert "DESIGN.md" not in text and "the seed" not in text


def test_the_docs_table_lists_every_renamed_option():
    page = (ROOT / "docs" / "options.md").read_text()
    for prog, _, old, new, _ in RENAMED:
        row = next((line for line in page.splitlines() if old[0] in line and prog.split(".")[1] in line), None)
        assert row is not None, f"docs/options.md lacks {prog} {old[0]}"
        assert re.search(re.escape(new[0]), row), (row, new)


@pytest.mark.parametrize("preset", ["quick", "full"])
def test_a_preset_trains_the_same_stack_in_sync_and_pretrain(preset):
    """One preset name, one recipe: the layer-wise stacks of ``aepar.sync --preset P`` and
    ``aepar.pretrain --preset P`` (sync's scheme there) get the same pre-training and
    fine-tuning options."""
    a, b = vars(sync.parse_args(["--preset", preset])), vars(pretrain.parse_args(["--preset", preset]))
    keys = ["dataset", "layers", "pretrainer", "epochs", "batch", "lr", "code_lr", "momentum", "final_momentum",
            "momentum_switch", "weight_cost", "finetune_epochs", "optimizer", "loss", "finetune_lr",
            "finetune_lr_decay", "finetune_weight_decay", "finetune_batch", "extra"]
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
