"""Build-time helpers for the course site (registered under ``hooks:`` in mkdocs.yml).

Pages stay short and never drift from the code because the hook expands a few
HTML-comment directives from the sources at build time. Each directive must
stand alone on a line; it may be indented (inside a tab or an admonition),
and it is left alone inside a fenced code block:

``<!-- diff: OLD NEW -->``
    A unified diff (a ```diff block) between two files of the repository.
``<!-- grading: tests/test_NN_*.py -->``
    A table of the graded tests in those files: name, points, what it checks.
``<!-- lesson-card: NN -->``
    A table with the lesson's level, script, launcher and run commands, read
    from the lesson registry ``course.lessons``.
``<!-- lessons-table -->``
    The whole course path from the registry, linked to each lesson page.
``<!-- results-table: docs/results/FOLDER -->``
    One row per JSON record of measurements in that folder.
``<!-- bandwidth-table: docs/results/FOLDER/FILE.json [LIMIT] -->``
    A ``python -m course bandwidth`` record; LIMIT (GB/s per direction, a link's
    rated speed that the page sources) adds the bus bandwidth's share of it.
``<!-- bench-table: docs/results/FOLDER/FILE.json -->``
    A ``python -m course bench`` record: its table, provenance and commands.
``<!-- hints: NN -->``
    Lesson NN's TODOs with their progressive hints, folded (the same text that
    ``python -m course hint NN K`` prints, from lessons/<lesson>/hints.json).
``<!-- output: NAME -->``
    A recorded output (``python -m course record``): the command, its exact
    output, and where and when it ran. Inline, ``[[fact:NAME:KEY]]`` quotes
    one figure of a record (final_accuracy, steps, ...), and
    ``[[todo:NN:K]]`` the location of lesson NN's K-th TODO in its starter.
``<!-- bench-plot: docs/results/FOLDER -->``
    The plot of every ``course bench`` record in that folder (or of one record:
    a FILE.json path), drawn at build time. Inline, ``[[bench:FOLDER/FILE:KEY.FIELD]]``
    quotes one figure of one row of a record (``08.efficiency``, say).

The hook also puts a copy of mermaid, taken from an installed Python package,
into the site so that diagrams render with no network.
"""

from __future__ import annotations

import ast
import glob
import importlib
import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

# Where the site loads mermaid from; mkdocs.yml lists it under extra_javascript.
MERMAID_DEST = "assets/vendor/mermaid.min.js"

DIRECTIVE = re.compile(
    r"^(?P<indent>[ \t]*)<!-- (?P<name>[a-z-]+):?(?P<args>[^>]*?)\s*-->[ \t]*$", re.M
)

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- mermaid


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


# --------------------------------------------------------------------------- diff


def render_diff(old: str, new: str, root: Path = ROOT) -> str:
    for rel in (old, new):
        if not (root / rel).is_file():
            raise PluginError(f"diff: no such file {rel!r} (paths are relative to the repo root)")
    # The lines `python -m course sizes` counts: no section or solution markers, no
    # hints (the page shows them folded, in their own section).
    sizes = importlib.import_module("course.sizes")
    a, b = ((root / rel).read_text(encoding="utf-8") for rel in (old, new))
    lines = sizes.diff(a, b, old, new)
    if not lines:
        return f"`{old}` and `{new}` are identical.\n"
    body = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return f'```diff title="{old} → {new}"\n{body}```\n'


# --------------------------------------------------------------------------- grading
# Mirrors course/grading.py: a test in tests/test_NN_*.py is worth
# @pytest.mark.points(n), 1 when unmarked, for each case pytest generates from it;
# a test taking the `backend` fixture runs twice (gloo on CPU, nccl on GPUs), and
# a skipped case (an nccl run without enough GPUs) counts neither way.


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
        return 1 if self.points is None else self.points

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


def _describe(name: str) -> str:
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


def _fmt(x: float) -> str:
    return f"{x:g}"


def _runs_on(t: GradedTest) -> str:
    if t.backend:
        return f"CPU + {t.gpus or 2} GPUs"
    if t.gpus:
        return f"{t.gpus} GPU{'s' if t.gpus > 1 else ''}"
    return "CPU"


def _breakable(name: str) -> str:
    """A test name as code that may wrap after underscores instead of mid-word."""
    return "<code>" + name.replace("_", "_<wbr>") + "</code>"


