"""course.tools.author.sizes: the lessons stay lean (python -m course sizes).

The table is printed (pytest -s or -rP shows it); the test fails when a
solution passes 150 code lines, or changes more than 80 code lines against
the lesson it builds on.
"""

from __future__ import annotations

import subprocess
import sys

from course import REPO_ROOT
from course.tools.author import sizes

CODE = '''"""A docstring,
over two lines."""

import os  # a comment


def f():
    """Its docstring."""
    # a comment line
    return os.sep
'''


def test_code_lines_leave_out_comments_docstrings_and_blank_lines():
    assert sizes.code(CODE) == ["import os", "def f():", "    return os.sep"]
    assert sizes.code_lines(CODE) == 3


def test_changed_counts_code_lines_added_and_removed():
    new = CODE.replace("return os.sep", "return os.linesep") + "\n\nX = 1  # new\n"
    assert sizes.changed(CODE, new) == 3  # one line replaced (2), one added (1)
    assert sizes.changed(CODE, CODE.replace("# a comment line", "# another")) == 0
    assert sizes.shown_changed(CODE, CODE.replace("# a comment line", "# another")) == 2


def test_page_diff_leaves_out_markers_and_hints():
    text = (
        "# --8<-- [start:x]\nx = 1\n# TODO: the goal\n# HINT 1: first\n#   more\n"
        "### BEGIN SOLUTION\ny = 2\n### END SOLUTION\n# --8<-- [end:x]\n"
    )
    assert sizes.shown(text) == ["x = 1\n", "# TODO: the goal\n", "y = 2\n"]


def test_every_solution_is_lean():
    run = subprocess.run(
        [sys.executable, "-m", "course", "sizes"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    print(run.stdout)
    rows = sizes.measure()
    assert {"01", "02", "03", "04"} <= {r.lesson for r in rows}
    over = [r for r in rows if not r.ok]
    assert run.returncode == (1 if over else 0), run.stdout + run.stderr
    assert not over, f"over the targets:\n{run.stdout}"
