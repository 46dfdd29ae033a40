"""`python -m course grade-class`: a class graded on this machine
(course/tools/instructor/grade_class.py).

Three students, lesson 00, two at a time: one solved, one unsolved (the starter), one
hostile (the starter, plus code at the top of its file that forges a perfect score in
every results file and CSV named on its ancestors' command lines, at once, at exit, and
from a daemon that leaves its process group).
"""

from __future__ import annotations

import csv
import json
import shutil
import sys

from course import REPO_ROOT, launch, registry

LESSON = registry.get("00")
FOLDER = LESSON.path("lessons").parent.name

HOSTILE = """
import atexit as _atexit, json as _json, os as _os, time as _time

def _targets():
    found, pid = [], _os.getppid()
    while pid > 1:
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            break
        for i, arg in enumerate(args):
            if arg.startswith(b"--grade-json="):
                found.append(arg.split(b"=", 1)[1].decode())
            elif arg in (b"--grade-json", b"--out") and i + 1 < len(args):
                found.append(args[i + 1].decode())
        pid = int(stat[stat.rfind(")") + 2 :].split()[1])
    return found

def _forge():
    forged = {"score": 1000, "max_score": 1000, "tests": [
        {"name": "forged", "number": "00", "score": 1000, "max_score": 1000,
         "status": "passed"}]}
    for path in _targets():
        try:
            with open(path, "w") as f:
                if path.endswith(".csv"):
                    f.write("student,00,total,max,status,seconds\\nhostile,1000,1000,25,graded,0\\n")
                else:
                    _json.dump(forged, f)
        except OSError:
            pass

_forge()
open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "cheated"), "w").write(
    "\\n".join(_targets()))  # evidence that the cheat ran, and what it found
_atexit.register(_forge)
if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        for _ in range(600):
            _forge()
            _time.sleep(0.1)
    _os._exit(0)
"""


def make_class(tmp_path):
    submissions = tmp_path / "class"
    for name, source in [("solved", "solutions"), ("unsolved", "lessons"), ("hostile", "lessons")]:
        shutil.copytree(REPO_ROOT / source / FOLDER, submissions / name / FOLDER)
    script = submissions / "hostile" / FOLDER / LESSON.path("lessons").name
    text = script.read_text()
    body = text.index("\nimport ")  # after the docstring: the cheat runs at import
    script.write_text(text[:body] + "\n" + HOSTILE + text[body:])
    return submissions


def test_a_class_of_three_gets_its_own_grades_whatever_one_of_them_does(tmp_path):
    submissions = make_class(tmp_path)
    out = tmp_path / "grades.csv"
    command = [sys.executable, "-m", "course", "grade-class", str(submissions), "--out", str(out)]
    run = launch.run([*command, "--lessons", "00", "--jobs", "2"], timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.describe()
    assert "grading [" in run.output and "3/3" in run.output, f"no progress bar:\n{run.output}"
    print(out.read_text())  # shown by pytest -rP: the CSV an instructor gets
    rows = {row["student"]: row for row in csv.DictReader(out.open())}
    assert sorted(rows) == ["hostile", "solved", "unsolved"], rows
    assert list(rows["solved"]) == ["student", "00", "total", "max", "status", "seconds"]
    solved = float(rows["solved"]["00"])
    assert solved == float(rows["solved"]["max"]) > 0, rows["solved"]
    assert float(rows["unsolved"]["00"]) < solved, rows["unsolved"]
    assert float(rows["hostile"]["00"]) <= float(rows["unsolved"]["00"]), (
        f"the hostile submission scored more than the plain starter: {rows['hostile']}"
    )
    assert all(row["status"] == "graded" for row in rows.values()), rows
    found = (submissions / "hostile" / FOLDER / "cheated").read_text().split()
    assert str(out) in found and any(p.endswith(".json") for p in found), (
        f"the hostile code did not find what it forges (a vacuous test): {found}"
    )
    for name, row in rows.items():  # each student's JSON: valid, and what the CSV says
        results = json.loads((tmp_path / "grades" / f"{name}.json").read_text())
        earned = sum(t["score"] for t in results["tests"] if t["number"] == "00")
        assert earned == float(row["00"]), (name, earned, row)


def test_a_missing_folder_is_one_line(tmp_path):
    run = launch.run(
        [sys.executable, "-m", "course", "grade-class", str(tmp_path / "nope")], timeout=60
    )
    assert run.returncode == 2 and "nope: not a folder" in run.output, run.describe()
    assert "Traceback" not in run.output
