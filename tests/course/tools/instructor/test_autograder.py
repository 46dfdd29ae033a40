"""`python -m course autograder`: the Gradescope zip (course/tools/instructor/autograder.py).

The zip is unpacked into folders shaped like Gradescope's (autograder/source,
submission, results) and its run_autograder is run, with this machine's Python, on four
submissions of lesson 00: solved, unsolved, solved but for a syntax error, and a hostile
one (the starter plus code that forges a perfect score in every results file named on
its ancestors' command lines, now and from a daemon that leaves its process group).
setup.sh needs the network and root: it is checked for what it installs, not run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

from course import REPO_ROOT, launch, registry

LESSON = registry.get("00")
FOLDER = LESSON.path("lessons").parent.name

FORGE = """
import json as _json, os as _os, time as _time

def _forge():
    pid = _os.getppid()
    while pid > 1:
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return
        for i, arg in enumerate(args[:-1]):
            if arg == b"--grade-json":
                with open(args[i + 1].decode(), "w") as f:
                    _json.dump({"score": 1000, "tests": []}, f)
                open(_os.path.join(_os.path.dirname(__file__), "cheated"), "w").close()
        pid = int(stat[stat.rfind(")") + 2 :].split()[1])

_forge()
if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        for _ in range(300):
            _forge()
            _time.sleep(0.1)
    _os._exit(0)
"""


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    """The zip for lesson 00, and its contents unpacked as Gradescope unpacks them."""
    root = tmp_path_factory.mktemp("gradescope")
    out = root / "autograder.zip"
    run = launch.run(
        [sys.executable, "-m", "course", "autograder", "--lessons", "00", "--out", str(out)],
        timeout=120,
    )
    assert run.returncode == 0, run.describe()
    source = root / "autograder" / "source"
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        zf.extractall(source)
    for name in ("run_autograder", "setup.sh"):
        (source / name).chmod(0o755)
    return root / "autograder", names


def test_the_zip_holds_the_grader_and_no_solution(unpacked):
    _, names = unpacked
    assert "run_autograder" in names and "setup.sh" in names
    assert "tests/lessons/test_00_environment.py" in names and "course/grader/plugin.py" in names
    assert "tests/lessons/test_03_ddp_spawn.py" not in names, "only the lessons asked for"
    leaks = [n for n in names if n.startswith(("solutions/", "tests/mutants/", "lessons/"))]
    assert not leaks, f"the zip holds reference code: {leaks[:5]}"


def test_setup_installs_this_pytorch_for_the_cpu_and_a_user_that_owns_nothing(unpacked):
    autograder, _ = unpacked
    setup = (autograder / "source" / "setup.sh").read_text()
    assert subprocess.run(["bash", "-n", autograder / "source" / "setup.sh"]).returncode == 0
    assert f'"torch=={torch.__version__.split("+")[0]}"' in setup, setup
    assert "download.pytorch.org/whl/cpu" in setup and "pip install -e ." in setup
    assert "useradd" in setup and "runner" in setup


def submission(autograder, kind: str):
    target = autograder / "submission"
    shutil.rmtree(target, ignore_errors=True)
    source = "solutions" if kind in ("solved", "syntax_error") else "lessons"
    shutil.copytree(REPO_ROOT / source / FOLDER, target / "lessons" / FOLDER)
    script = target / "lessons" / FOLDER / LESSON.path("lessons").name
    text = script.read_text()
    if kind == "syntax_error":
        script.write_text(text + "\ndef unfinished(:\n")
    elif kind == "hostile":
        body = text.index("\nimport ")
        script.write_text(text[:body] + "\n" + FORGE + text[body:])


def test_run_autograder_grades_four_submissions_into_valid_results(unpacked):
    autograder, _ = unpacked
    scores = {}
    for kind in ("solved", "unsolved", "syntax_error", "hostile"):
        submission(autograder, kind)
        results = autograder / "results" / "results.json"
        results.unlink(missing_ok=True)
        env = {"AUTOGRADER_ROOT": str(autograder), "COURSE_PYTHON": sys.executable}
        run = launch.run(
            ["bash", str(autograder / "source" / "run_autograder")],
            timeout=240,
            env=env,
            course_root=autograder / "source",  # the zip's course, not this one
        )
        assert run.returncode == 0, f"{kind}: run_autograder must exit 0\n{run.describe()}"
        found = json.loads(results.read_text())  # valid JSON, every time
        assert isinstance(found.get("tests"), list) and found["tests"], (kind, found)
        assert all(t["name"].startswith("tests/lessons/test_00_") for t in found["tests"]), kind
        assert f"grader: {autograder / 'source'}\n" in run.output, f"{kind}: not the zip's grader"
        scores[kind] = (found["score"], found["max_score"])
        if kind == "hostile":  # else the test would pass without a cheat to defeat
            cheated = autograder / "submission" / "lessons" / FOLDER / "cheated"
            assert cheated.exists(), "the hostile code never found the results file"
    print(f"(score, max) by submission: {scores}")  # shown by pytest -rP
    solved, possible = scores["solved"]
    assert solved == possible > 0, scores
    assert scores["unsolved"][0] < solved, scores
    assert scores["syntax_error"][0] == 0, scores
    assert scores["hostile"][0] <= scores["unsolved"][0], f"the hostile one gained: {scores}"
