"""Build-time helpers for the course site (registered under ``hooks:`` in mkdocs.yml).

Pages stay short and never drift from the code because the hook expands a few
HTML-comment directives from the sources at build time. Each directive must
stand alone on a line; it may be indented (inside a tab or an admonition),
and it is left alone inside a fenced code block:

``<!-- diff: OLD NEW -->``
    A unified diff (a ```diff block) between two files of the repository.
``<!-- grading: NN -->``
    A table of the graded tests in those files: name, points, what it checks.
``<!-- lesson-card: NN -->``
    A table with the lesson's level, script, launcher and run commands, read
    from the lesson registry ``course.registry``.
``<!-- lessons-table -->``
    The whole course path from the registry, linked to each lesson page.
``<!-- results-table: docs/results/FOLDER -->``
    One row per JSON record of measurements in that folder.
``<!-- bandwidth-table: docs/results/FOLDER/FILE.json [LIMIT] -->``
    A ``python -m course bandwidth`` record; LIMIT (GB/s per direction, a link's
    rated speed that the page sources) adds the bus bandwidth's share of it. Inline,
    ``[[bandwidth:FOLDER/FILE:NAME]]`` quotes smallest_time, latency_bound or peak_busbw
    (``course.tools.student.bandwidth.figures``); ``[[planning:FILE:flops]]`` the float32
    GEMM rate a ``course plan --measure`` record (docs/results/15_planning/) measured.
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
``<!-- grading-cost-table: docs/results/FOLDER/FILE.json -->``
    A ``python -m course grading-cost`` record: each lesson's grading, timed.
``<!-- figures-table -->``
    Every figure the site can render, with what makes it again (``python -m course
    figures``), what that needs, and when and where it was made.
``<!-- timeline: docs/results/FOLDER/FILE.json -->``
    A ``python -m course timeline`` record: backward and all-reduce on one time axis.
``<!-- tolerances: NN -->``
    Every bound lesson NN's tests allow, and what the reference reached over many seeds
    (``python -m course tolerances``). Inline, ``[[tolerance:NN:NAME]]`` quotes one.
``<!-- zero-stages: NAME -->``
    Lesson 10's figure of the ZeRO stages, from the ``course memory`` recording NAME.
``<!-- schedules: docs/results/FOLDER/FILE.json timeline|bubble -->``
    A ``python -m course schedules`` record: lesson 11's measured GPipe and 1F1B, or
    1F1B's bubble against the formula.
``<!-- compositions: docs/results/FOLDER/FILE.json curves|axes -->``
    A ``python -m course compositions`` record: lesson 14's meshes' loss curves against the
    1-D FSDP control, or the collectives of one step by mesh axis.
``<!-- plan: docs/results/FOLDER/FILE.json -->``
    A ``python -m course plan --measure`` record: lesson 15's predicted and measured steps.
``<!-- translation-terms -->``
    The fixed terms of the Chinese pages (docs/hooks/terms.zh.yml), English and Chinese.
``<!-- bench-plot: docs/results/FOLDER -->``
    The plot of every ``course bench`` record in that folder (or of one record:
    a FILE.json path), drawn at build time. Inline, ``[[bench:FOLDER/FILE:KEY.FIELD]]``
    quotes one figure of one row of a record (``08.efficiency``, say).

The hook also puts a copy of mermaid, taken from an installed Python package,
into the site so that diagrams render with no network, and loads it only on the
pages that have a diagram.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from mkdocs import plugins
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
HOOKS = Path(__file__).resolve().parent
for _path in (ROOT, HOOKS):  # the course package (installed or not), and ./directives/
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import translation  # noqa: E402  (docs/hooks/translation.py: the Chinese pages)
from directives import terms  # noqa: E402
from directives.grading import render_grading, render_mutation_scores  # noqa: E402
from directives.hints import render_hints, render_lesson_card, render_lessons_table  # noqa: E402
from directives.lesson_figures import (  # noqa: E402
    render_compositions,
    render_plan,
    render_schedules,
    render_zero_stages,
)
from directives.outputs import render_output  # noqa: E402
from directives.records import (  # noqa: E402
    INLINE,
    render_bandwidth_table,
    render_bench_plot,
    render_bench_table,
    render_figures,
    render_grading_cost,
    render_inline,
    render_results,
    render_sizes,
    render_timeline,
)
from directives.snippets import find_mermaid_js, render_diff  # noqa: E402
from directives.solutions import expand_snippets  # noqa: E402
from directives.terms import render_terms  # noqa: E402
from directives.tolerances import render_tolerances  # noqa: E402

# Where the site loads mermaid from; mkdocs.yml lists it under extra_javascript.
MERMAID_DEST = "assets/vendor/mermaid.min.js"

DIRECTIVE = re.compile(
    r"^(?P<indent>[ \t]*)<!-- (?P<name>[a-z-]+):?(?P<args>[^>]*?)\s*-->[ \t]*$", re.M
)


# Every directive: name -> (how many arguments it takes, what renders it, whether the
# renderer also gets the page's folder). The module docstring says what each shows.
DIRECTIVES = {
    "diff": ((2,), render_diff, False),
    "grading": ((1,), render_grading, False),
    "lesson-card": ((1,), render_lesson_card, False),
    "lessons-table": ((0,), render_lessons_table, True),
    "sizes": ((0,), render_sizes, False),
    "figures-table": ((0,), render_figures, False),
    "grading-cost-table": ((1,), render_grading_cost, False),
    "mutation-scores": ((0,), render_mutation_scores, False),
    "bandwidth-table": ((1, 2), render_bandwidth_table, False),
    "results-table": ((1,), render_results, False),
    "bench-table": ((1,), render_bench_table, False),
    "bench-plot": ((1,), render_bench_plot, False),
    "hints": ((1,), render_hints, False),
    "output": ((1,), render_output, False),
    "zero-stages": ((1,), render_zero_stages, False),
    "schedules": ((2,), render_schedules, False),
    "compositions": ((2,), render_compositions, False),
    "plan": ((1,), render_plan, False),
    "timeline": ((1,), render_timeline, False),
    "tolerances": ((1,), render_tolerances, False),
    "translation-terms": ((0,), render_terms, False),
}


# The directives whose words follow the page's language (the rest show code, records and
# test names, the same on both sides).
IN_THE_PAGES_LANGUAGE = {
    "lesson-card",
    "lessons-table",
    "hints",
    "mutation-scores",
    "grading",
    "tolerances",
    "output",
    "plan",
    "compositions",
    "diff",
    "bench-table",
}


def expand(markdown: str, src_uri: str) -> str:
    page_dir = src_uri.rsplit("/", 1)[0] if "/" in src_uri else ""
    lang = "zh" if src_uri.endswith(translation.SUFFIX) else "en"

    def inline(m: re.Match) -> str:
        return render_inline(m, lang)

    def replace(m: re.Match) -> str:
        name, args = m.group("name"), m.group("args").split()
        if name not in DIRECTIVES:
            return m.group(0)  # an HTML comment that is no directive
        counts, render, wants_page = DIRECTIVES[name]
        if len(args) not in counts:
            raise PluginError(f"{src_uri}: malformed directive {m.group(0)!r}")
        words = {"lang": lang} if name in IN_THE_PAGES_LANGUAGE else {}
        try:
            return render(*args, page_dir, **words) if wants_page else render(*args, **words)
        except PluginError as exc:
            raise PluginError(f"{src_uri}: {exc}") from exc

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
                out.append(INLINE.sub(inline, DIRECTIVE.sub(indented, "".join(chunk))))
                chunk, fence = [], indent
                out.append(line)
            elif fence is not None:
                out.append(line)
                if stripped.rstrip() == "```" and indent == fence:
                    fence = None
            else:
                chunk.append(line)
        out.append(INLINE.sub(inline, DIRECTIVE.sub(indented, "".join(chunk))))
        return "".join(out)

    try:
        return outside_code(expand_snippets(markdown))
    except PluginError as exc:
        raise PluginError(f"{src_uri}: {exc}") from exc


@plugins.event_priority(100)  # before the search plugin's on_config loads jieba's words
def on_config(config):
    """solutions/ is watched where the checkout has it (mkdocs.yml's watch must exist); and
    jieba, which cuts the Chinese pages into words for search, knows the glossary's terms."""
    solutions = ROOT / "solutions"
    if solutions.is_dir() and str(solutions) not in config.watch:
        config.watch.append(str(solutions))
    search = config.plugins.get("material/search")
    if search is not None and not search.config.get("jieba_dict_user"):
        search.config["jieba_dict_user"] = str(terms.jieba_words())
    return config


@plugins.event_priority(-110)  # after mkdocs-static-i18n's on_files (-100): see below
def on_files(files, config):
    _notebooks_again(files, config)
    files.append(File.generated(config, MERMAID_DEST, abs_src_path=str(find_mermaid_js())))
    return files


def _notebooks_again(files, config) -> None:
    """mkdocs-static-i18n makes every file anew, as a plain File, after mkdocs-jupyter made
    the notebooks pages: a notebook would be copied to its page as text. Each is made a
    notebook page again (in the Chinese build, under zh/: notebooks are code, shared)."""
    jupyter = config.plugins.get("mkdocs-jupyter")
    if jupyter is None:
        return
    from mkdocs_jupyter.plugin import NotebookFile

    for file in list(files):
        if isinstance(file, NotebookFile) or not jupyter.should_include(file):
            continue
        page = NotebookFile(file, **config)
        i18n = config.plugins.get("i18n")
        lang = getattr(i18n, "current_language", None)
        if lang and lang != i18n.default_language:  # the Chinese build
            # A notebook's Chinese twin (NN_name.zh.py: the same code, its prose in
            # Chinese) takes the English notebook's place.
            suffix = f".{lang}/"
            page.dest_path = f"{lang}/{page.dest_path.replace(suffix, '/')}"
            page.url = page.url.replace(suffix, "/")
            page.abs_dest_path = os.path.normpath(os.path.join(config.site_dir, page.dest_path))
            page.url = f"{lang}/{page.url}"
        files.remove(file)
        files.append(page)


def on_page_content(html, page, config, files):
    """Diagram sources stay out of the search index (Material's search skips elements
    marked data-search-exclude): a preview would show raw mermaid, not a sentence."""
    return html.replace('<pre class="mermaid">', '<pre class="mermaid" data-search-exclude>')


def on_page_markdown(markdown, page, config, files):
    return translation.for_build(expand(markdown, page.file.src_uri), page.file, page.url)


# mermaid's 2.7 MB take about half a second of a reader's CPU to load; a page that has
# no diagram does not load them (Material fetches mermaid only for a page with diagrams,
# and finds it defined there, so never asks a CDN).
MERMAID_SCRIPTS = re.compile(
    r'<script src="[^"]*(?:assets/vendor/mermaid\.min|assets/javascripts/mermaid-init)\.js">'
    r"</script>\n?"
)


# Material's language switcher fetches `sitemap.xml` relative to each <link rel=alternate>
# in the head, expecting them to be the languages' roots; mkdocs-static-i18n writes them per
# page, so each page asked for PAGE/sitemap.xml and got two 404s. The head's links go: the
# switcher's own links (per page, in the header) still lead to the twin page, and
# assets/javascripts/language-switch.js keeps the reader's section.
ALTERNATE_LINKS = re.compile(r'\s*<link rel="alternate" href="[^"]*" hreflang="[^"]*">')


def on_post_page(output, page, config):
    output = ALTERNATE_LINKS.sub("", output)
    if 'class="mermaid' in output:
        return output
    return MERMAID_SCRIPTS.sub("", output)


def on_post_template(output, template_name, config):
    """The pages drawn from a template alone (404.html): none has a diagram."""
    return on_post_page(output, None, config)
