"""course.tools.student.hints and the release's hint files: `python -m course hint NN [K]`."""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest

from course import REPO_ROOT, launch, registry
from course.tools.author import release
from course.tools.student import hints

WITH_TODOS = [lesson for lesson in registry.LESSONS if hints.todos(lesson)]


def hint_command(*args, cwd=REPO_ROOT):
    result = launch.run([sys.executable, "-m", "course", "hint", *args], timeout=60, cwd=cwd)
    result.output = " ".join(result.output.split())  # the command wraps long lines
    return result


def test_every_lesson_ships_its_hints_next_to_the_starter():
    """Every TODO of every starter file is in hints.json with its goal and two hints or
    more: a `raise NotImplementedError` names its TODO, and a planted bug (lesson 09)
    starts at the line its TODO names."""
    assert [lesson.number for lesson in WITH_TODOS] == [x.number for x in registry.LESSONS]
    for lesson in WITH_TODOS:
        folder = lesson.path(REPO_ROOT / "lessons").parent
        files = {f"{lesson.slug}/{name}": (folder / name).read_text()
                 for name in (lesson.exercises or (lesson.script,))}  # fmt: skip
        todos = hints.todos(lesson)
        raises = sum(text.count('raise NotImplementedError("TODO at') for text in files.values())
        assert len(todos) == raises + sum(1 for todo in todos if todo.get("bug"))
        for todo in todos:
            name, line = todo["id"].removeprefix("TODO at ").rsplit(":", 1)
            starter = files[name]
            assert "# HINT" not in starter, f"{name}: hints leaked into the starter"
            assert todo["goal"], todo
            if todo.get("bug"):
                at = starter.splitlines()[int(line) - 1].strip()
                assert at == todo["bug"][0], f"{todo['id']}: the bug starts with {at!r}"
            else:
                assert todo["id"] in starter, todo
            assert len(todo["hints"]) >= 2, f"{todo['id']}: give at least two hints"


@pytest.mark.parametrize("lesson", WITH_TODOS, ids=lambda lesson: lesson.number)
def test_a_todo_states_the_goal_and_leaves_the_code_to_the_hints(lesson):
    """The TODO text must not hand over the last hint (the near-code one)."""
    for todo in hints.todos(lesson):
        last = todo["hints"][-1]
        assert last not in todo["goal"], f"{todo['id']}: the goal repeats the last hint"


def test_convert_collects_goal_and_hints_and_drops_them_from_the_starter():
    source = (
        "def f():\n"
        "    # TODO: make f return one,\n"
        "    # because tests like it.\n"
        "    # HINT 1: think of a number\n"
        "    # HINT 2: the number after zero,\n"
        "    #   written as a literal\n"
        "    ### BEGIN SOLUTION\n"
        "    return 1\n"
        "    ### END SOLUTION\n"
    )
    starter, todos = release.convert(source, "x.py")
    assert "HINT" not in starter and "return 1" not in starter
    assert 'raise NotImplementedError("TODO at x.py:4 is not done yet")' in starter
    assert todos == [
        {
            "id": "TODO at x.py:4",
            "goal": "make f return one, because tests like it.",
            "hints": ["think of a number", "the number after zero, written as a literal"],
        }
    ]


def test_hint_walks_through_the_todos_as_they_are_solved(tmp_path):
    lesson = registry.get("01")
    folder = lesson.path(REPO_ROOT / "lessons").parent
    impl = tmp_path / "impl"
    shutil.copytree(folder, impl / folder.name)
    todos = hints.todos(lesson)
    first = hint_command("01", "--impl", str(impl))
    assert first.ok, first.describe()
    assert f"TODO 1 of {len(todos)}" in first.output and todos[0]["hints"][0] in first.output
    assert "other scripts" not in first.output  # lesson 01 has one script
    assert "python -m course hint 01 2" in first.output
    second = hint_command("01", "2", "--impl", str(impl))
    assert todos[0]["hints"][1] in second.output

    script = lesson.path(impl)  # "solve" the first TODO: its raise is gone
    source = script.read_text()
    script.write_text(
        source.replace(f'raise NotImplementedError("{todos[0]["id"]}', "pass  # (", 1)
    )
    after = hint_command("01", "--impl", str(impl))
    assert f"TODO 2 of {len(todos)}" in after.output and todos[1]["hints"][0] in after.output

    done = hint_command("01", "--impl", str(REPO_ROOT / "solutions"))
    assert "every TODO of lesson 01 is done" in done.output


