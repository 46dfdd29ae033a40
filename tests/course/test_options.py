"""course.options: the flags every training lesson shares, checked once."""

import pytest
import torch

from course import options


def parse(*argv, resume=False):
    p = options.parser("Lesson NN - a title.\n\nmore text", prog="train.py", per="per rank")
    if resume:
        p.add_argument("--resume", action="store_true")
    return options.parse(p, list(argv))


def test_defaults_and_what_the_flags_imply():
    args = parse("--quiet", "--channels-last")
    assert (args.data, args.model, args.norm, args.epochs, args.batch_size) == (
        "digits",
        "cnn",
        "batch",
        3,
        64,
    )
    assert args.progress is False  # --quiet, and never into a file
    assert args.memory_format == torch.channels_last
    assert parse().memory_format == torch.preserve_format


@pytest.mark.parametrize(
    "argv",
    [["--epochs", "0"], ["--batch-size", "many"], ["--lr", "-1"], ["--norm", "group"]],
)
def test_bad_values_are_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        parse(*argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("train.py: error:") and err.endswith("(see --help)")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--data", "/no/such/folder"], "no such folder"),
        (["--data", "imagenet"], "unknown"),
        (["--data", "synthetic:0"], "synthetic:N"),
        (["--image-size", "16"], "8x8"),
    ],
)
def test_bad_data_is_one_line_before_any_rank_starts(capsys, argv, words):
    """What build_datasets would refuse inside every rank (a traceback per rank under
    mp.spawn) is refused by the parser, in the launching process."""
    with pytest.raises(SystemExit) as exit_:
        parse(*argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and words in err, err


def test_compile_with_small_buckets_is_one_line(capsys):
    p = options.parser("Lesson 08 - a title.", prog="train.py")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    assert options.parse(p, ["--compile", "--bucket-cap-mb", "1"]).compile
    with pytest.raises(SystemExit):
        options.parse(p, ["--compile", "--bucket-cap-mb", "0.5"])
    assert "--compile needs --bucket-cap-mb 1 or more" in capsys.readouterr().err


def test_resume_needs_a_checkpoint(capsys):
    with pytest.raises(SystemExit):
        parse("--resume", resume=True)
    assert "--resume needs --checkpoint" in capsys.readouterr().err
    assert parse("--resume", "--checkpoint", "c.pt", resume=True).resume


def test_steps_left():
    assert options.steps_left(parse(), 10) is None
    args = parse("--max-steps", "12")
    assert [options.steps_left(args, s) for s in (0, 10, 12, 20)] == [12, 2, 0, 0]


def test_non_negative_float():
    assert options.non_negative_float("0") == 0.0 and options.non_negative_float("2.5") == 2.5
    for bad in ("-1", "nan"):
        with pytest.raises(Exception, match="must be 0 or more"):
            options.non_negative_float(bad)


def test_what_parse_adds_is_declared():
    """args.progress and args.memory_format are not flags: options.Options declares them,
    so that a reader (and an editor) finds where they come from."""
    args = parse("--quiet")
    assert isinstance(args, options.Options)
    declared = options.Options.__annotations__
    assert {"progress", "memory_format"} <= set(declared), declared
    assert all(name in vars(args) for name in declared)
