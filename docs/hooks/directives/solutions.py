"""The reference solutions on the pages: clean for a reader, absent from an instructor build.

A snippet line that includes a solution (``--8<-- "solutions/PATH[:SECTION]"``) is
expanded here, before pymdownx.snippets sees the page, into the code alone: no
``### BEGIN/END SOLUTION`` lines, no ``# TODO:`` goal, no hints, no section markers
(course.tools.author.release.solution_view). The Starter tabs keep their snippets, and
with them the TODOs a student works from.

``COURSE_SITE_SOLUTIONS=0 mkdocs build`` is the instructor build (instructor_view): it
builds from a checkout without solutions/, so that a class site can be deployed without
the answers ever reaching it. A code block that shows an answer is left out, and with it
a Solution tab or a "whole reference script" note left empty; a tab set left with its
Starter tab alone shows the starter plainly. A code block whose part of the starter has
no TODO (lesson 10's training loop, say: plumbing the student is given) is shown from
lessons/. Text between ``<!-- if-solutions -->``, ``<!-- else-solutions -->`` and
``<!-- end-solutions -->`` adapts to the build.
"""

from __future__ import annotations

import os
import re

from mkdocs.exceptions import PluginError

from course.tools.author.release import ReleaseError, solution_view
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


CONDITIONAL = re.compile(
    r"^[ \t]*<!-- if-solutions -->[ \t]*\n(?P<yes>.*?)"
    r"(?:^[ \t]*<!-- else-solutions -->[ \t]*\n(?P<no>.*?))?"
    r"^[ \t]*<!-- end-solutions -->[ \t]*\n",
    re.M | re.S,
)
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<ticks>```+)[^\n]*\n(?P<body>.*?)^(?P=indent)(?P=ticks)[ \t]*\n",
    re.M | re.S,
)


def is_answer(rel: str, section: str | None) -> bool:
    """Whether a solution snippet shows something the student writes: its starter (the
    same path under lessons/) is missing, or its part of the starter holds a TODO."""
    starter = ROOT / "lessons" / rel.removeprefix("solutions/")
    if not starter.is_file():
        return True
    text = starter.read_text(encoding="utf-8")
    if section:
        found = re.search(rf"\[start:{re.escape(section)}\](.*?)\[end:{re.escape(section)}\]",
                          text, re.S)  # fmt: skip
        if found is None:
            return True
        text = found.group(1)
    return "TODO" in text


def _without_answers(markdown: str) -> str:
    """Each fenced block of solution snippets: from lessons/ when none is an answer, else
    gone."""

    def block(m: re.Match) -> str:
        snippets = list(SOLUTION_SNIPPET.finditer(m.group("body")))
        if not snippets or m.group("body").count("\n") != len(snippets):
            return m.group(0)  # not (only) solution snippets: leave it to expand_snippets
        if any(is_answer(s.group("path"), s.group("section")) for s in snippets):
            return ""
        return m.group(0).replace('"solutions/', '"lessons/')

    return FENCE.sub(block, markdown)


def _drop_empty_containers(markdown: str) -> str:
    """A tab (=== "...") or a note (??? / !!!) whose body is empty is removed; a tab set
    left with one tab is unwrapped (its body dedented, its header gone)."""
    lines, out, i = markdown.split("\n"), [], 0
    header = re.compile(r"^(?P<indent>[ \t]*)(?:===|\?\?\?\+?|!!!) ")
    while i < len(lines):
        m = header.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, j = len(m.group("indent")), i + 1
        while j < len(lines) and (
            not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent
        ):
            j += 1
        body = lines[i + 1 : j]
        if any(line.strip() for line in body):
            out += lines[i:j]
        i = j
    return "\n".join(_dedent_lone_tabs(out))


def _alone(lines: list[str], i: int, indent: int) -> bool:
    """Whether the tab header at line i has no sibling tab before or after it (siblings:
    headers at the same indent with only their bodies, blank or deeper lines, between)."""

    def depth(line: str) -> int:
        return len(line) - len(line.lstrip())

    for step in (-1, 1):
        k = i + step
        while 0 <= k < len(lines) and (not lines[k].strip() or depth(lines[k]) > indent):
            k += step
        if (
            0 <= k < len(lines)
            and depth(lines[k]) == indent
            and lines[k].lstrip().startswith("=== ")
        ):
            return False
    return True


def _dedent_lone_tabs(lines: list[str]) -> list[str]:
    out, dedent = [], None  # dedent: the indent of the lone tab being unwrapped
    for i, line in enumerate(lines):
        m = re.match(r"^(?P<indent>[ \t]*)=== ", line)
        if m and _alone(lines, i, len(m.group("indent"))):
            dedent = len(m.group("indent"))
            continue
        if dedent is not None:
            if line.strip() and len(line) - len(line.lstrip()) <= dedent:
                dedent = None
            else:
                out.append(line[:dedent] + line[dedent + 4 :] if line.strip() else line)
                continue
        out.append(line)
    return out


# The Solution tab's label on the English pages and on the Chinese ones (docs/*.zh.md).
SOLUTION_TABS = ('=== "Solution"', '=== "参考答案"')


def _drop_solution_tabs(markdown: str) -> str:
    """Every `=== "Solution"` tab (SOLUTION_TABS), header and body, whatever it shows:
    beside its Starter tab, code that is no answer would only repeat it."""
    lines, out, skip = markdown.split("\n"), [], None
    for line in lines:
        depth = len(line) - len(line.lstrip())
        if skip is not None and (not line.strip() or depth > skip):
            continue
        skip = depth if line.lstrip().startswith(SOLUTION_TABS) else None
        if skip is None:
            out.append(line)
    return "\n".join(out)


def instructor_view(markdown: str) -> str:
    """The page as the instructor build shows it (module docstring)."""
    return _drop_empty_containers(_without_answers(_drop_solution_tabs(markdown)))


def choose_text(markdown: str) -> str:
    """The if-solutions / else-solutions text of this build."""
    return CONDITIONAL.sub(
        lambda m: m.group("yes") if included() else (m.group("no") or ""), markdown
    )


def expand_snippets(markdown: str) -> str:
    """Every solution snippet line of a page, replaced by its clean code (or by LEFT_OUT)."""
    markdown = choose_text(markdown)
    if not included():
        markdown = instructor_view(markdown)

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


def fold_diff(old: str, new: str, body: str, lang: str = "en") -> str:
    """A diff that shows a solution: folded ("Show the diff ..."), or left out."""
    if not (old.startswith("solutions/") or new.startswith("solutions/")):
        return body
    zh = lang == "zh"
    if not included():
        return (f"*差异 `{old}` → `{new}` 会显示参考答案：本构建不包含它。*\n" if zh
                else f"*The diff `{old}` → `{new}` shows a reference solution: not in this "
                "build.*\n")  # fmt: skip
    indented = "\n".join("    " + line if line.strip() else "" for line in body.splitlines())
    title = (
        f"显示差异 {old} → {new}（其中有参考答案）"
        if zh
        else f"Show the diff {old} → {new} (it shows the reference solution)"
    )
    return f'??? note "{title}"\n\n{indented}\n'