def render_grading(pattern: str, root: Path = ROOT) -> str:
    paths = sorted(Path(p) for p in glob.glob(str(root / pattern)))
    if not paths:
        raise PluginError(f"grading: no test file matches {pattern!r}")
    rows, cpu_total, total = [], 0.0, 0.0
    for path in paths:
        for t in collect_graded_tests(path):
            what = " ".join(t.doc.split()) or _describe(t.name)
            if "core" in t.markers:
                what += " *(core)*"
            max_points = t.worth * t.total_cases
            total += max_points
            if t.backend:
                cpu_total += t.worth * t.cases
            elif not t.gpus:
                cpu_total += max_points
            rows.append(
                f"| {_breakable(t.name)} | {what} | {_fmt(t.worth)} | {t.total_cases} "
                f"| {_fmt(max_points)} | {_runs_on(t)} |"
            )
    if not rows:
        raise PluginError(f"grading: {pattern!r} has no test functions")
    files = ", ".join(f"`{p.relative_to(root).as_posix()}`" for p in paths)
    return (
        f"Generated from {files} when this page was built.\n\n"
        '<div class="grading" markdown>\n\n'
        "| Test | What it checks | Points each | Cases | Max | Runs on |\n"
        "| --- | --- | ---: | ---: | ---: | --- |\n"
        + "\n".join(rows)
        + f"\n| **Total** | **{_fmt(cpu_total)}** of them on a CPU-only machine | | "
        f"| **{_fmt(total)}** | |\n\n</div>\n\n"
        "Each case of a test (one per parameter, and per backend for distributed tests) earns "
        "its points only if it passes. Cases that need GPUs the machine lacks are skipped and "
        "count neither way, so a laptop grades out of the CPU total. Tests marked *core* are "
        "the ones every unsolved starter must fail.\n"
    )


# --------------------------------------------------------------------------- results


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
    """One table row per JSON record in a folder, with speed-up and efficiency when
    the records carry `world_size` and `samples_per_s`."""
    paths = sorted((root / folder).glob("*.json"))
    if not paths:
        raise PluginError(f"results: no *.json records in {folder!r}")
    rows = []
    for path in paths:
        try:
            rows.append(_flatten(json.loads(path.read_text(encoding="utf-8"))))
        except (json.JSONDecodeError, AttributeError) as exc:
            rel = path.relative_to(root)
            raise PluginError(f"results: {rel} is not a JSON object: {exc}") from exc
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


def _bench():
    """course.bench, whose table and plot the command line prints and the site shows."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from course import bench

    return bench


def _bench_docs(paths: list[Path], root: Path) -> list[dict]:
    bench = _bench()
    docs = []
    for path in paths:
        try:
            docs.append(bench.load(path))
        except (ValueError, OSError) as exc:  # JSONDecodeError is a ValueError
            raise PluginError(f"bench: {path.relative_to(root)}: {exc}") from exc
    return docs


def render_bench_table(path: str, root: Path = ROOT) -> str:
    """A `course bench` record as the command printed it: title, table, provenance, commands."""
    if not (root / path).is_file():
        raise PluginError(f"bench-table: no such file {path!r}")
    bench = _bench()
    (doc,) = _bench_docs([root / path], root)
    commands = "\n".join(f"    {r['command']}" for r in doc["rows"])
    return (
        f"**{bench.title(doc)}**\n\n{bench.table(doc, markdown=True)}\n\n"
        f"*Measured {bench.provenance_line(doc)} by `{doc['provenance']['command']}`; "
        f"record: `{path}`.*\n\n"
        f'??? note "The launches behind each row"\n\n    ```text\n{commands}\n    ```\n'
    )


def render_bench_plot(folder: str, root: Path = ROOT) -> str:
    """The plot of every record in a folder, or of one record (a .json path)."""
    target = root / folder
    paths = [target] if target.is_file() else sorted(target.glob("*.json"))
    if not paths:
        raise PluginError(f"bench-plot: no *.json records in {folder!r}")
    return _bench().plot_html(_bench_docs(paths, root)) + "\n"


# --------------------------------------------------------------------------- registry


def load_lessons():
    """The lesson registry, imported fresh so that `mkdocs serve` sees edits."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        module = importlib.import_module("course.lessons")
    except ImportError as exc:
        raise PluginError(f"lesson registry course.lessons cannot be imported: {exc}") from exc
    return importlib.reload(module).LESSONS


def lesson_page(lesson) -> Path:
    return ROOT / "docs" / "lessons" / f"{lesson.slug}.md"


