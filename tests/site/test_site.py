"""The course site builds strictly and shows every lesson's code, diagrams and grading."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

import pytest

from course import registry
from course.grader import rules

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


pytest.importorskip("mkdocs", reason="the site needs mkdocs (the dev extra installs it)")

# tests/ is on sys.path (pytest's default "prepend" import mode), so the shared
# builder imports by name; both modules then reuse one build per process.
import _sitebuild as sitebuild  # noqa: E402

hook = sitebuild.load_hook()  # puts docs/hooks on sys.path: its directives import
from directives import common, grading, lesson_figures, records, snippets, tolerances  # noqa: E402

pytestmark = pytest.mark.timeout(sitebuild.TEST_TIMEOUT_S)  # a test's fixture may build the site

# A snippet line: optional indent, `--8<--`, a quoted path with an optional `:section`
# or line range. A leading `;` escapes it, so such lines are documentation, not includes.
SNIPPET = re.compile(r'^[ \t]*(?P<escape>;*)-{1,}8<-{1,}[ \t]+"(?P<target>[^"]+)"', re.M)
SECTION = re.compile(r"--8<--\s*\[\s*(?P<kind>start|end)\s*:\s*(?P<name>[a-z][-_0-9a-z]*)\s*\]")


@pytest.fixture(scope="session")
def site(request, tmp_path_factory):
    built = sitebuild.build_site(shared=sitebuild.shared_folder(tmp_path_factory))
    sitebuild.report(request.config, f"site: mkdocs build --strict took {built.seconds:.1f} s")
    return built


def snippet_refs() -> list[tuple[Path, str, str | None]]:
    """(page, path, section) for every snippet include in the docs."""
    refs = []
    for page in sorted(DOCS.rglob("*.md")):
        for m in SNIPPET.finditer(page.read_text(encoding="utf-8")):
            if m.group("escape"):
                continue
            target = m.group("target")
            path, _, rest = target.partition(":")
            section = rest if rest and not rest[0].isdigit() else None
            refs.append((page, path, section))
    return refs


def sections_of(path: Path) -> list[tuple[str, str]]:
    return [
        (m.group("kind"), m.group("name"))
        for m in SECTION.finditer(path.read_text(encoding="utf-8"))
    ]


def lesson_scripts() -> list[tuple[Path, Path]]:
    """(solution, starter) pairs of every script under solutions/."""
    pairs = []
    for solution in sorted((ROOT / "solutions").rglob("*.py")):
        rel = solution.relative_to(ROOT / "solutions")
        pairs.append((solution, ROOT / "lessons" / rel))
    return pairs


def test_strict_build_succeeds(site):
    assert (site.path / "index.html").is_file()
    assert (site.path / "lessons" / "00_environment" / "index.html").is_file()
    assert (site.path / "architecture" / "index.html").is_file()
    mermaid = site.path / "assets" / "vendor" / "mermaid.min.js"
    assert mermaid.is_file() and mermaid.stat().st_size > 500_000, "mermaid was not vendored"
    # Material uses window.mermaid when it is defined, and only then skips its CDN.
    assert 'globalThis["mermaid"]' in mermaid.read_text(encoding="utf-8")[-2000:]
    assert "WARNING" not in site.log, site.log


def test_missing_mermaid_package_fails_the_build_clearly(monkeypatch):
    monkeypatch.setattr(snippets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(hook.PluginError, match=r"mermaid JS not found: install the dev extra"):
        snippets.find_mermaid_js()


def test_snippet_references_resolve():
    refs = snippet_refs()
    assert refs, "no page includes code with --8<--"
    problems = []
    for page, path, section in refs:
        where = page.relative_to(ROOT)
        target = ROOT / path
        if not target.is_file():
            problems.append(f"{where}: {path} does not exist")
            continue
        if section is not None:
            found = sections_of(target)
            if ("start", section) not in found or ("end", section) not in found:
                problems.append(f"{where}: {path} has no section [start:{section}]…[end:{section}]")
    assert not problems, "\n".join(problems)


def test_starter_and_solution_declare_the_same_sections():
    pairs = lesson_scripts()
    assert pairs, "no lesson scripts under solutions/"
    problems = []
    for solution, starter in pairs:
        if not starter.is_file():
            problems.append(f"{solution.relative_to(ROOT)} has no starter at {starter}")
            continue
        sol, sta = sections_of(solution), sections_of(starter)
        for kind, name in sol:
            other = "end" if kind == "start" else "start"
            if (other, name) not in sol:
                problems.append(f"{solution.relative_to(ROOT)}: [{kind}:{name}] is unmatched")
        if sorted(set(sol)) != sorted(set(sta)):
            problems.append(
                f"{solution.relative_to(ROOT)} sections {sorted({n for _, n in sol})} != "
                f"starter's {sorted({n for _, n in sta})}"
            )
    assert not problems, "\n".join(problems)


def test_every_solution_file_is_shown_on_a_page():
    shown = {path for _, path, _ in snippet_refs()}
    files = sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "solutions").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert files, "solutions/ is empty"
    missing = [f for f in files if f not in shown]
    assert not missing, f"solution files not included on any page: {missing}"


def test_every_lesson_with_code_has_a_page_in_the_nav():
    lessons = common.load_lessons()
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    with_code = [lesson for lesson in lessons if (ROOT / "solutions" / lesson.slug).is_dir()]
    assert with_code, "no lesson in course.registry has a solutions/ folder"
    for lesson in with_code:
        assert common.lesson_page(lesson).is_file(), f"lesson {lesson.number}: no page"
        assert f"lessons/{lesson.slug}.md" in nav, f"lesson {lesson.number}: page not in nav"


# The English lesson pages (their Chinese twins, NN_*.zh.md, are held to the same structure
# by tests/site/test_translation.py).
ENGLISH_LESSON_PAGES = sorted(
    p for p in DOCS.glob("lessons/[0-9][0-9]_*.md") if not p.name.endswith(".zh.md")
)

REQUIRED_HEADINGS = (
    "## Goal",
    "## Run it",
    "## The code",
    "## What changed since the previous lesson",
    "## Exercises",
    "## How it is graded",
    "## Common errors",
)


def test_every_graded_test_says_what_it_checks():
    """The grading tables show each test's docstring; a test without one would show only
    its name turned into a sentence."""
    bare = [
        f"{path.name}::{t.name}"
        for path in registry.tests(None, ROOT)
        for t in rules.collect_graded_tests(path)
        if not t.doc
    ]
    assert not bare, f"graded tests without a docstring: {bare}"


@pytest.mark.parametrize("page", ENGLISH_LESSON_PAGES, ids=lambda p: p.stem)
def test_lesson_page_has_every_part(page):
    text = page.read_text(encoding="utf-8")
    missing = [h for h in REQUIRED_HEADINGS if h not in text]
    assert not missing, f"{page.name} lacks {missing}"
    assert '=== "Starter"' in text and '=== "Solution"' in text, "no Starter/Solution tabs"
    grading = f"<!-- grading: {page.stem[:2]} -->"
    assert grading in text, "grading table is not generated from the lesson's tests"
    assert f"<!-- lesson-card: {page.stem[:2]} -->" in text
    if not page.stem.startswith("00"):
        assert "<!-- diff: " in text, "no diff against the previous lesson"


@pytest.mark.parametrize("page", ENGLISH_LESSON_PAGES, ids=lambda p: p.stem)
def test_run_it_commands_run_the_students_own_file(page):
    """A student who copies a command from a page runs their own file: a command line of a
    bash block that names solutions/ says it runs the reference ("# the reference")."""
    lines, inside, wrong = page.read_text(encoding="utf-8").splitlines(), False, []
    for number, line in enumerate(lines, 1):
        if line.strip().startswith("```"):  # a block's own file (title=...) is shown, not run
            inside = line.strip() == "```bash"
            continue
        if line.strip().startswith("--8<--"):
            continue
        if inside and ("solutions/" in line or "--impl solutions" in line):
            if "the reference" not in line:
                wrong.append(f"line {number}: {line.strip()}")
    assert not wrong, (
        f"{page.name}: commands that run the reference, not the student's file (lessons/ or "
        "`python -m course run NN`), without saying so: " + "; ".join(wrong)
    )


def test_grading_tables_match_the_tests(site):
    """Each lesson page's table lists every test with the cases pytest really collects."""
    test_files = registry.tests(None, ROOT)
    assert test_files, "no lesson tests in tests/"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *map(str, test_files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = Counter(
        line.split("::", 1)[1].split("[", 1)[0]
        for line in proc.stdout.splitlines()
        if line.startswith("tests/lessons/test_") and "::" in line
    )
    for test_file in test_files:
        pages = [p for p in ENGLISH_LESSON_PAGES if p.name.startswith(test_file.name[5:7])]
        if not pages:
            continue
        html = (site.path / "lessons" / pages[0].stem / "index.html").read_text(encoding="utf-8")
        for t in rules.collect_graded_tests(test_file):
            assert t.total_cases == collected[t.name], (
                f"{t.name}: the table says {t.total_cases} cases, pytest collects "
                f"{collected[t.name]}"
            )
            cell = re.escape(t.name.replace("_", "_<wbr>"))
            row = re.search(
                rf"<code>{cell}</code></td>\s*<td>.*?</td>\s*<td[^>]*>([\d.]+)</td>"
                rf"\s*<td[^>]*>(\d+)</td>",
                html,
            )
            assert row, f"{t.name} missing from the grading table of {pages[0].name}"
            assert float(row.group(1)) == t.worth and int(row.group(2)) == t.total_cases


def test_grading_parser_reads_points_docstrings_and_cases(tmp_path):
    sample = tmp_path / "tests" / "lessons" / "test_99_sample.py"
    sample.parent.mkdir(parents=True)
    sample.write_text(
        "import pytest\n\n"
        "@pytest.mark.points(3)\n"
        "def test_a():\n"
        '    """Checks A.\n\n    Details that stay out of the table."""\n\n'
        "@pytest.mark.points(1)\n"
        "@pytest.mark.parametrize('n', [1, 2, 4])\n"
        "def test_b(n):\n    pass\n\n"
        "def test_unscored():\n    pass\n\n"
        "class TestGroup:\n"
        "    pytestmark = [pytest.mark.points(2)]\n\n"
        "    @pytest.mark.gpus(2)\n"
        "    def test_c(self):\n        pass\n\n"
        "def test_d(backend):\n    pass\n",
        encoding="utf-8",
    )
    got = {t.name: t for t in rules.collect_graded_tests(sample)}
    assert got["test_a"].points == 3 and got["test_a"].doc == "Checks A."
    assert got["test_b"].cases == 3 and got["test_b"].total_cases == 3
    assert got["test_unscored"].points is None and got["test_unscored"].worth == 1
    assert got["TestGroup::test_c"].points == 2 and got["TestGroup::test_c"].gpus == 2
    assert got["test_d"].backend and got["test_d"].total_cases == 2
    table = grading.render_grading("99", root=tmp_path)
    # 3 + 1*3 + 1 + 2 (GPU only) + 1*2 (gloo and nccl) = 11; without GPUs 3 + 3 + 1 + 1 = 8
    assert "| **Total** | **8** of them on a CPU-only machine | | | **11** | |" in table, table
    assert "| <code>test_<wbr>unscored</code> | Unscored. | 1 | 1 | 1 | CPU |" in table


def test_the_grading_table_gives_named_bounds_as_numbers(tmp_path):
    """A docstring that says "below LEARNED" reads "below 0.5" in the table: each named
    bound of the module (a tolerance's high or low, or a plain number) as its number."""
    sample = tmp_path / "tests" / "lessons" / "test_99_bounds.py"
    sample.parent.mkdir(parents=True)
    sample.write_text(
        "import pytest\n"
        "from course.grader.tolerances import tolerance\n\n"
        "LEARNED = tolerance('99.learned', high=0.5, test='test_a', what='loss')\n"
        "GAIN = tolerance('99.gain', low=0.02, test='test_a', what='gain')\n"
        "RELATIVE = 1e-9\n"
        "Lower = 3\n\n"
        "@pytest.mark.points(1)\n"
        "def test_a():\n"
        '    """A loss below LEARNED, a gain of at least GAIN, within RELATIVE; LEARNEDS."""\n',
        encoding="utf-8",
    )
    assert grading.bounds(sample) == {"LEARNED": "0.5", "GAIN": "0.02", "RELATIVE": "1e-09"}
    table = grading.render_grading("99", root=tmp_path)
    assert "A loss below 0.5, a gain of at least 0.02, within 1e-09; LEARNEDS." in table


def test_diff_directive_renders_and_fails_clearly(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n# --8<-- [start:s]\ny = 2\n", encoding="utf-8")
    (tmp_path / "b.py").write_text("x = 1\ny = 3\n", encoding="utf-8")
    out = snippets.render_diff("a.py", "b.py", root=tmp_path)
    assert out.startswith("```diff") and "-y = 2\n+y = 3\n" in out
    assert "8<" not in out, "snippet section markers leaked into the diff"
    with pytest.raises(hook.PluginError, match="no such file 'nope.py'"):
        snippets.render_diff("a.py", "nope.py", root=tmp_path)
    with pytest.raises(hook.PluginError, match="malformed directive"):
        hook.expand("<!-- diff: a.py -->\n", "page.md")


def test_bandwidth_directive_with_and_without_a_rated_limit():
    record = "docs/results/05_allreduce/2xh200-nccl.json"
    plain = records.render_bandwidth_table(record)
    assert "busbw (GB/s)" in plain and "GB/s |" not in plain.splitlines()[0].split("busbw")[-1]
    rated = records.render_bandwidth_table(record, "450")
    assert "busbw / 450 GB/s" in rated.splitlines()[0] and "%" in rated.splitlines()[2]
    with pytest.raises(hook.PluginError, match="limit 'fast' is not a number"):
        records.render_bandwidth_table(record, "fast")


def test_results_table_from_json_records(tmp_path):
    """One row per record of a folder, its kind and provenance left to the figures table;
    a record that `course figures` cannot make again is refused."""
    folder = tmp_path / "docs" / "results" / "runs"
    folder.mkdir(parents=True)
    made = {"kind": "course-bench", "provenance": {"command": "python -m course bench"}}
    for n, rate in ((2, 1800.0), (1, 1000.0), (4, 3000.0)):
        record = {"world_size": n, "samples_per_s": rate, "step_ms": {"median": 10.0 * n}}
        (folder / f"ws{n}.json").write_text(json.dumps({**made, **record}), encoding="utf-8")
    table = records.render_results("docs/results/runs", root=tmp_path)
    lines = table.splitlines()
    assert lines[0] == "| world_size | samples_per_s | step_ms.median | speed-up | efficiency |"
    assert lines[2] == "| 1 | 1,000 | 10 | 1.00× | 100% |"
    assert lines[4] == "| 4 | 3,000 | 40 | 3.00× | 75% |"
    (folder / "typed.json").write_text('{"world_size": 8}', encoding="utf-8")
    with pytest.raises(hook.PluginError, match="typed.json.*cannot make it again"):
        records.render_results("docs/results/runs", root=tmp_path)
    (folder / "typed.json").write_text("[1, 2", encoding="utf-8")
    with pytest.raises(hook.PluginError, match="typed.json: not JSON"):
        records.render_results("docs/results/runs", root=tmp_path)
    with pytest.raises(hook.PluginError, match="no \\*.json records"):
        records.render_results("nothing-here", root=tmp_path)


MERMAID_INCLUDE = re.compile(r"```mermaid\s*\n\s*--8<-- \"[^\"]+\.mmd\"")


def test_every_diagram_source_is_on_a_page_and_built(site):
    sources = sorted(p.relative_to(ROOT).as_posix() for p in (DOCS / "diagrams").glob("*.mmd"))
    assert len(sources) >= 6
    refs = [(page, path) for page, path, _ in snippet_refs() if path.endswith(".mmd")]
    assert not [s for s in sources if s not in {path for _, path in refs}], (
        "a diagram is not included on any page"
    )
    for page in {page for page, _ in refs}:
        rel = page.relative_to(DOCS).with_suffix("")
        if rel.suffix == ".zh":  # a Chinese page: zh/PAGE/index.html
            rel = Path("zh") / rel.with_suffix("")
        # mkdocs writes page.md to page/index.html, and index.md to index.html.
        built = site.path / (rel.parent if rel.name == "index" else rel) / "index.html"
        html = built.read_text(encoding="utf-8")
        # A diagram shown as source (```text, such as the article's broken one) draws nothing.
        text = page.read_text(encoding="utf-8")
        inline = re.findall(r"^```mermaid\n(?!\s*;?--8<--)", text, re.M)  # drawn in the page
        expected = len(MERMAID_INCLUDE.findall(text)) + len(inline)
        assert expected and html.count('class="mermaid"') == expected, f"{built}: diagrams missing"


def test_only_pages_with_a_diagram_load_mermaid(site):
    """mermaid (2.7 MB) is loaded by the pages that draw a diagram, and by no other."""
    with_diagrams, without = [], []
    for page in site.path.rglob("*.html"):
        parser = _Assets()
        html = page.read_text(encoding="utf-8")
        parser.feed(html)
        loads = [url for url in parser.urls if "mermaid" in url]
        if 'class="mermaid"' in html:
            with_diagrams.append(page)
            assert len(loads) == 2, f"{page}: draws diagrams but loads {loads or 'no mermaid'}"
        else:
            without.append(page)
            assert not loads, f"{page}: has no diagram but loads {loads}"
    lessons = {p.parent.name for p in with_diagrams if p.parent.parent.name == "lessons"}
    assert "04_torchrun" in lessons and len(without) >= 5, (sorted(lessons), len(without))


class _Assets(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.urls.append(a["src"])
        if tag == "link" and a.get("rel") in {"stylesheet", "preload", "modulepreload"}:
            self.urls.append(a.get("href") or "")
        if tag == "img" and a.get("src"):
            self.urls.append(a["src"])


def test_built_pages_load_nothing_from_the_network(site):
    external = []
    pages = list(site.path.rglob("*.html"))
    assert pages
    for page in pages:
        parser = _Assets()
        parser.feed(page.read_text(encoding="utf-8"))
        for url in parser.urls:
            if urlparse(url).scheme in {"http", "https"} or url.startswith("//"):
                external.append(f"{page.relative_to(site.path)}: {url}")
    assert not external, "pages load assets from the network:\n" + "\n".join(external)


def test_bench_records_become_tables_and_a_plot_at_build_time(site):
    """The scaling results are drawn from `course bench` JSON: every row's figure is on the page."""
    from course.tools.student.bench import render

    records = sorted((DOCS / "results" / "scaling_2xh200").glob("*.json"))
    assert records, "no course bench records in docs/results/scaling_2xh200"
    html = (site.path / "results" / "index.html").read_text(encoding="utf-8")
    plots = (DOCS / "results.md").read_text(encoding="utf-8").count("<!-- bench-plot:")
    assert html.count('class="course-plot"') == plots and "data:image/svg+xml;base64," in html
    for path in records:
        doc = render.load(path)
        assert doc["provenance"]["command"] in html
        for row in doc["rows"]:
            assert f"{row['samples_per_s']:,.0f}" in html, (path.name, row["mode"])
    lesson_02 = (site.path / "lessons" / "02_data_parallel" / "index.html").read_text()
    assert "DataParallel, cuDNN autotuner on" in lesson_02


def test_bench_directives_refuse_what_is_not_a_record(tmp_path):
    folder = tmp_path / "docs" / "results" / "r"
    folder.mkdir(parents=True)
    other = {"kind": "course-bandwidth", "provenance": {"command": "python -m course bandwidth"}}
    (folder / "other.json").write_text(json.dumps(other), encoding="utf-8")
    with pytest.raises(hook.PluginError, match="not a `course bench` record"):
        records.render_bench_table("docs/results/r/other.json", root=tmp_path)
    (tmp_path / "elsewhere.json").write_text(json.dumps(other), encoding="utf-8")
    with pytest.raises(hook.PluginError, match="from docs/results/ only"):
        records.render_bench_table("elsewhere.json", root=tmp_path)
    with pytest.raises(hook.PluginError, match="no such file"):
        records.render_bench_table("docs/results/r/none.json", root=tmp_path)
    with pytest.raises(hook.PluginError, match="no \\*.json records"):
        records.render_bench_plot("empty", root=tmp_path)


def test_recorded_outputs_facts_todos_and_hints_expand_at_build_time():
    """output/hints directives and [[fact]]/[[todo]] references come from the records and
    the starters; in code spans and fenced blocks they are left as written."""
    record = json.loads((hook.ROOT / "docs/results/outputs/01_cpu.json").read_text())
    page = (
        "Reached [[fact:01_cpu:final_accuracy]] at [[todo:01:1]]; syntax: `[[fact:A:B]]`\n"
        '\n=== "CPU"\n\n    <!-- output: 01_cpu -->\n\n<!-- hints: 01 -->\n'
        "```markdown\n<!-- output: 01_cpu -->\n```\n"
    )
    out = hook.expand(page, "lessons/x.md")
    assert f"Reached {record['facts']['final_accuracy']} at TODO at 01_single_device/" in out
    assert "`[[fact:A:B]]`" in out
    assert "    " + record["output"].splitlines()[0] in out  # indented inside the tab
    assert '??? tip "Hint 1"' in out and "python -m course hint 01" in out
    assert out.rstrip().endswith("```markdown\n<!-- output: 01_cpu -->\n```")
    for bad in ("[[fact:01_cpu:nope]]", "[[fact:missing:x]]", "[[todo:01:99]]"):
        with pytest.raises(hook.PluginError):
            hook.expand(bad + "\n", "page.md")


def test_the_planning_rate_quoted_in_prose_comes_from_the_record(tmp_path):
    """[[planning:FILE:flops]]: the float32 GEMM rate a plan --measure record measured; a
    record without it is a build error."""
    folder = tmp_path / "docs" / "results" / "15_planning"
    folder.mkdir(parents=True)
    rows = [{"lesson": "03", "skipped": "needs 2 GPUs"}, {"lesson": "01", "flops": 5.106e13}]
    (folder / "r.json").write_text(json.dumps({"rows": rows}), encoding="utf-8")
    assert lesson_figures.render_planning_figure("r", "flops", root=tmp_path) == "51 TFLOP/s"
    with pytest.raises(hook.PluginError, match="no such figure"):
        lesson_figures.render_planning_figure("r", "ratio", root=tmp_path)
    page = (DOCS / "lessons" / "15_planning.md").read_text(encoding="utf-8")
    assert "[[planning:1xh100:flops]]" in page


def test_bandwidth_figures_quoted_in_prose_come_from_the_records(tmp_path):
    """[[bandwidth:FOLDER/FILE:NAME]]: a figure course.tools.student.bandwidth computes from a
    record; an unknown name or record is a build error, not a blank."""
    folder = tmp_path / "docs" / "results" / "r"
    folder.mkdir(parents=True)
    rows = [{"bytes": 4096, "time_us": 40.2, "busbw_gb_s": 0.1},
            {"bytes": 65536, "time_us": 200.0, "busbw_gb_s": 0.33}]  # fmt: skip
    (folder / "b.json").write_text(json.dumps({"rows": rows}), encoding="utf-8")
    assert records.render_bandwidth_figure("r/b", "smallest_time", root=tmp_path) == "40 us"
    assert records.render_bandwidth_figure("r/b", "latency_bound", root=tmp_path) == "4 KiB"
    assert records.render_bandwidth_figure("r/b", "peak_busbw", root=tmp_path) == "0.33 GB/s"
    with pytest.raises(hook.PluginError, match="no such figure"):
        records.render_bandwidth_figure("r/b", "nothing", root=tmp_path)
    with pytest.raises(hook.PluginError, match="cannot read"):
        records.render_bandwidth_figure("r/missing", "latency_bound", root=tmp_path)
    page = (DOCS / "lessons" / "05_collectives.md").read_text(encoding="utf-8")
    assert "[[bandwidth:05_allreduce/cpu-gloo:latency_bound]]" in page
    page = (DOCS / "lessons" / "14_composing.md").read_text(encoding="utf-8")
    assert "[[bandwidth:05_allreduce/2xh200-nccl:peak_busbw]]" in page


def test_bench_figures_quoted_in_prose_come_from_the_records(tmp_path):
    """[[bench:FOLDER/FILE:KEY.FIELD]] is a figure of one row, KEY.F/KEY.F a ratio of two."""
    from course.tools.student.bench import launch, render

    folder = tmp_path / "docs" / "results" / "r"
    folder.mkdir(parents=True)
    rows = [
        {"key": "01", "lesson": "01", "ok": True, "samples_per_s": 4000.4, "world_size": 1},
        {"key": "08", "lesson": "08", "ok": True, "samples_per_s": 7900.0, "world_size": 2},
    ]
    launch.add_ratios(rows)
    made = {"command": "python -m course bench --lessons 01 08"}
    doc = {"kind": render.KIND, "settings": {}, "provenance": made, "rows": rows}
    (folder / "a.json").write_text(json.dumps(doc), encoding="utf-8")
    assert records.render_bench_figure("r/a", "01.samples_per_s", root=tmp_path) == "4,000"
    assert records.render_bench_figure("r/a", "08.efficiency", root=tmp_path) == "0.987"
    assert records.render_bench_figure("r/a", "08.speedup/01.speedup", root=tmp_path) == "2.0"
    rows[1]["window_samples_per_s"] = [7000.0, 6500.5, 8000.0]
    (folder / "a.json").write_text(json.dumps(doc), encoding="utf-8")
    got = records.render_bench_figure("r/a", "08.window_samples_per_s", root=tmp_path)
    assert got == "6,500 to 8,000"
    for spec in ("09.efficiency", "08.nothing"):
        with pytest.raises(hook.PluginError, match="no row/field"):
            records.render_bench_figure("r/a", spec, root=tmp_path)
    with pytest.raises(hook.PluginError, match="no record"):
        records.render_bench_figure("r/missing", "08.efficiency", root=tmp_path)
    # On the lesson's page every such reference expanded into a number.
    page = (DOCS / "lessons" / "08_performance.md").read_text(encoding="utf-8")
    quoted = re.findall(r"\[\[bench:[^\]]+\]\]", page)
    assert quoted, "lesson 08's page quotes no measured figure"
    out = hook.expand(page, "lessons/08_performance.md")
    assert "[[bench:" not in out


def test_tolerances_on_the_pages_come_from_the_record(tmp_path):
    """<!-- tolerances: NN --> is a lesson's bounds beside what the reference reached, and
    [[tolerance:NN:NAME]] one of them; an accuracy floor shows as a percentage."""
    folder = tmp_path / "docs" / "results" / "tolerances"
    folder.mkdir(parents=True)
    made = {
        "date": "2026-12-04 16:00 UTC",
        "torch": "2.14.1",
        "command": "python -m course tolerances --out docs/results/tolerances/cpu.json",
        "cpus": 2,
        "processor": "X",
    }
    gap = {
        "what": "a gap",
        "high": 1e-3,
        "low": None,
        "min": 3e-8,
        "median": 4e-6,
        "max": 2.5e-4,
        "seen": {str(s): [1e-5] for s in range(12)},
        "mistakes": {
            "far": {"value": 0.5, "why": "the loss summed", "rejected": True},
            "near": {"value": 4e-3, "why": "no set_epoch", "rejected": True},
            "early": {"value": None, "why": "no rank", "rejected": True},
        },
        **made,
    }
    floor = {
        "what": "accuracy",
        "high": None,
        "low": 0.8,
        "min": 0.908,
        "median": 0.95,
        "max": 0.975,
        "seen": {str(s): [0.9] for s in range(6)},
        **made,
    }
    doc = {
        "kind": "course-tolerances",
        "provenance": made,
        "tolerances": {"03.equivalence": gap, "03.learned": floor, "04.x": gap},
    }
    (folder / "cpu.json").write_text(json.dumps(doc), encoding="utf-8")
    table = re.sub(
        r"<span[^>]*>([^<]*)</span>", r"\1", tolerances.render_tolerances("03", root=tmp_path)
    )
    assert "| a gap | at most 1e-3 | 3e-8 to 2.5e-4 (median 4e-6) | 4e-3 | 12 (0–11) |" in table
    assert "| accuracy | at least 80.0 % | 90.8 % to 97.5 % (median 95.0 %) | - | 6 (0–5) |" in (
        table
    )
    assert "    | no set_epoch | a gap | 4e-3 |" in table  # the known mistakes, folded
    assert "    | no rank | a gap | stopped earlier by another check |" in table
    assert "04.x" not in table and "2026-12-04" in table and "PyTorch 2.14.1" in table
    doc["tolerances"]["03.learned"]["busy"] = 2  # a timing, measured on a loaded machine
    (folder / "cpu.json").write_text(json.dumps(doc), encoding="utf-8")
    assert "| 6 runs beside 2 busy loops |" in tolerances.render_tolerances("03", root=tmp_path)
    got = tolerances.render_tolerance_figure("03", "equivalence", root=tmp_path)
    got = re.sub(r"<span[^>]*>([^<]*)</span>", r"\1", got)
    assert got == "1e-3 (the reference solution reached 3e-8 to 2.5e-4 over 12 seeds)"
    got = tolerances.render_tolerance_figure("03", "learned", root=tmp_path)
    assert re.sub(r"<span[^>]*>([^<]*)</span>", r"\1", got).endswith(
        "over 6 runs beside 2 busy loops)"
    ), got
    with pytest.raises(hook.PluginError, match="not in"):
        tolerances.render_tolerance_figure("03", "nothing", root=tmp_path)
    with pytest.raises(hook.PluginError, match="no bound of lesson 05"):
        tolerances.render_tolerances("05", root=tmp_path)
    # Every lesson page that quotes a bound gets it from the real record.
    for page in sorted((DOCS / "lessons").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        if "[[tolerance:" in text or "<!-- tolerances:" in text:
            out = hook.expand(text, f"lessons/{page.name}")
            assert "[[tolerance:" not in out and "<!-- tolerances:" not in out, page.name


def _page_text(path: Path) -> str:
    """A built page's text as a reader sees it: tags dropped, entities decoded."""
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def _solution_only_lines() -> dict[str, list[str]]:
    """Per lesson file, the distinctive lines a student writes: inside ### BEGIN/END
    SOLUTION or a bug's fix, at least 25 characters, and in no starter (a later lesson's
    starter gives an earlier lesson's solution: no secret once the student gets there)."""
    from course.tools.author import release

    # What a student is given: the starters, and the hints (lessons/*/hints.json, whose
    # last hint is nearly the code: `course hint` shows it on request, and so does the page).
    given = [p.read_text(encoding="utf-8") for p in ROOT.glob("lessons/*/*.py")]
    given += [json.dumps(json.loads(p.read_text()), ensure_ascii=False)
              for p in ROOT.glob("lessons/*/hints.json")]  # fmt: skip
    starters = "\n".join(given).replace('\\"', '"')
    found = {}
    for path in sorted(ROOT.glob("solutions/*/*.py")):
        starter = starters
        inside, lines = False, []
        for line in path.read_text(encoding="utf-8").splitlines():
            # a solution block, or the fix of a planted bug (lesson 09: FIX to END BUG)
            if line.strip() in (release.BEGIN, release.END, release.FIX, release.END_BUG):
                inside = line.strip() in (release.BEGIN, release.FIX)
            elif inside and len(line.strip()) >= 25 and line.strip() not in starter:
                lines.append(line.strip())
        found[str(path.relative_to(ROOT))] = lines
    return found


def test_solution_tabs_show_clean_code(site):
    """No authoring marker (### BEGIN/END SOLUTION, # HINT) on a lesson page, and the
    reference's code is there."""
    lines = _solution_only_lines()
    for page in sorted((site.path / "lessons").glob("[0-9][0-9]_*/index.html")):
        text = _page_text(page)
        for marker in ("### BEGIN SOLUTION", "### END SOLUTION", "# HINT 1:", "### FIX"):
            assert marker not in text, f"{page.parent.name}: the page shows {marker!r}"
    shown = " ".join(_page_text(p) for p in (site.path / "lessons").rglob("index.html"))
    assert all(any(line in shown for line in v) for v in lines.values() if v), (
        "a lesson's solution code is missing from the published site"
    )


@pytest.mark.timeout(sitebuild.TEST_TIMEOUT_S)
def test_the_instructor_build_has_no_solution_line(request):
    """COURSE_SITE_SOLUTIONS=0 mkdocs build, from a copy of the repository without
    solutions/ (as a class deploys it): no line a student must write appears on any page,
    no Solution tab or reference note is left empty, the text no longer points to them, and
    code that is no answer (lesson 10's training loop) stays."""
    built = sitebuild.build_site(solutions=False)
    sitebuild.report(request.config, f"site: the instructor build took {built.seconds:.1f} s")
    pages = {p: _page_text(p) for p in built.path.rglob("*.html")}
    leaks = [
        f"{page.relative_to(built.path)}: {line}"
        for page, text in pages.items()
        for lines in _solution_only_lines().values()
        for line in lines
        if line in text
    ]
    assert not leaks, "the instructor build shows solution lines:\n" + "\n".join(leaks[:10])
    # Each lesson page, English (lessons/NN_x) and Chinese (zh/lessons/NN_x).
    lessons = {p.parent.relative_to(built.path).as_posix().removeprefix("lessons/"): t
               for p, t in pages.items() if p.parent.parent.name == "lessons"}  # fmt: skip
    html = {p.parent.relative_to(built.path).as_posix().removeprefix("lessons/"):
            p.read_text(encoding="utf-8") for p in pages
            if p.parent.parent.name == "lessons"}  # fmt: skip
    assert "zh/lessons/10_sharding" in html, sorted(html)
    for name, text in html.items():  # no empty tab or note is left where an answer was
        for tab in (">Solution</label>", ">参考答案</label>"):
            assert tab not in text, f"{name}: a Solution tab in the instructor build"
        for gone in ("The whole reference script", "Reference solution", "Solution* tab",
                     "left out of this build"):  # fmt: skip
            assert gone not in lessons[name], f"{name}: the instructor build says {gone!r}"
    # Context that is no answer stays: lesson 10's training loop (plumbing the starter has).
    loop = "model = DDP(model, device_ids=gpu, **ranks.no_per_step_buffer_sync())"
    assert loop in lessons["10_sharding"], "lesson 10's training loop is gone"
    assert loop in lessons["zh/lessons/10_sharding"], "the Chinese lesson 10's loop is gone"
    home = _page_text(built.path / "index.html")
    assert "python -m course hint NN" in home and "Solution* tab" not in home, (
        "the home page still sends students to a Solution tab"
    )


def test_a_diff_to_a_solution_is_folded_and_left_out_of_the_instructor_build(monkeypatch):
    """A diff that shows a reference solution renders inside a folded block; with
    COURSE_SITE_SOLUTIONS=0 it is not rendered at all. Diffs between starters stay open."""
    old, new = "lessons/01_single_device/train.py", "solutions/01_single_device/train.py"
    folded = snippets.render_diff(old, new)
    assert folded.startswith('??? note "Show the diff') and "```diff" in folded
    starters = snippets.render_diff(old, "lessons/02_data_parallel/train_dp.py")
    assert starters.startswith("```diff")
    monkeypatch.setenv("COURSE_SITE_SOLUTIONS", "0")
    left_out = snippets.render_diff(old, new)
    assert "```diff" not in left_out and "not in this build" in left_out


def test_diagram_sources_stay_out_of_the_search_index(site):
    """Search previews show sentences, never a diagram's mermaid source."""
    index = (site.path / "search" / "search_index.json").read_text(encoding="utf-8")
    for word in ("sequenceDiagram", "flowchart LR", "participant "):
        assert word not in index, f"the search index holds diagram source ({word!r})"


def test_the_lesson_registry_is_imported_again_only_after_an_edit(monkeypatch, tmp_path):
    """The site's hook reloads course.registry for `mkdocs serve`; a reload for nothing made
    new classes under the test session, and `course run 42` then raised a traceback."""
    import course.registry

    before = course.registry.UnknownLesson
    common.load_lessons()
    common.load_lessons()
    assert course.registry.UnknownLesson is before, "load_lessons reloaded an unchanged file"
    snapshot = dict(course.registry.__dict__)
    monkeypatch.setitem(common._loaded_mtime, course.registry.__file__, -1.0)  # as if edited
    try:
        common.load_lessons()
        assert course.registry.UnknownLesson is not before, "an edited registry was not reloaded"
    finally:
        course.registry.__dict__.update(snapshot)
