"""python -m course figures: every figure the site renders is known with the command that
makes it again, a page cannot render one that is not, and --run does what this machine can."""

from __future__ import annotations

import json
import os
import sys

import pytest

from course import REPO_ROOT, launch
from course.tools.author import figures


def parses(verb: str, args: list[str]) -> None:
    """The verb's own parser accepts the arguments the figure would be made with."""
    from course.tools.author import compositions, measure_tolerances, mutate, schedules
    from course.tools.instructor import grading_cost
    from course.tools.student import bandwidth, bench, planning, timeline

    parser = {"bench": bench.parser, "bandwidth": bandwidth.parser, "timeline": timeline.parser}
    parser["schedules"] = schedules.parser
    parser["compositions"] = compositions.parser
    parser["plan"] = planning.parser
    parser["grading-cost"] = grading_cost.parser
    parser["tolerances"] = measure_tolerances.parser
    parser["mutate"] = mutate.parser
    try:
        parser[verb]().parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"`python -m course {verb} {' '.join(args)}` does not parse (exit {exc})")


def test_every_record_under_docs_results_is_known_with_a_command_that_parses():
    from course.tools.author import record

    known = figures.catalog()
    assert {f.record for f in known} == {
        p.relative_to(REPO_ROOT).as_posix() for p in figures.candidates()
    }
    verbs = {f.verb for f in known}
    assert {"bench", "bandwidth", "timeline", "record", "experiment", "grading-cost"} <= verbs
    assert "tolerances" in verbs
    for figure in known:
        assert figure.date and figure.torch, f"{figure.record}: no date or torch in provenance"
        if figure.verb == "experiment":
            assert (REPO_ROOT / figure.command[1]).is_file(), figure
            assert figure.gpus >= 1, f"{figure.record}: an experiment that says no GPU count"
        elif figure.verb == "record":
            recording = record.get(figure.command[-1])  # raises for a name no recording has
            assert figure.gpus == recording.gpus, (figure, recording.gpus)
        else:
            args = list(figure.command[4:])
            parses(figure.verb, args)
            assert args[args.index("--out") + 1] == figure.record, figure.command
    record_gpus = {f.name: f.gpus for f in known if f.verb == "record"}
    assert record_gpus["outputs/09_find_unused_gpu"] == 1 and record_gpus["outputs/01_cpu"] == 0
    bench_gpus = {f.name: f.gpus for f in known if f.verb == "bench"}
    assert bench_gpus["08_performance/1xh200-b128-files-compile"] == 1
    assert bench_gpus["scaling_2xh200/fp32"] == 2
    fp32 = next(f for f in known if f.name == "scaling_2xh200/fp32")
    assert fp32.command[-2:] == ("--gpus", "2"), "it would measure every GPU there is"


def test_an_unknown_record_is_refused(tmp_path):
    folder = tmp_path / "docs" / "results" / "odd"
    folder.mkdir(parents=True)
    (folder / "made_by_hand.json").write_text(json.dumps({"kind": "typed", "rows": []}))
    (folder / "from_elsewhere.json").write_text(
        json.dumps({"kind": "course-bench", "provenance": {"command": "python bench.py"}})
    )
    (folder / "lonely.txt").write_text("# NVIDIA H200 x2, torch 2.11, CUDA 13, 2026-11-30\n")
    (tmp_path / "outside.json").write_text(json.dumps({"kind": "course-bench"}))
    for name, says in [
        ("docs/results/odd/made_by_hand.json", "kind 'typed'"),
        ("docs/results/odd/from_elsewhere.json", "not a course command"),
        ("docs/results/odd/lonely.txt", "no lonely.py"),
        ("outside.json", "from docs/results/ only"),
        ("docs/results/odd/missing.json", "no such record"),
    ]:
        with pytest.raises(figures.UnknownFigure, match=says):
            figures.recipe(name, tmp_path)


