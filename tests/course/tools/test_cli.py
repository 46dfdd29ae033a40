"""python -m course: clear one-line errors, and the commands a student runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from course import REPO_ROOT, launch, registry
from course.runtime import visible_gpus
from course.tools import cli


def course(*args, timeout=120):
    return launch.run([sys.executable, "-m", "course", *args], timeout=timeout, cwd=REPO_ROOT)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "42"], "no lesson '42'"),
        (["run", "00", "--nproc", "2"], "runs one process"),
        (["run", "00", "--impl", "/no/such/folder"], "no such folder"),
        (["grade", "7x"], "no lesson '7x'"),
        (["teleport"], "invalid choice"),
        (["run"], "required"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(args, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        code = cli.main(args)
        raise SystemExit(code)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_an_unknown_lesson_is_one_line_even_after_the_registry_was_reloaded(capsys):
    """`mkdocs serve` reloads course.registry, which makes a new UnknownLesson class; the
    command line must catch the class of the day, not the one it saw at import."""
    import importlib

    snapshot = dict(registry.__dict__)
    try:
        importlib.reload(registry)
        assert cli.main(["run", "42"]) == 2
        assert cli.main(["grading-cost", "--lessons", "42"]) == 2
    finally:
        registry.__dict__.update(snapshot)
    err = capsys.readouterr().err
    assert err.count("no lesson '42'") == 2, err


@pytest.mark.parametrize("number", [n.number for n in registry.LESSONS if n.distributed])
def test_run_with_nccl_and_no_gpu_is_one_line_before_any_launch(number, capsys, monkeypatch):
    """`course run NN --backend nccl` on a machine without GPUs: one line, exit 2, and no
    launch (torchrun would wrap the lesson's own error in its report)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cli.subprocess, "call", lambda *a, **k: pytest.fail("it launched"))
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(cli.main(["run", number, "--backend", "nccl"]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "nccl needs CUDA GPUs" in err and "\n" not in err, err


def test_lesson_scripts_with_nccl_and_no_gpu_say_so_in_one_line(tmp_path):
    """The scripts themselves (not only `course run`): one line naming what is missing."""
    hidden = {"CUDA_VISIBLE_DEVICES": ""}
    jobs = {
        n: dict(
            args=[
                sys.executable,
                str(registry.get(n).path(REPO_ROOT / "solutions")),
                "--backend",
                "nccl",
            ],
            timeout=60,
            cwd=tmp_path,
            env=hidden,
        )  # fmt: skip
        for n in ("06", "08")
    }
    for number, result in launch.run_all(jobs).items():
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1, f"{number}: {result.describe()}"
        assert "nccl needs CUDA GPUs" in lines[0], f"{number}: {lines[0]}"


def test_list_shows_every_lesson(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for lesson in registry.LESSONS:
        assert lesson.number in out and lesson.title in out
        # a column each: the longest title still ends before the level starts
        row = re.escape(lesson.number) + r"\s+" + re.escape(lesson.title) + r"\s{2,}"
        assert re.search(row + re.escape(lesson.level), out), f"no row {row!r} in:\n{out}"


def test_release_check_passes_on_the_committed_starters(capsys):
    assert cli.main(["release", "--check"]) == 0


def test_commands_for_each_launcher(tmp_path):
    base = dict(number="09", slug="09_x", title="x", level="x", script="s.py", summary="x")
    (tmp_path / "09_x").mkdir()
    (tmp_path / "09_x" / "s.py").write_text("")
    spawn = registry.Lesson(launcher="spawn", **base)
    command = registry.command(spawn, tmp_path, 2, "gloo", ["--max-steps", "3"])
    assert command[1:] == [str(tmp_path / "09_x" / "s.py"), "--backend", "gloo", "--nproc", "2"] + [
        "--max-steps",
        "3",
    ]
    torchrun = registry.Lesson(launcher="torchrun", **base)
    command = registry.command(torchrun, tmp_path, 2, None, [])
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command = registry.command(torchrun, tmp_path, 2, None, [], max_restarts=1)
    assert command[3:6] == ["--standalone", "--max-restarts=1", "--nproc_per_node=2"]
    with pytest.raises(ValueError, match="torchrun lessons only"):
        registry.command(spawn, tmp_path, 2, None, [], max_restarts=1)
    with pytest.raises(ValueError, match="at least 1"):
        registry.command(spawn, tmp_path, 0, None, [])


def test_run_passes_arguments_after_dashes_to_the_script():
    result = course("run", "00", "--impl", "solutions", "--", "--json")
    assert result.ok, result.describe()
    report = json.loads(result.output.splitlines()[-1])
    assert report["backend"] in ("gloo", "nccl")


def test_doctor_prints_the_gpu_count():
    result = course("doctor")
    assert result.ok, result.describe()
    assert "How many GPUs does this process see?" in result.output


def test_grade_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "grade.json"
    result = course("grade", "00", "--impl", "solutions", "--grade-json", str(out), timeout=300)
    assert result.ok, result.describe()
    assert "Environment check" in result.output and "total" in result.output
    results = json.loads(out.read_text())
    assert results["score"] == results["max_score"] > 0
    assert str(REPO_ROOT / "solutions") == results["impl"]


def _test_names(path, gpus_only: bool = False) -> list[str]:
    """The test functions of a file; with gpus_only, those marked @pytest.mark.gpus(...)."""
    import ast

    tree = ast.parse(path.read_text())
    return [
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
        and n.name.startswith("test_")
        and (not gpus_only or "mark.gpus(" in "".join(ast.unparse(d) for d in n.decorator_list))
    ]


def test_grade_k_grades_one_exercise_and_every_exercise_names_its_own():
    """`course grade 09 -k oom` runs exactly the tests whose names hold "oom" (counted here
    from the test file), and each lesson 09 script's `-k` selects its own tests."""
    tests = _test_names(registry.tests("09")[0])
    result = course("grade", "09", "-k", "oom", "--impl", "solutions", timeout=300)
    assert result.ok, result.describe()
    oom = [t for t in tests if "oom" in t]
    gpu_oom = [t for t in _test_names(registry.tests("09")[0], True) if "oom" in t]
    skipped = 0 if visible_gpus() else len(gpu_oom)  # a GPU's test skips on a machine without
    found = re.search(r"(\d+) passed(?:, (\d+) skipped)?, (\d+) deselected", result.output)
    assert found and int(found[1]) == len(oom) - skipped >= 1, (
        f"expected {len(oom) - skipped} passed:\n{result.output}"
    )
    assert int(found[2] or 0) == skipped, f"expected {skipped} skipped:\n{result.output}"
    for script in sorted((REPO_ROOT / "solutions" / "09_debugging").glob("*.py")):
        said = re.search(r"python -m course grade 09 -k (\w+)", script.read_text())
        exercise = script.stem
        assert said, f"{script.name}: no `python -m course grade 09 -k ...` line"
        chosen = [t for t in tests if said[1] in t]
        assert chosen and all(t.startswith(f"test_{exercise}_") for t in chosen), (
            f"{script.name}: -k {said[1]} selects {chosen}; expected its own tests, "
            f"test_{exercise}_*"
        )
        assert chosen == [t for t in tests if t.startswith(f"test_{exercise}_")], script.name


def test_the_fsdp2_cases_graded_alone_pass_on_the_reference_every_time():
    """`course grade 10 -k "fsdp2_trains or resumes_on_3"`: the FSDP2 case is the first
    to fork ranks from the grader, and their first backward starts autograd's threads.
    Before the ranks renewed their thread pool at once (course/grader/case_ranks.py), 3 of 5
    such gradings of the reference failed ("Invalid thread pool!", SIGABRT); three in a
    row now must all score full marks."""
    for attempt in range(3):
        result = course("grade", "10", "-k", "fsdp2_trains or resumes_on_3", "--impl",
                        "solutions", timeout=300)  # fmt: skip
        assert result.ok and "2 passed" in result.output, f"attempt {attempt + 1}:\n" + (
            result.describe(30)
        )


def test_version_is_the_installed_packages():
    """`python -m course --version` says the version pyproject.toml installs
    (read from course.__version__), as results files and records carry it."""
    from importlib.metadata import PackageNotFoundError, version

    import course

    run = launch.run([sys.executable, "-m", "course", "--version"], timeout=60)
    assert run.returncode == 0 and run.output.strip() == f"course {course.__version__}", (
        run.describe()
    )
    try:
        installed = version("course")
    except PackageNotFoundError:
        pytest.skip("the course is not pip-installed here")
    assert installed == course.__version__, (installed, course.__version__)


def test_a_cpu_with_other_kernels_is_told_once_how_to_get_the_pages_digits():
    from course.tools.author.record import PINNED_ENV, capability_note

    note = capability_note({}, "AVX512")
    assert note and "AVX512" in note and all(f"{k}={v}" in note for k, v in PINNED_ENV.items())
    assert capability_note({}, "AVX2") is None  # the records' own kernels
    assert capability_note({"ATEN_CPU_CAPABILITY": "avx2"}, "AVX512") is None  # pinned
    assert capability_note({"ATEN_CPU_CAPABILITY": "default"}, "DEFAULT")


def test_the_assistants_policy_names_only_real_commands():
    """AGENTS.md points a student's assistant to course commands: each one it names exists."""
    text = (REPO_ROOT / "AGENTS.md").read_text(encoding="utf-8")
    verbs = set(re.findall(r"python -m course (\w[\w-]*)", text))
    assert {"hint", "grade", "release"} <= verbs, verbs
    help_text = subprocess.run([sys.executable, "-m", "course", "--help"], capture_output=True,
                               text=True, timeout=60).stdout  # fmt: skip
    unknown = [v for v in verbs if not re.search(rf"\b{v}\b", help_text)]
    assert not unknown, f"AGENTS.md names commands the CLI does not have: {unknown}"


def test_the_registry_answers_which_tests_grade_each_lesson(tmp_path):
    """registry.tests: each lesson's own files (by Lesson or number), every lesson's
    together, none shared; under another root, that root's."""
    every = registry.tests()
    per = [registry.tests(lesson) for lesson in registry.LESSONS]
    assert all(per) and sorted(p for files in per for p in files) == every
    assert registry.tests("10") == registry.tests(registry.get("10"))
    (tmp_path / "tests" / "lessons").mkdir(parents=True)
    (tmp_path / "tests" / "lessons" / "test_03_mine.py").write_text("")
    assert [p.name for p in registry.tests("03", tmp_path)] == ["test_03_mine.py"]


def _listed_verbs(help_text: str) -> list[tuple[str, str, str]]:
    """(heading, verb, help) of each verb line of `python -m course --help`, in order."""
    from course.tools.verbs import HEADINGS

    listed, heading = [], None
    for line in help_text.splitlines():
        if line and not line.startswith(" "):
            heading = line.rstrip(":") if line.rstrip(":") in HEADINGS.values() else None
        elif heading and (row := re.match(r"  (\S+)\s+(.+)$", line)):
            listed.append((heading, row[1], row[2]))
    return listed


def test_the_verb_table_is_the_only_declaration_and_every_entry_dispatches(capsys, monkeypatch):
    """cli.VERBS declares each verb once: --help lists exactly its entries, the parser knows
    exactly its names, each entry's module is in its audience's folder and does the work
    (a verb with its own parser gets the rest of the line, `--` included), and every tool
    with a main() is some verb's."""
    import argparse
    import ast
    import importlib

    from course.tools.verbs import HEADINGS, parser

    names = [verb.name for verb in cli.VERBS]
    assert len(set(names)) == len(names), names
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    listed = _listed_verbs(capsys.readouterr().out)
    assert listed == [(HEADINGS[v.audience], v.name, v.help) for v in cli.VERBS], listed
    top = parser(cli.VERBS, "x", "x")
    (sub,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == names
    for verb in cli.VERBS:
        assert verb.module == "cli" or verb.module.split(".")[0] == verb.audience, verb
        module = importlib.import_module(f"course.tools.{verb.module}")
        if verb.run is not None:  # parsed here: its own --help, then its handler
            assert callable(verb.run) and verb.run.__module__ == cli.__name__, verb
            with pytest.raises(SystemExit) as exit_info:
                cli.main([verb.name, "--help"])
            assert exit_info.value.code == 0
            assert f"usage: python -m course {verb.name} " in capsys.readouterr().out
            continue
        seen = []
        monkeypatch.setattr(module, "main", lambda argv, seen=seen: seen.append(argv) or 7)
        assert cli.main([verb.name, "--x", "--", "y"]) == 7 and seen == [["--x", "--", "y"]]
    tools = cli.REPO_ROOT / "course" / "tools"
    with_main = {
        ".".join(p.relative_to(tools).with_suffix("").parts).removesuffix(".__init__")
        for p in tools.rglob("*.py")
        if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(
            p.read_text(encoding="utf-8")).body)
    }  # fmt: skip
    assert with_main == {v.module for v in cli.VERBS if v.run is None} | {"cli", "author.sizes"}


def test_help_lists_students_verbs_then_instructors_then_authors():
    """`python -m course --help`: a heading per audience, students' first; the verbs a
    student needs on day one are theirs, grading a class the instructors', making the
    course's records its authors'."""
    from course.tools.verbs import AUTHOR, HEADINGS, INSTRUCTOR, STUDENT

    text = subprocess.run([sys.executable, "-m", "course", "--help"], capture_output=True,
                          text=True, timeout=60, cwd=REPO_ROOT).stdout  # fmt: skip
    order = [text.index(f"\n{HEADINGS[a]}:\n") for a in (STUDENT, INSTRUCTOR, AUTHOR)]
    assert order == sorted(order), text
    audience = {verb: heading for heading, verb, _ in _listed_verbs(text)}
    assert all(audience[v] == HEADINGS[STUDENT] for v in ("list", "run", "grade", "hint"))
    assert all(audience[v] == HEADINGS[INSTRUCTOR] for v in ("grade-class", "autograder"))
    assert all(audience[v] == HEADINGS[AUTHOR] for v in ("release", "record", "figures"))


def test_the_modules_docstring_shows_every_verb():
    """cli.py's docstring, the map a newcomer reads first, has a command line for every
    verb of VERBS, and none for a verb that is not there."""
    import re

    from course.tools import cli

    shown, verbs = (
        set(re.findall(r"^python -m course ([a-z-]+)", cli.__doc__, re.M)),
        set(cli.BY_NAME),
    )
    assert shown == verbs, f"missing: {sorted(verbs - shown)}; not verbs: {sorted(shown - verbs)}"