def run_commands(lesson) -> list[str]:
    script = f"solutions/{lesson.slug}/{lesson.script}"
    direct = {
        "python": f"python {script}",
        "spawn": f"python {script}",
        "torchrun": f"torchrun --standalone --nproc-per-node=2 {script}",
    }.get(lesson.launcher, f"python {script}")
    return [f"python -m course run {lesson.number}", direct]


# Not inside `code`: a page may show the syntax itself.
INLINE = re.compile(r"(?<!`)\[\[(?P<kind>fact|todo|bench):(?P<a>[\w./-]+):(?P<b>[\w./-]+)\]\](?!`)")


def _record(name: str) -> dict:
    """A `python -m course record` record, read by course.record itself."""
    load_lessons()  # puts the repository on sys.path
    try:
        return importlib.import_module("course.record").load(name)
    except FileNotFoundError as exc:
        raise PluginError(str(exc)) from exc


def _todos(where: str, number: str) -> list[dict]:
    """Lesson NN's TODOs and hints, as `python -m course hint` reads them (course.hints)."""
    lessons = {lesson.number: lesson for lesson in load_lessons()}
    if number not in lessons:
        raise PluginError(f"{where}: lesson {number!r} is not in course.lessons.LESSONS")
    todos = importlib.import_module("course.hints").todos(lessons[number])
    if not todos:
        raise PluginError(f"{where}: lesson {number} has no hints.json (run course release)")
    return todos


def render_output(name: str) -> str:
    doc = _record(name)
    prov = doc["provenance"]
    body = "\n".join(["```text", f"$ {doc['shown']}", doc["output"], "```"])
    note = (
        f"*Recorded by `{prov['command']} {name}` on {prov['date']}: PyTorch {prov['torch']}, "
        f"Python {prov['python']}, {prov['machine']}. Timings vary from run to run; the "
        f"other figures are checked against the reference by the test suite.*"
    )
    return f"{body}\n\n{note}"


def render_bench_figure(record: str, spec: str, root: Path = ROOT) -> str:
    """[[bench:FOLDER/FILE:KEY.FIELD]]: one figure of one row of a `course bench` record
    under docs/results (FILE without .json), e.g. [[bench:08_performance/b128:08.efficiency]];
    KEY.FIELD/KEY.FIELD is the ratio of two figures of the same record (one decimal), and a
    list (window_samples_per_s) shows as its range."""
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
        return f"{min(value):,.0f} to {max(value):,.0f}"
    return f"{value:,.0f}" if isinstance(value, float) and value >= 100 else str(value)


def render_inline(m: re.Match) -> str:
    kind, a, b = m.group("kind"), m.group("a"), m.group("b")
    if kind == "bench":
        return render_bench_figure(a, b)
    if kind == "fact":
        facts = _record(a)["facts"]
        if b not in facts:
            raise PluginError(f"record {a!r} has no fact {b!r} (it has {sorted(facts)})")
        return facts[b]
    todos = _todos(f"[[todo:{a}:{b}]]", a)
    if not b.isdigit() or not 1 <= int(b) <= len(todos):
        raise PluginError(f"[[todo:{a}:{b}]]: lesson {a} has {len(todos)} TODOs")
    return todos[int(b) - 1]["id"]


def render_hints(number: str) -> str:
    todos = _todos("hints", number)
    out = [
        f"Stuck? `python -m course hint {number}` prints hint 1 for your first unsolved "
        f"TODO, `python -m course hint {number} 2` the next one. The same hints, folded:",
        "",
    ]
    for index, todo in enumerate(todos, start=1):
        where = todo["id"].removeprefix("TODO at ").split("/", 1)[-1]
        out += [f"**TODO {index}** (`{where}`): {todo['goal']}", ""]
        for k, text in enumerate(todo["hints"], start=1):
            out += [f'??? tip "Hint {k}"', "", f"    {text}", ""]
    return "\n".join(out)


def render_lesson_card(number: str) -> str:
    lessons = {lesson.number: lesson for lesson in load_lessons()}
    if number not in lessons:
        raise PluginError(f"lesson-card: lesson {number!r} is not in course.lessons.LESSONS")
    lesson = lessons[number]
    starter = f"lessons/{lesson.slug}/{lesson.script}"
    solution = f"solutions/{lesson.slug}/{lesson.script}"
    for rel in (starter, solution):
        if not (ROOT / rel).is_file():
            raise PluginError(f"lesson-card {number}: missing {rel}")
    return (
        f"| Lesson {number} | {lesson.title} |\n| --- | --- |\n"
        f"| Level | {lesson.level.capitalize()} |\n"
        f"| Starter (you edit this) | `{starter}` |\n"
        f"| Reference solution | `{solution}` |\n"
        f"| Launcher | `{lesson.launcher}` |\n"
        f"| Run it | `{run_commands(lesson)[0]}` |\n"
        f"| Grade it | `python -m course grade {number}` |\n\n"
        f"{lesson.summary}\n"
    )