def test_the_site_refuses_to_render_a_record_it_cannot_make_again(tmp_path):
    """The hook's renderers ask figures.recipe() first: a page that shows a record made by
    hand fails the build with the record's name, and the results page lists every figure."""
    pytest.importorskip("mkdocs", reason="the site's hook needs mkdocs (the dev extras)")
    hooks = str(REPO_ROOT / "docs" / "hooks")
    sys.path.insert(0, hooks)
    try:
        from directives import records
        from mkdocs.exceptions import PluginError
    finally:
        sys.path.remove(hooks)
    folder = tmp_path / "docs" / "results" / "odd"
    folder.mkdir(parents=True)
    (folder / "typed.json").write_text(json.dumps({"kind": "typed", "rows": [{"x": 1}]}))
    with pytest.raises(PluginError, match="typed.json.*cannot make it again"):
        records.render_results("docs/results/odd", root=tmp_path)
    with pytest.raises(PluginError, match="cannot make it again"):
        records.render_bench_table("docs/results/odd/typed.json", root=tmp_path)
    table = records.render_figures()
    assert table.count("\n| `") == len(figures.catalog())
    assert "| `outputs/01_cpu` | `record 01_cpu` | CPU |" in table


def test_run_makes_what_the_cpu_can_and_says_what_it_skips():
    out = launch.run(
        args=[sys.executable, "-m", "course", "figures", "--run", "--dry-run"],
        timeout=60, env={"CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert out.returncode == 0, out.describe()
    lines = dict(line.split(": ", 1) for line in out.output.splitlines())
    known = figures.catalog()
    assert set(lines) == {f.name for f in known}
    cores = os.cpu_count()
    for figure in known:
        if figure.gpus:
            assert lines[figure.name] == f"skipped, needs {figure.needs} (this machine has 0)"
        elif figure.cores and figure.cores != cores:
            said = f"skipped, measured on {figure.cores} CPU cores (this machine has {cores})"
            assert lines[figure.name] == said
        else:
            assert lines[figure.name].startswith("python "), lines[figure.name]
    timed = {f.name: f.needs for f in known if f.cores}
    assert timed.get("grading/cpu-2") == "2 CPU cores", timed  # another machine's would lie
    listing = launch.run(
        args=[sys.executable, "-m", "course", "figures", "--only", "outputs/01_cpu", "nope"],
        timeout=60,
    )
    assert listing.returncode == 2 and "no figure nope" in listing.output, listing.describe()


def test_every_record_writer_names_the_course_version_in_its_provenance():
    """A figure says which version of the course made it (the results page's last column)."""
    import course
    from course.tools.author import compositions, measure_tolerances, mutate, record, schedules
    from course.tools.instructor import grading_cost
    from course.tools.student import bandwidth, planning, timeline
    from course.tools.student.bench.catalogue import Settings
    from course.tools.student.bench.provenance import provenance as bench_provenance

    settings = Settings("cpu", 2, "resnet18", 32, 64, "fp32", False)
    made = {
        "bench": bench_provenance(["--device", "cpu"], settings),
        "bandwidth": bandwidth.provenance([], "gloo", 2),
        "timeline": timeline.provenance([], "gloo"),
        "schedules": schedules.provenance([]),
        "compositions": compositions.provenance([]),
        "plan": planning.provenance([], "gloo", "none"),
        "record": record.provenance(),
        "grading-cost": grading_cost.provenance([]),
        "tolerances": measure_tolerances.provenance("python -m course tolerances"),
        "mutate": mutate.provenance("15", [1, 2]),
    }
    assert set(made) == set(figures.MADE_BY.values())
    wrong = {
        verb: p.get("course") for verb, p in made.items() if p.get("course") != course.__version__
    }
    assert not wrong, f"expected course {course.__version__} in every provenance, saw {wrong}"
    grading = figures.recipe("docs/results/grading/cpu-2.json")
    assert grading.course == course.__version__, f"the catalog read course {grading.course!r}"
