"""Code on the pages: the diff between two files (``<!-- diff: OLD NEW -->``), and the
mermaid bundle the site serves offline."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from mkdocs.exceptions import PluginError

from course.tools.author import sizes
from directives.common import ROOT
from directives.solutions import fold_diff, included


def find_mermaid_js() -> Path:
    """The mermaid bundle shipped inside the ``mmdc`` wheel (a dev dependency)."""
    spec = importlib.util.find_spec("mmdc")
    if spec is None or not spec.submodule_search_locations:
        raise PluginError(
            "mermaid JS not found: install the dev extra (pip install -e '.[dev]'), "
            "which brings the 'mmdc' package that ships mermaid.js"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / "mermaid.js"
    if not path.is_file():
        raise PluginError(f"mermaid JS not found at {path}: the 'mmdc' package changed layout")
    return path


def render_diff(old: str, new: str, root: Path = ROOT, lang: str = "en") -> str:
    if not included() and any(rel.startswith("solutions/") for rel in (old, new)):
        return fold_diff(old, new, "", lang)  # the instructor build: said, not shown
    for rel in (old, new):
        if not (root / rel).is_file():
            raise PluginError(f"diff: no such file {rel!r} (paths are relative to the repo root)")
    # The lines `python -m course sizes` counts: no section or solution markers, no
    # hints (the page shows them folded, in their own section).
    a, b = ((root / rel).read_text(encoding="utf-8") for rel in (old, new))
    lines = sizes.diff(a, b, old, new)
    if not lines:
        return (f"`{old}` 与 `{new}` 完全相同。\n" if lang == "zh"
                else f"`{old}` and `{new}` are identical.\n")  # fmt: skip
    body = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return fold_diff(old, new, f'```diff title="{old} → {new}"\n{body}```\n', lang)