def test_hint_reaches_every_script_of_a_lesson_with_several(tmp_path):
    """Lesson 10 has three scripts: `hint 10 fsdp2` gives fsdp2.py's next TODO while zero.py's
    are still open, the first line counts what each other script has left, and a script
    whose TODOs are all done says so by name."""
    lesson = registry.get("10")
    folder = lesson.path(REPO_ROOT / "lessons").parent
    impl = tmp_path / "impl"
    shutil.copytree(folder, impl / folder.name)
    todos = [t for t in hints.todos(lesson) if hints.script_of(t) == "fsdp2.py"]
    result = hint_command("10", "fsdp2", "2", "--impl", str(impl))
    assert result.ok, result.describe()
    assert f"fsdp2.py, TODO 1 of {len(todos)}" in result.output, result.output
    assert todos[0]["hints"][1] in result.output
    assert "zero.py 3 left" in result.output and "fsdp.py 4 left" in result.output
    plain = hint_command("10", "--impl", str(impl))
    assert "zero.py, TODO 1 of 3" in plain.output, plain.output
    shutil.copy(REPO_ROOT / "solutions" / folder.name / "fsdp2.py", impl / folder.name)
    done = hint_command("10", "fsdp2.py", "--impl", str(impl))
    assert "every TODO of lesson 10 is done in fsdp2.py" in done.output, done.output
    missing = hint_command("10", "nope")
    assert missing.returncode == 2 and "zero.py, fsdp.py, fsdp2.py" in missing.output


@pytest.mark.parametrize(("args", "says"), [(["99"], "no lesson '99'"), (["01", "0"], "from 1"),
                                            (["10", "fsdp", "x"], "[SCRIPT] [N]")])  # fmt: skip
def test_bad_hint_requests_give_one_line(args, says):
    result = hint_command(*args)
    assert result.returncode == 2 and says in result.output, result.output
    assert result.output.startswith("python -m course hint: error:"), result.output


def test_hint_files_are_json_the_site_can_read():
    for lesson in WITH_TODOS:
        path = lesson.path(REPO_ROOT / "lessons").parent / release.HINTS_FILE
        assert json.loads(path.read_text())["todos"]


# "Plumbing lives once in course/, and hints never ask students to type it": a course helper
# a TODO needs is named once outside it (an import or a constant, with a comment saying what
# it hides), and the hints name that and PyTorch's API. Each entry: (file, helper) -> reason.
HELPER_ALLOWED: dict[tuple[str, str], str] = {}
_COURSE_MODULES = sorted(path.stem for path in (REPO_ROOT / "course").glob("*.py")
                         if not path.stem.startswith("_"))  # fmt: skip
_HELPER = rf"(?<![\w.])(?:course\.)?(?:{'|'.join(_COURSE_MODULES)})\.[A-Za-z_]\w*"
# A hint may not even name one (`checkpoint.set_rng_state`); code may not call one.
HELPERS = {"hint": re.compile(rf"{_HELPER}|\bcourse\.[\w.]*\w"),
           "answer": re.compile(rf"{_HELPER}(?=\s*\()")}  # fmt: skip


def _hints_and_answers(source: str):
    """(line number, text, kind) of each hint line (its continuation lines included) and of
    each line a student writes: inside a solution block, or a planted bug's fix."""
    hint = answer = False
    for number, line in enumerate(source.splitlines(), 1):
        marker = line.strip()
        if marker in (release.BEGIN, release.FIX) or marker in (release.END, release.END_BUG):
            answer, hint = marker in (release.BEGIN, release.FIX), False
            continue
        hint = bool(release.HINT.match(line) or (hint and release.HINT_MORE.match(line)))
        if hint:
            yield number, line, "hint"
        elif answer and not marker.startswith("#"):
            yield number, line.split("  # ")[0], "answer"  # its trailing comment left out


def test_no_hint_or_answer_types_a_course_helper():
    """No HINT line (with its continuation lines) and no line of a solution block names a
    helper of course/ (`ranks.free_port()`, `checkpoint.save(...)`, `course.x`): a student
    types PyTorch, and the prepared names the script sets once outside the TODO."""
    found = []
    for path in sorted((REPO_ROOT / "solutions").rglob("*.py")):
        name = path.relative_to(REPO_ROOT / "solutions").as_posix()
        for number, line, kind in _hints_and_answers(path.read_text()):
            for helper in HELPERS[kind].findall(line):
                if (name, helper) not in HELPER_ALLOWED:
                    found.append(f"{name}:{number}: {kind} names {helper}: {line.strip()}")
    assert not found, (
        "course helpers a student would type (name them once outside the TODO, with a "
        "comment, or add them to HELPER_ALLOWED with a reason):\n" + "\n".join(found)
    )


def test_the_helper_check_sees_hints_continuations_and_answers():
    source = (
        "    # TODO: join.\n"
        "    # HINT 1: dist.init_process_group(backend,\n"
        "    #   timeout=ranks.process_group_timeout()).\n"
        "    # HINT 2: and course.checkpoint.save, or checkpoint.load.\n"
        "    ### BEGIN SOLUTION\n"
        "    port = ranks.free_port() + ranks.attribute  # ranks.in_a_comment() is no call\n"
        "    ### END SOLUTION\n"
        "    other = ranks.free_port()\n"
    )
    lines = list(_hints_and_answers(source))
    assert [(n, kind) for n, _, kind in lines] == [(2, "hint"), (3, "hint"), (4, "hint"),
                                                   (6, "answer")]  # fmt: skip
    helpers = [HELPERS[kind].findall(text) for _, text, kind in lines]
    hint_2 = ["course.checkpoint.save", "checkpoint.load"]
    assert helpers == [[], ["ranks.process_group_timeout"], hint_2, ["ranks.free_port"]]
