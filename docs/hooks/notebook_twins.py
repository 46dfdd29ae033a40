"""A notebook's Chinese twin: docs/notebooks/NN_name.zh.py beside NN_name.py (jupytext's
percent format), the very same code cells, its Markdown cells in Chinese, and in its header's
notebook metadata (under `# jupyter:`) `translated_from: HASH`, the hash of the English
notebook's Markdown it translates. The Chinese site shows the twin in the English notebook's
place (course_site.py); tests/site/test_translation.py holds it to the English.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

CELL = re.compile(r"^# %%(?P<kind>.*)$", re.M)
STAMP = re.compile(r"^#\s+translated_from: (?P<hash>[0-9a-f]{12})$", re.M)


def cells(text: str) -> list[tuple[str, str]]:
    """A percent-format notebook's cells after its header: (markdown or code, body)."""
    marks = list(CELL.finditer(text))
    cells = []
    for mark, after in zip(marks, [*marks[1:], None], strict=True):
        body = text[mark.end() : after.start() if after else len(text)].strip("\n")
        cells.append(("markdown" if "[markdown]" in mark["kind"] else "code", body))
    return cells


def prose_hash(text: str) -> str:
    """What a notebook's Chinese twin translates: its Markdown cells, hashed."""
    prose = "\n\n".join(body for kind, body in cells(text) if kind == "markdown")
    return hashlib.sha256(prose.encode()).hexdigest()[:12]


def problems(english: Path) -> list[str]:
    """What keeps english's Chinese twin (if it has one) from being its translation."""
    twin = english.with_suffix(".zh.py")
    if not twin.is_file():
        return []
    en, zh = english.read_text("utf-8"), twin.read_text("utf-8")
    found = []
    code = [(k, b) for k, b in cells(en) if k == "code"]
    if code != [(k, b) for k, b in cells(zh) if k == "code"]:
        found.append(f"{twin.name}: its code cells are not {english.name}'s")
    if [k for k, _ in cells(en)] != [k for k, _ in cells(zh)]:
        found.append(f"{twin.name}: its cells are not in {english.name}'s order")
    stamp = STAMP.search(zh)
    if stamp is None or stamp["hash"] != prose_hash(en):
        found.append(
            f"{twin.name}: {english.name}'s text changed since it was translated "
            f"(review, then stamp `#   translated_from: {prose_hash(en)}` under "
            "`# jupyter:`)"
        )
    return found
