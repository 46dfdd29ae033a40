"""The grading rules, read in one place: what a test is worth, and what its markers mean.

The grader's pytest plugin (course/grader/plugin.py) applies them to the collected
items; the site's grading tables (docs/hooks/course_site.py) and the mutation
tests (tests/mutants/test_mutants.py) read the same rules from the test files' source,
without running pytest (`collect_graded_tests`). The rules:

- a test in tests/lessons/test_NN_*.py grades lesson NN;
- it is worth @pytest.mark.points(n), DEFAULT_POINTS when unmarked, for each case
  pytest generates from it (each parametrisation, and each backend: a test taking
  the `backend` fixture runs on gloo, and on nccl where GPUs are visible);
- a case earns its points only if it passes; a skipped case (an nccl run without
  enough GPUs) counts neither way;
- `core` marks the tests every unsolved starter must fail, `gpus(n)` those that need
  n GPUs, `mutation` the gradings of wrong submissions (the quick loop skips them).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_POINTS = 1.0
LESSON_FILE = re.compile(r"test_(\d\d)_")
REPORTED_MARKERS = ("mutation", "gpus", "core")  # written into the JUnit file, for durations
# user_properties that travel with each report (from xdist workers too)
MARKERS_PROPERTY, LESSON_PROPERTY, POINTS_PROPERTY = (
    "course_markers",
    "course_lesson",
    "course_points",
)


def lesson_of(path: str | Path) -> str | None:
    """The lesson a test file grades ("03" for tests/lessons/test_03_ddp_spawn.py), or None."""
    match = LESSON_FILE.match(Path(path).name)
    return match.group(1) if match else None


def points_of(item) -> float | None:
    """What one collected pytest item is worth; None for a test that grades nothing."""
    marker = item.get_closest_marker("points")
    if lesson_of(item.path) is None and marker is None:
        return None
    return float(marker.args[0]) if marker else DEFAULT_POINTS


def reported_markers(item) -> list[str]:
    return sorted({m.name for m in item.iter_markers()} & set(REPORTED_MARKERS))


# --- the same rules, read from a test file's source -----------------------------------


@dataclass
class GradedTest:
    name: str
    points: int | None
    doc: str
    cases: int = 1
    backend: bool = False
    gpus: int | None = None
    markers: list[str] = field(default_factory=list)

    @property
    def worth(self) -> float:
        return DEFAULT_POINTS if self.points is None else self.points

    @property
    def total_cases(self) -> int:
        return self.cases * (2 if self.backend else 1)


def _marker(node: ast.expr) -> tuple[str, list[ast.expr]] | None:
    """``pytest.mark.NAME(args)`` or ``pytest.mark.NAME`` -> (NAME, args)."""
    call_args: list[ast.expr] = []
    if isinstance(node, ast.Call):
        call_args = list(node.args)
        node = node.func
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
        if node.value.attr == "mark":
            return node.attr, call_args
    return None


def _markers(nodes: list[ast.expr]) -> list[tuple[str, list[ast.expr]]]:
    found = []
    for node in nodes:
        m = _marker(node)
        if m is not None:
            found.append(m)
    return found


def _pytestmark(body: list[ast.stmt]) -> list[ast.expr]:
    for stmt in body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets
        ):
            v = stmt.value
            return list(v.elts) if isinstance(v, ast.List | ast.Tuple) else [v]
    return []


def _apply(test: GradedTest, markers: list[tuple[str, list[ast.expr]]]) -> None:
    for name, args in markers:
        if name == "points" and args and isinstance(args[0], ast.Constant):
            test.points = args[0].value
        elif name == "parametrize" and len(args) >= 2:
            if isinstance(args[1], ast.List | ast.Tuple):
                test.cases *= len(args[1].elts)
        elif name == "gpus" and args and isinstance(args[0], ast.Constant):
            test.gpus = int(args[0].value)
        elif name not in {"points", "parametrize", "gpus", "timeout"}:
            test.markers.append(name)


def describe(name: str) -> str:
    """A readable fallback for a test without a docstring: its name as a sentence."""
    words = name.split("::")[-1].removeprefix("test_").replace("_", " ")
    return words[:1].upper() + words[1:] + "."


def collect_graded_tests(path: Path) -> list[GradedTest]:
    """Test functions of one file with their markers and docstrings, in file order."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module_marks = _markers(_pytestmark(tree.body))
    tests: list[GradedTest] = []

    def add(fn: ast.FunctionDef | ast.AsyncFunctionDef, inherited, prefix: str = "") -> None:
        doc = ast.get_docstring(fn) or ""
        test = GradedTest(name=prefix + fn.name, points=None, doc=doc.strip().split("\n\n")[0])
        _apply(test, inherited + _markers(fn.decorator_list))
        test.backend = any(a.arg == "backend" for a in fn.args.args)
        tests.append(test)

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            add(node, module_marks)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            inherited = (
                module_marks + _markers(node.decorator_list) + _markers(_pytestmark(node.body))
            )
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    item.name.startswith("test")
                ):
                    add(item, inherited, prefix=f"{node.name}::")
    return tests
