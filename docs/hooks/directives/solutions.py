"""The reference solutions on the pages: clean for a reader, absent from an instructor build.

A snippet line that includes a solution (``--8<-- "solutions/PATH[:SECTION]"``) is
expanded here, before pymdownx.snippets sees the page, into the code alone: no
``### BEGIN/END SOLUTION`` lines, no ``# TODO:`` goal, no hints, no section markers
(course.tools.release.solution_view). The Starter tabs keep their snippets, and
with them the TODOs a student works from.

``COURSE_SITE_SOLUTIONS=0 mkdocs build`` is the instructor build: every solution
snippet and every diff to a solution is left out, with a line saying so, so that
a class site can be deployed from a checkout without solutions/ ever reaching it.
"""

from __future__ import annotations

import os
import re

from mkdocs.exceptions import PluginError

from course.tools.release import ReleaseError, solution_view
from directives.common import ROOT

SOLUTION_SNIPPET = re.compile(
    r'^(?P<indent>[ \t]*)-{1,}8<-{1,}[ \t]+"(?P<path>solutions/[^":]+)(?::(?P<section>[\w-]+))?"'
    r"[ \t]*$",
    re.M,
)
LEFT_OUT = "# The reference solution is left out of this build (COURSE_SITE_SOLUTIONS=0)."


def included() -> bool:
    """False in an instructor build (COURSE_SITE_SOLUTIONS=0)."""
    return os.environ.get("COURSE_SITE_SOLUTIONS", "1").strip() not in ("0", "no", "false")


def expand_snippets(markdown: str) -> str:
    """Every solution snippet line of a page, replaced by its clean code (or by LEFT_OUT)."""

    def replace(m: re.Match) -> str:
        indent, rel, section = m.group("indent"), m.group("path"), m.group("section")
        if not included():
            return indent + LEFT_OUT
        path = ROOT / rel
        if not path.is_file():
            raise PluginError(f"snippet: no such file {rel!r}")
        try:
            code = solution_view(path.read_text(encoding="utf-8"), section)
        except ReleaseError as exc:
            raise PluginError(f"snippet {rel}:{section}: {exc}") from exc
        return "\n".join(indent + line if line.strip() else "" for line in code.splitlines())

    return SOLUTION_SNIPPET.sub(replace, markdown)


def fold_diff(old: str, new: str, body: str) -> str:
    """A diff that shows a solution: folded ("Show the diff ..."), or left out."""
    if not (old.startswith("solutions/") or new.startswith("solutions/")):
        return body
    if not included():
        return f"*The diff `{old}` → `{new}` shows a reference solution: not in this build.*\n"
    indented = "\n".join("    " + line if line.strip() else "" for line in body.splitlines())
    return (
        f'??? note "Show the diff {old} → {new} (it shows the reference solution)"\n\n{indented}\n'
    )
