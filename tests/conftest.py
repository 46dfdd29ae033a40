"""Fixtures shared by the lesson tests.

- `impl`: the folder being graded (--impl).
- `backend`: a distributed test that asks for it runs twice, with gloo on CPU
  and with nccl on GPUs; the nccl run is skipped unless the machine has the
  GPUs that @pytest.mark.gpus(n) asks for (2 by default).
- `run_script`: run a lesson script in its own process group with a deadline.
- `course_without_solutions`: a copy of the course as a class deploys it, with
  no solutions/ folder, to grade from.
"""

from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path

import pytest

from course import REPO_ROOT, launch
from course.grader import submission


@functools.cache
def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("gpus")
        need = marker.args[0] if marker else 2
        metafunc.parametrize(
            "backend",
            [
                pytest.param("gloo", id="gloo"),
                pytest.param("nccl", id="nccl", marks=pytest.mark.gpus(need)),
            ],
        )


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("gpus")
    if marker is None:
        return
    param = getattr(item, "callspec", None)
    if param is not None and param.params.get("backend") == "gloo":
        return  # the CPU variant of a distributed test needs no GPU
    need, have = marker.args[0], visible_gpus()
    if have < need:
        pytest.skip(f"needs {need} CUDA GPU(s), this machine has {have}")


@pytest.fixture(scope="session")
def impl(pytestconfig):
    return pytestconfig.course_impl


@pytest.fixture
def run_script(tmp_path):
    """Run `python <script> args...`; fail with each rank's last lines unless asked not to."""

    def run(script, *args, timeout=60, check=True, env=None):
        try:
            submission.check_script(script)  # a missing or unparsable file: one line, no launch
        except submission.LessonError as err:
            pytest.fail(str(err), pytrace=False)
        result = launch.run(
            [sys.executable, str(script), *map(str, args)],
            timeout=timeout,
            env=env,
            cwd=tmp_path,
            log_dir=tmp_path / "ranks",
        )
        if check and not result.ok:
            pytest.fail(result.describe(), pytrace=False)
        return result

    return run


# What a class deployment ships: the course, its tests and the starters, no solutions/.
DEPLOYED = ("course", "tests", "lessons", "pyproject.toml")


def copy_course(into: Path) -> Path:
    """A copy of the course without solutions/ (the grader must never need it)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in DEPLOYED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=ignore)
        else:
            shutil.copy2(source, into / name)
    assert not (into / "solutions").exists()
    return into


@pytest.fixture(scope="session")
def course_without_solutions(tmp_path_factory) -> Path:
    return copy_course(tmp_path_factory.mktemp("deployed") / "course")
