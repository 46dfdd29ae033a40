"""A Gradescope autograder for the course: one zip, uploaded as the assignment's autograder.

    python -m course autograder --out autograder.zip [--lessons 00 03]

Gradescope unpacks the zip into /autograder/source, runs setup.sh once while it builds
the image, and run_autograder for every submission, with the student's files in
/autograder/submission; it reads /autograder/results/results.json. The zip holds the
grader only: course/, the chosen lessons' tests and case scripts, pyproject.toml and the
README. No solutions/, and no tests/mutants/ (whose honest alternatives are solutions).

setup.sh installs a CPU build of the PyTorch this zip was made with, then the course,
and adds a user `runner` that owns nothing. run_autograder grades the submission (its
lessons/ folder when it has one, else the submission itself) with the course's grader,
each child running as `runner` where the grader runs as root, as Gradescope's does
(COURSE_CHILD_USER, docs/threat-model.md), and always leaves a valid results.json:
a grader that dies before writing one leaves a zero score that says so.
"""

from __future__ import annotations

import argparse
import io
import stat
import zipfile
from pathlib import Path

import torch

from course import REPO_ROOT, registry

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, while it builds the autograder's image.
set -euo pipefail
cd /autograder/source
apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --index-url https://download.pytorch.org/whl/cpu \\
    "torch=={torch}" "torchvision=={torchvision}"
/autograder/venv/bin/pip install -e .
id runner >/dev/null 2>&1 || useradd --no-create-home --shell /usr/sbin/nologin runner
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission. AUTOGRADER_ROOT and COURSE_PYTHON exist
# for the course's own test of this file; Gradescope sets neither.
set -u
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PY="${{COURSE_PYTHON:-/autograder/venv/bin/python}}"
RESULTS="$ROOT/results/results.json"
mkdir -p "$ROOT/results"
IMPL="$ROOT/submission"
[ -d "$IMPL/lessons" ] && IMPL="$IMPL/lessons"
# Children as a user that owns nothing, where this runs as root and that user exists.
if [ "$(id -u)" -eq 0 ] && id runner >/dev/null 2>&1; then
    export COURSE_CHILD_USER=runner
fi
cd "$ROOT/source"
"$PY" -c "import course; print('grader:', course.REPO_ROOT)"
"$PY" -m course grade {lessons} --impl "$IMPL" --grade-json "$RESULTS"
status=$?
# The grader writes a zero score when it starts and the real one last. If it died
# before either, say so in a file Gradescope can read.
if ! "$PY" -c "import json, sys; json.load(open(sys.argv[1]))" "$RESULTS" 2>/dev/null; then
    printf '{{"score": 0, "output": "the grader stopped (exit %s) before writing results"}}\\n' \\
        "$status" > "$RESULTS"
fi
exit 0
"""


def files_for(numbers: list[str]) -> list[Path]:
    """The repository files the autograder needs, relative to the repository."""
    chosen = []
    for path in sorted((REPO_ROOT / "course").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            chosen.append(path)
    chosen += sorted((REPO_ROOT / "tests" / "lessons" / "cases").glob("*.py"))
    for number in numbers:
        chosen += registry.tests(number)
    chosen += [REPO_ROOT / "pyproject.toml", REPO_ROOT / "README.md"]
    return [p.relative_to(REPO_ROOT) for p in chosen]


def build(out: Path, numbers: list[str]) -> list[str]:
    """Write the zip; returns the names it holds."""
    versions = {
        "torch": torch.__version__.split("+")[0],
        "torchvision": _version("torchvision"),
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in [
            ("setup.sh", SETUP.format(**versions)),
            ("run_autograder", RUN.format(lessons=" ".join(numbers))),
        ]:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | 0o755) << 16  # executable once unpacked
            zf.writestr(info, text)
        for rel in files_for(numbers):
            zf.write(REPO_ROOT / rel, rel.as_posix())
        names = zf.namelist()
    out.write_bytes(buffer.getvalue())
    return names


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package).split("+")[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m course autograder", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, default=Path("autograder.zip"), help="the zip to write")
    p.add_argument("--lessons", nargs="*", default=[], help="lesson numbers (default: all)")
    args = p.parse_args(argv)
    try:
        numbers = [registry.get(n).number for n in args.lessons] or [
            lesson.number for lesson in registry.LESSONS
        ]
    except registry.UnknownLesson as err:
        p.error(str(err))
    names = build(args.out, numbers)
    print(f"{args.out}: {len(names)} files, lessons {' '.join(numbers)}")
    print("upload it as the assignment's autograder (Gradescope: Configure Autograder)")
    return 0