def render_bandwidth_table(path: str, limit: str | None = None, root: Path = ROOT) -> str:
    """A `python -m course bandwidth` record as a table, with its provenance; `limit`:
    the link's rated GB/s per direction, which the page names and sources."""
    bandwidth = importlib.import_module("course.bandwidth")
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


def render_sizes(root: Path = ROOT) -> str:
    """`python -m course sizes` as a table: code lines and changes of every solution."""
    sizes = importlib.import_module("course.sizes")
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
        "(`tests/test_course_sizes.py` fails past them)."
    )
    return "\n".join(out) + "\n"


def render_lessons_table(page_dir: str) -> str:
    rows = []
    for lesson in load_lessons():
        title = lesson.title
        if lesson_page(lesson).is_file():
            rel = f"lessons/{lesson.slug}.md"
            if page_dir == "lessons":
                rel = f"{lesson.slug}.md"
            title = f"[{title}]({rel})"
        else:
            title += " *(coming soon)*"
        rows.append(
            f"| {lesson.number} | {title} | {lesson.level.capitalize()} | {lesson.summary} |"
        )
    return "| # | Lesson | Level | What you learn |\n| --- | --- | --- | --- |\n" + "\n".join(rows)


# --------------------------------------------------------------------------- mkdocs events


def expand(markdown: str, src_uri: str) -> str:
    page_dir = src_uri.rsplit("/", 1)[0] if "/" in src_uri else ""

    def replace(m: re.Match) -> str:
        name, args = m.group("name"), m.group("args").split()
        try:
            if name == "diff" and len(args) == 2:
                return render_diff(*args)
            if name == "grading" and len(args) == 1:
                return render_grading(args[0])
            if name == "lesson-card" and len(args) == 1:
                return render_lesson_card(args[0])
            if name == "lessons-table" and not args:
                return render_lessons_table(page_dir)
            if name == "sizes" and not args:
                return render_sizes()
            if name == "bandwidth-table" and len(args) in (1, 2):
                return render_bandwidth_table(*args)
            if name == "results-table" and len(args) == 1:
                return render_results(args[0])
            if name == "bench-table" and len(args) == 1:
                return render_bench_table(args[0])
            if name == "bench-plot" and len(args) == 1:
                return render_bench_plot(args[0])
            if name == "hints" and len(args) == 1:
                return render_hints(args[0])
            if name == "output" and len(args) == 1:
                return render_output(args[0])
        except PluginError as exc:
            raise PluginError(f"{src_uri}: {exc}") from exc
        known = {"diff", "grading", "lesson-card", "lessons-table", "results-table", "sizes"}
        known |= {"bandwidth-table"}
        if name in known | {"bench-table", "bench-plot", "hints", "output"}:
            raise PluginError(f"{src_uri}: malformed directive {m.group(0)!r}")
        return m.group(0)

    def indented(m: re.Match) -> str:
        """A directive inside a tab or an admonition: its expansion keeps the indent."""
        text, indent = replace(m), m.group("indent")
        if text == m.group(0) or not indent:
            return text
        return "\n".join(indent + line if line.strip() else line for line in text.splitlines())

    def outside_code(text: str) -> str:
        """Directives and inline references expand outside fenced code blocks only
        (a page may show them as examples)."""
        out, chunk, fence = [], [], None
        for line in text.splitlines(keepends=True):
            stripped = line.lstrip()
            indent = len(line) - len(stripped)
            if fence is None and stripped.startswith("```"):
                out.append(INLINE.sub(render_inline, DIRECTIVE.sub(indented, "".join(chunk))))
                chunk, fence = [], indent
                out.append(line)
            elif fence is not None:
                out.append(line)
                if stripped.rstrip() == "```" and indent == fence:
                    fence = None
            else:
                chunk.append(line)
        out.append(INLINE.sub(render_inline, DIRECTIVE.sub(indented, "".join(chunk))))
        return "".join(out)

    try:
        return outside_code(markdown)
    except PluginError as exc:
        raise PluginError(f"{src_uri}: {exc}") from exc


def on_files(files, config):
    files.append(File.generated(config, MERMAID_DEST, abs_src_path=str(find_mermaid_js())))
    return files


def on_page_markdown(markdown, page, config, files):
    return expand(markdown, page.file.src_uri)
