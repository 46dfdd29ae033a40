"""The fixtures and markers the lesson tests (tests/lessons/) use: part of the grader, so
that what an autograder or a class ships is the course and the rubric, no conftest.

- `impl`: the folder being graded (--impl).
- `backend`: a distributed test that asks for it runs twice, with gloo on CPU and with nccl
  on GPUs; the nccl run is skipped unless the machine has the GPUs that
  @pytest.mark.gpus(n) asks for (2 by default).
- `launcher`: launches bound to the lesson's Cancel (course.launch.Launcher).
- `run_script`: run a lesson script in its own process group with a deadline.

Loaded by the plugin (course/grader/plugin.py, `pytest_plugins`).
"""

from __future__ import annotations

import functools
import sys

import pytest

from course.grader import submission
from course.grader.imports import import_check_for
from course.launch.launcher import Launcher


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
def run_script(tmp_path, launcher):
    """Run `python <script> args...`; fail with each rank's last lines unless asked not to."""

    def run(script, *args, timeout=60, check=True, env=None):
        try:
            submission.check_script(script)  # a missing or unparsable file: one line, no launch
        except submission.LessonError as err:
            pytest.fail(str(err), pytrace=False)
        result = launcher.run(
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


@pytest.fixture(scope="module")
def launcher(request) -> Launcher:
    """Launches for a lesson's tests (course.launch.Launcher): one that names a file of the
    lesson known broken (it hangs or fails at import) is refused at once, so that the
    lesson's tests fail in a second instead of each waiting out its deadline."""
    check = import_check_for(request.node)
    return Launcher(check.cancel if check is not None else None)
