"""course.grader.submission: every broken submission becomes one clear line."""

from __future__ import annotations

import pytest

from course.grader.submission import LessonError, check_script, load


def write(tmp_path, text):
    path = tmp_path / "lesson.py"
    path.write_text(text)
    return path


def test_loads_a_good_file_with_its_folder_importable(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 41\n")
    module = load(
        write(tmp_path, "from helper import VALUE\ndef answer():\n    return VALUE + 1\n")
    )
    assert module.answer() == 42


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("def f(:\n", "lesson.py:1: syntax error"),
        ("import not_a_module_anywhere\n", "raised ModuleNotFoundError"),
        ("raise RuntimeError('boom')\n", "raised RuntimeError: boom (lesson.py:1)"),
        ("import sys\nsys.exit(1)\n", "raised SystemExit"),
        ("def other():\n    pass\n", "missing function(s) answer"),
        ("answer = 3\n", "missing function(s) answer"),
    ],
)
def test_broken_files_give_one_line(tmp_path, text, says):
    with pytest.raises(LessonError) as err:
        load(write(tmp_path, text), requires=("answer",))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(LessonError, match="file not found"):
        load(tmp_path / "nope.py")


def test_check_script_catches_syntax_errors_without_running(tmp_path):
    path = write(tmp_path, "raise SystemExit('ran')\nif True\n")
    with pytest.raises(LessonError, match="lesson.py:2: syntax error"):
        check_script(path)
    check_script(write(tmp_path, "raise SystemExit('not run by the check')\n"))


def test_the_graders_own_modules_are_refused_to_a_submission(tmp_path, monkeypatch):
    """Code in the submission's folder cannot import course.grader (its counters) or the
    grader's models in tests/ (its answers), however it finds them; the grader can."""
    import sys

    from course import REPO_ROOT
    from course.grader import submission

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the guard leaves with the test
    cases = REPO_ROOT / "tests" / "lessons" / "cases"
    for body, name in (
        ("from course.measure import scale\n", "course.measure.scale"),
        (f"import sys\nsys.path.insert(0, {str(cases)!r})\nimport lesson_13_models\n",
         "lesson_13_models"),
    ):  # fmt: skip
        folder = tmp_path / name
        folder.mkdir()
        (folder / "lesson.py").write_text(body)
        monkeypatch.delitem(sys.modules, name, raising=False)
        if name == "course.measure.scale":  # as in a case child, where it was never imported
            import course.measure

            monkeypatch.delattr(course.measure, "scale", raising=False)
        with pytest.raises(submission.LessonError) as err:
            submission.load(folder / "lesson.py")
        assert f"{name} is the grader's own code" in str(err.value), err.value
    monkeypatch.delitem(sys.modules, "course.measure.scale", raising=False)
    import course.measure.scale  # noqa: F401 - the grader's own import is not refused
