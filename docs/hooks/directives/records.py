"""Measured figures on the pages, each rendered from its JSON record: recorded outputs
(``<!-- output: -->``, ``[[fact:]]``), result tables, ``course bench`` tables and plots,
bandwidth tables, the lessons' sizes, and the inline ``[[todo:]]``, ``[[bench:]]``,
``[[tolerance:]]`` and ``[[planning:]]`` references."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

from course.tools.author import figures, sizes
from course.tools.instructor import grading_cost
from course.tools.student import bandwidth
from course.tools.student.bench import render
from directives.common import ROOT, known_figure, lesson_todos, read_record
from directives.lesson_figures import render_planning_figure
from directives.tolerances import render_tolerance_figure


def _flatten(record: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def render_results(folder: str, root: Path = ROOT) -> str:
    """One table row per JSON record in a folder (its kind and provenance aside: the
    figures table shows them), with speed-up and efficiency when the records carry
    `world_size` and `samples_per_s`."""
    paths = sorted((root / folder).glob("*.json"))
    if not paths:
        raise PluginError(f"results: no *.json records in {folder!r}")
    rows = []
    for path in paths:
        known_figure(path, root)  # a JSON object, made by a course command
        doc = json.loads(path.read_text(encoding="utf-8"))
        rows.append(_flatten({k: v for k, v in doc.items() if k not in ("kind", "provenance")}))
    rows.sort(key=lambda r: (r.get("world_size", 0), str(r.get("backend", ""))))
    columns = list(dict.fromkeys(key for row in rows for key in row))
    base = next((r for r in rows if r.get("world_size") == 1 and "samples_per_s" in r), None)
    if base is not None:
        for row in rows:
            if "samples_per_s" in row and "world_size" in row:
                speedup = row["samples_per_s"] / base["samples_per_s"]
                row["speed-up"] = f"{speedup:.2f}×"
                row["efficiency"] = f"{speedup / row['world_size']:.0%}"
        columns += ["speed-up", "efficiency"]
    head = "| " + " | ".join(columns) + " |\n| " + " | ".join("---" for _ in columns) + " |\n"
    body = "\n".join("| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in rows)
    return f"{head}{body}\n\n*{len(rows)} records from `{folder}`.*\n"


def _bench_docs(paths: list[Path], root: Path) -> list[dict]:
    docs = []
    for path in paths:
        known_figure(path, root)
        try:
            docs.append(render.load(path))
        except (ValueError, OSError) as exc:  # JSONDecodeError is a ValueError
            raise PluginError(f"bench: {path.relative_to(root)}: {exc}") from exc
    return docs


def render_bench_table(path: str, root: Path = ROOT, lang: str = "en") -> str:
    """A `course bench` record as the command printed it: title, table, provenance, commands
    (the words around them in the page's language; the machine's line stays as code)."""
    if not (root / path).is_file():
        raise PluginError(f"bench-table: no such file {path!r}")
    (doc,) = _bench_docs([root / path], root)
    commands = "\n".join(f"    {r['command']}" for r in doc["rows"])
    command, where = doc["provenance"]["command"], render.provenance_line(doc)
    if lang == "zh":
        measured = f"*测量环境：`{where}`，由 `{command}` 测得；记录：`{path}`。*"
        launches = "每一行背后的启动命令"
    else:
        measured = f"*Measured {where} by `{command}`; record: `{path}`.*"
        launches = "The launches behind each row"
    return (
        f"**{render.title(doc)}**\n\n"
        f'<div class="course-bench" markdown>\n\n{render.table(doc, markdown=True)}\n\n</div>\n\n'
        f"{measured}\n\n"
        f'??? note "{launches}"\n\n    ```text\n{commands}\n    ```\n'
    )


def render_bench_plot(folder: str, root: Path = ROOT) -> str:
    """The plot of every record in a folder, or of one record (a .json path)."""
    target = root / folder
    paths = [target] if target.is_file() else sorted(target.glob("*.json"))
    if not paths:
        raise PluginError(f"bench-plot: no *.json records in {folder!r}")
    return f'<div class="course-figure">{render.plot_html(_bench_docs(paths, root))}</div>\n'


# Not inside `code`: a page may show the syntax itself.
KINDS = "fact|todo|bench|tolerance|bandwidth|planning"
INLINE = re.compile(rf"(?<!`)\[\[(?P<kind>{KINDS}):(?P<a>[\w./-]+):(?P<b>[\w./-]+)\]\](?!`)")


def render_bench_figure(record: str, spec: str, root: Path = ROOT, lang: str = "en") -> str:
    """[[bench:FOLDER/FILE:KEY.FIELD]]: one figure of one row of a `course bench` record
    under docs/results (FILE without .json), e.g. [[bench:08_performance/b128:08.efficiency]];
    KEY.FIELD/KEY.FIELD is the ratio of two figures of the same record (one decimal), and a
    list (window_samples_per_s) shows as its range ("6,500 to 8,000"; in Chinese, 至)."""
    path = root / "docs" / "results" / f"{record}.json"
    if not path.is_file():
        raise PluginError(f"[[bench:{record}:{spec}]]: no record docs/results/{record}.json")
    (doc,) = _bench_docs([path], root)

    def figure(part: str) -> float:
        key, _, name = part.rpartition(".")
        row = next((r for r in doc["rows"] if r["key"] == key), None)
        if row is None or name not in row:
            keys = [r["key"] for r in doc["rows"]]
            raise PluginError(f"[[bench:{record}:{spec}]]: no row/field {part} (rows: {keys})")
        return row[name]

    if "/" in spec:
        top, bottom = spec.split("/", 1)
        return f"{figure(top) / figure(bottom):.1f}"
    value = figure(spec)
    if isinstance(value, list):  # a row's timed windows: their range
        return f"{min(value):,.0f} {'至' if lang == 'zh' else 'to'} {max(value):,.0f}"
    return f"{value:,.0f}" if isinstance(value, float) and value >= 100 else str(value)


def render_bandwidth_figure(record: str, name: str, root: Path = ROOT) -> str:
    """[[bandwidth:FOLDER/FILE:NAME]]: a figure of a `course bandwidth` record under
    docs/results (course.tools.student.bandwidth.figures: smallest_time, latency_bound,
    peak_busbw)."""
    path = root / "docs" / "results" / f"{record}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PluginError(f"[[bandwidth:{record}:{name}]]: cannot read {path}: {exc}") from exc
    found = bandwidth.figures(doc)
    if name not in found:
        raise PluginError(f"[[bandwidth:{record}:{name}]]: no such figure ({sorted(found)})")
    return found[name]


def render_inline(m: re.Match, lang: str = "en") -> str:
    """An inline reference, for a page in `lang` (en, or zh: a Chinese page's words)."""
    kind, a, b = m.group("kind"), m.group("a"), m.group("b")
    if kind == "bench":
        return render_bench_figure(a, b, lang=lang)
    if kind == "bandwidth":
        return render_bandwidth_figure(a, b)
    if kind == "tolerance":
        return render_tolerance_figure(a, b, lang=lang)
    if kind == "planning":
        return render_planning_figure(a, b, lang=lang)
    if kind == "fact":
        facts = read_record(a)["facts"]
        if b not in facts:
            raise PluginError(f"record {a!r} has no fact {b!r} (it has {sorted(facts)})")
        return facts[b]
    todos = lesson_todos(f"[[todo:{a}:{b}]]", a)
    if not b.isdigit() or not 1 <= int(b) <= len(todos):
        raise PluginError(f"[[todo:{a}:{b}]]: lesson {a} has {len(todos)} TODOs")
    return todos[int(b) - 1]["id"]


def render_bandwidth_table(path: str, limit: str | None = None, root: Path = ROOT) -> str:
    """A `python -m course bandwidth` record as a table, with its provenance; `limit`:
    the link's rated GB/s per direction, which the page names and sources."""
    known_figure(root / path, root)
    try:
        doc = json.loads((root / path).read_text())
    except (OSError, ValueError) as exc:
        raise PluginError(f"bandwidth-table: cannot read {path!r}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != bandwidth.KIND:
        raise PluginError(f"bandwidth-table: {path!r} is not a `course bandwidth` record")
    try:
        rated = float(limit) if limit else None
    except ValueError:
        raise PluginError(f"bandwidth-table: limit {limit!r} is not a number (GB/s)") from None
    return (
        f"{bandwidth.table(doc, True, rated)}\n\n"
        f"*Measured {bandwidth.provenance_line(doc)} "
        f"by `{doc['provenance']['command']}`; record: `{path}`.*\n"
    )


def render_grading_cost(path: str, root: Path = ROOT) -> str:
    """A `python -m course grading-cost` record: each lesson's grading, timed."""
    known_figure(root / path, root)
    try:
        doc = json.loads((root / path).read_text())
    except (OSError, ValueError) as exc:
        raise PluginError(f"grading-cost-table: cannot read {path!r}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != grading_cost.KIND:
        raise PluginError(f"grading-cost-table: {path!r} is not a `course grading-cost` record")
    return (
        f"{grading_cost.table(doc, markdown=True)}\n\n"
        f"*Measured {grading_cost.provenance_line(doc)}, "
        f"by `{doc['provenance']['command']}`; record: `{path}`.*\n"
    )


def render_figures(root: Path = ROOT) -> str:
    """Every figure under docs/results: its record, the command that makes it again, what
    that needs, and when, where and on which PyTorch it was made."""
    try:
        known = figures.catalog(root)
    except figures.UnknownFigure as exc:
        raise PluginError(f"figures-table: {exc}") from exc
    lines = ["| figure | made again by | needs | made on | machine | torch | course |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for f in known:
        command = " ".join(f.command[3:] if f.command[:3] == ("python", "-m", "course") else
                           f.command)  # fmt: skip
        lines.append(f"| `{f.name}` | `{command}` | {f.needs} | {f.date} | {f.machine} | "
                     f"{f.torch} | {f.course or '-'} |")  # fmt: skip
    return "\n".join(lines) + (
        f"\n\n*{len(known)} figures, listed by `python -m course figures` from "
        "`docs/results/`; course commands are shown without `python -m course`; course: "
        "the version of the course that made it, - for a record made before records "
        "said it.*\n"
    )


def render_sizes(root: Path = ROOT) -> str:
    """`python -m course sizes` as a table: code lines and changes of every solution."""
    if not (root / "solutions").is_dir():  # the instructor build, from a checkout without it
        return "*Measured on `solutions/`, which this build leaves out.*\n"
    rows = sizes.measure(root / "solutions")
    out = [
        "| lesson | file | lines | code lines | builds on | changed code lines | page diff |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        on, changed, page = (r.builds_on, r.changed, r.page_diff) if r.builds_on else "–––"
        cells = [r.lesson, r.path.replace("/", "/&#8203;"), r.lines, r.code, on, changed, page]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    out.append("")
    out.append(
        f"Targets: at most {sizes.MAX_CODE_LINES} code lines a solution, and at most "
        f"{sizes.MAX_CHANGED} code lines added plus removed against the lesson it builds on "
        "(`tests/course/tools/author/test_sizes.py` fails past them)."
    )
    return "\n".join(out) + "\n"


def render_timeline(path: str, root: Path = ROOT) -> str:
    """A `python -m course timeline` record: its figure, the overlap it measured, and where
    it ran; the record itself is a Chrome trace, linked for Perfetto."""
    from course.tools.student import timeline

    known_figure(root / path, root)
    try:
        doc = timeline.load(root / path)
    except (ValueError, OSError) as exc:
        raise PluginError(f"timeline: {path}: {exc}") from exc
    svg = base64.b64encode(timeline.render(doc, fmt="svg")).decode()
    stats, prov = doc["overlap"], doc["provenance"]
    return (
        f'<div class="course-figure"><img class="course-plot" alt="backward and all-reduce '
        f'timeline" src="data:image/svg+xml;base64,{svg}"></div>\n\n'
        f"*{stats['all_reduces']} all-reduces, {stats['all_reduce_ms']} ms in all, "
        f"{stats['during_backward']:.0%} of it during the {stats['backward_ms']} ms of backward. "
        f"Measured on {prov['device']}, torch {prov['torch']}, {prov['date']}, by "
        f"`{prov['command']}`. The record `{path}` is a Chrome trace: open it in "
        "[Perfetto](https://ui.perfetto.dev) to zoom in.*\n"
    )
