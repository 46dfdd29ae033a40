"""The Chinese site (docs/**/*.zh.md, docs/hooks/translation.py): every page translated,
in parity with its English, current, and written with the glossary's fixed terms."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("mkdocs", reason="the site needs mkdocs (the dev extra installs it)")
pytest.importorskip("mkdocs_static_i18n", reason="the Chinese site needs mkdocs-static-i18n")

import _sitebuild as sitebuild  # noqa: E402

sitebuild.load_hook()  # puts docs/hooks on sys.path
import notebook_twins  # noqa: E402
import translation  # noqa: E402
from directives import terms  # noqa: E402
from mkdocs.exceptions import PluginError  # noqa: E402

from course import registry  # noqa: E402

pytestmark = pytest.mark.timeout(sitebuild.TEST_TIMEOUT_S)  # a test's fixture may build the site

ROOT = sitebuild.ROOT


@pytest.fixture(scope="module")
def site(request, tmp_path_factory):
    built = sitebuild.build_site(shared=sitebuild.shared_folder(tmp_path_factory))
    sitebuild.report(request.config, f"site: mkdocs build --strict took {built.seconds:.1f} s")
    return built


def english_notebooks() -> list[Path]:
    return [p for p in (ROOT / "docs" / "notebooks").glob("[0-9][0-9]_*.py")
            if not p.name.endswith(".zh.py")]  # fmt: skip


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_page_has_a_chinese_page_with_the_same_structure():
    """Each English page has its .zh.md, with the same headings (and ids), snippet
    includes, directives, inline references, admonitions, tabs and code."""
    missing = [_rel(translation.chinese_of(p)) for p in translation.english_pages()]
    missing = [p for p in missing if not (ROOT / p).exists()]
    assert not missing, f"English pages without a Chinese page: {missing}"
    broken = {_rel(p): problems for p, problems in translation.broken().items()}
    assert not broken, "Chinese pages whose structure differs from the English:\n" + "\n".join(
        f"{page}: {'; '.join(problems)}" for page, problems in broken.items()
    )
    assert len(translation.english_pages()) >= 29


def test_no_chinese_page_is_older_than_its_english():
    """Each Chinese page records the hash of the English it was translated from: these
    pages' English changed since, and their translation must be reviewed and stamped."""
    stale = [_rel(p) for p in translation.stale()]
    assert not stale, (
        f"the English of {stale} changed since they were translated: bring each up to date, "
        "then `python docs/hooks/translation.py stamp PAGE.md` (the site shows readers a "
        "notice on a stale page until then)"
    )


ENGLISH = """# A page

<!-- lesson-card: 03 -->

## Run it

Each **rank** joins the process group.

```bash
python lessons/03_ddp_spawn/train.py  # two ranks
```

```mermaid
--8<-- "docs/diagrams/ring_allreduce.mmd"
```

!!! note "Why"
    It all-reduces [[fact:03_train:steps]] times.

=== "Starter"

    ```python
    --8<-- "lessons/03_ddp_spawn/train.py:setup"
    ```

## Run it

Again, shown as source:

````markdown
```mermaid
;--8<-- "docs/diagrams/ring_allreduce.mmd"
```
````
"""

CHINESE = """---
translated_from: {hash}
---

# 一页 {#a-page}

<!-- lesson-card: 03 -->

## 运行 {#run-it}

每个 **rank** 都加入进程组。

```bash
python lessons/03_ddp_spawn/train.py  # two ranks
```

```mermaid
--8<-- "docs/diagrams/ring_allreduce.zh.mmd"
```

!!! note "为什么"
    它做 [[fact:03_train:steps]] 次 all-reduce。

=== "起始代码"

    ```python
    --8<-- "lessons/03_ddp_spawn/train.py:setup"
    ```

## 再运行 {#run-it_1}

再来一次，以源码展示：

````markdown
```mermaid
;--8<-- "docs/diagrams/ring_allreduce.mmd"
```
````
"""

# Each way a translation can break parity, and the word the report names it by.
BREAKS = {
    "headings": ("## 再运行 {#run-it_1}", "### 再运行 {#run-it_1}"),
    "missing id": ("## 运行 {#run-it}", "## 运行"),
    "includes": ("train.py:setup", "train.py:loaders"),
    "directives": ("<!-- lesson-card: 03 -->", "<!-- lesson-card: 04 -->"),
    "inline": ("[[fact:03_train:steps]]", "许多"),
    "admonitions": ('!!! note "为什么"', '!!! tip "为什么"'),
    "tabs": ('=== "起始代码"', "起始代码："),
    "fenced code": ("# two ranks", "# 两个 rank"),
    "code": (';--8<-- "docs/diagrams/ring_allreduce.mmd"\n```\n````', ";图\n```\n````"),
    "translated_from": ("translated_from: {hash}", "translator: someone"),
}


def _pair(tmp_path: Path, chinese: str) -> tuple[Path, Path]:
    english = tmp_path / "page.md"
    english.write_text(ENGLISH, encoding="utf-8")
    zh = tmp_path / "page.zh.md"
    zh.write_text(chinese.replace("{hash}", translation.source_hash(english)), encoding="utf-8")
    return english, zh


def test_parity_sees_each_kind_of_difference(tmp_path):
    """A faithful translation (prose, titles, tab labels and a .zh.mmd diagram changed)
    passes; each single break of the structure is reported by name."""
    english, zh = _pair(tmp_path, CHINESE)
    assert translation.differences(english, zh) == []
    for name, (old, new) in BREAKS.items():
        assert old in CHINESE, name
        english, zh = _pair(tmp_path, CHINESE.replace(old, new, 1))
        problems = translation.differences(english, zh)
        assert problems, f"a change of the {name} passed the parity check"
        assert any(name.split()[-1] in p for p in problems), (name, problems)


def _file(path: Path, building: str, locale: str) -> SimpleNamespace:
    return SimpleNamespace(
        locale_alternate_of=building,
        locale=locale,
        src_uri=path.name,
        abs_src_path=str(path),
    )


def test_the_build_refuses_a_missing_or_broken_page_and_marks_a_stale_one(tmp_path):
    """In the Chinese build, an English page standing in for its translation fails the
    build, so does a translation out of parity; a translation of an older English gets a
    notice under its title, linking the English page; a current one is left alone."""
    english, zh = _pair(tmp_path, CHINESE)
    markdown = "# 一页\n\n正文。\n"
    url = "zh/lessons/page/"
    assert translation.for_build(markdown, _file(zh, "zh", "zh"), url) == markdown
    assert translation.for_build(markdown, _file(english, "en", "en"), "lessons/page/") == markdown
    with pytest.raises(PluginError, match=r"has no Chinese page .*page\.zh\.md"):
        translation.for_build(markdown, _file(english, "zh", "en"), url)
    english.write_text(ENGLISH + "\nA new sentence.\n", encoding="utf-8")
    noticed = translation.for_build(markdown, _file(zh, "zh", "zh"), url)
    assert noticed.startswith("# 一页\n\n!!! warning"), noticed
    assert '<a href="../../../lessons/page/">' in noticed and noticed.endswith("正文。\n")
    zh.write_text(zh.read_text(encoding="utf-8").replace("## 运行 {#run-it}", "## 运行"))
    with pytest.raises(PluginError, match="does not match"):
        translation.for_build(markdown, _file(zh, "zh", "zh"), url)


def test_inline_figures_speak_the_pages_language():
    """A Chinese page's inline references render in Chinese around the same figures."""
    hook = sitebuild.load_hook()
    windows = "[[bench:08_performance/1xh200-b128-files-compile:08.window_samples_per_s]]"
    text = f"[[tolerance:03:equivalence]]; {windows}"
    en, zh = hook.expand(text, "lessons/p.md"), hook.expand(text, "lessons/p.zh.md")
    assert "the reference solution reached" in en and " to " in en
    assert "参考答案在" in zh and " 至 " in zh and "reference" not in zh and " to " not in zh
    figures = re.compile(r"[\d.]+e-\d+|\d[\d,]*")
    assert sorted(figures.findall(en)) == sorted(figures.findall(zh))


def test_every_lesson_has_a_current_chinese_title_and_summary():
    """The lesson cards and the course path of the Chinese pages take each lesson's title
    and summary from docs/hooks/lessons.zh.yml: one for every lesson of the registry,
    translated from its present English (a change to the registry's words is noticed)."""
    from directives import hints

    from course import registry

    entries = hints.chinese_lessons()
    problems = hints.lesson_translation_problems(registry.LESSONS, entries)
    assert not problems, f"docs/hooks/lessons.zh.yml: {problems}"
    changed = [dataclasses.replace(registry.LESSONS[3], summary="Something new.")]
    assert hints.lesson_translation_problems(changed, entries) == [
        "lesson 03's English title or summary changed since"
    ]
    assert hints.lesson_translation_problems(changed, {}) == ["lesson 03 has no entry"]
    card = hints.render_lesson_card("03", lang="zh")
    assert card.startswith("| 第 03 课 | 用 mp.spawn 启动 DDP |") and "| 难度 | 核心 |" in card
    assert entries["03"]["summary"] in card and "Level" not in card
    assert "| Lesson 03 | DDP with mp.spawn |" in hints.render_lesson_card("03")


def test_stamp_records_the_english_hash(tmp_path, monkeypatch):
    english, zh = _pair(tmp_path, CHINESE)
    english.write_text(ENGLISH + "\nMore.\n", encoding="utf-8")
    assert translation.recorded_hash(zh.read_text()) != translation.source_hash(english)
    translation.stamp(english)
    text = zh.read_text(encoding="utf-8")
    assert translation.recorded_hash(text) == translation.source_hash(english)
    assert text.count("translated_from:") == 1 and translation.differences(english, zh) == []


def test_chinese_pages_use_the_fixed_terms():
    """Where an English page uses a glossary term, its Chinese page writes the term's fixed
    form (docs/hooks/terms.zh.yml), and no page writes an avoided one."""
    fixed = terms.load()
    assert len(fixed) >= 30 and {"rank", "micro-batch", "bubble", "expert"} <= {t.en for t in fixed}
    wrong = {}
    for english in translation.english_pages():
        zh = translation.chinese_of(english)
        if zh.exists():
            problems = terms.inconsistencies(
                english.read_text(encoding="utf-8"), zh.read_text(encoding="utf-8"), fixed
            )
            if problems:
                wrong[_rel(zh)] = problems
    assert not wrong, "Chinese pages that break the glossary:\n" + "\n".join(
        f"{page}: {'; '.join(p)}" for page, p in wrong.items()
    )


CJK = "\u4e00-\u9fff\u3000-\u303f\uff00-\uffef\u201c\u201d"


def test_no_chinese_sentence_is_broken_across_lines():
    """A line break between two Chinese characters shows as a stray space in a browser, so
    a Chinese paragraph keeps each sentence on one source line."""
    broken = re.compile(rf"([{CJK}])\n[ \t]*([{CJK}])")
    found = []
    for english in translation.english_pages():
        zh = translation.chinese_of(english)
        if zh.exists():
            found += [f"{_rel(zh)}: {m.group(0)!r}" for m in broken.finditer(
                terms.FENCED.sub("", zh.read_text(encoding="utf-8")))]  # fmt: skip
    assert not found, f"{len(found)} breaks, such as {found[:5]}"


def test_the_terms_check_sees_an_avoided_and_a_missing_term():
    fixed = [terms.Term("micro-batch", "微批次", "", ("微批量",))]
    english = "Each micro-batches' loss is divided by k. `micro_batch` is code."
    assert terms.inconsistencies(english, "每个微批次的损失除以 k。", fixed) == []
    assert terms.inconsistencies("No such word; `micro-batch` is code.", "无。", fixed) == []
    missing = terms.inconsistencies(english, "每个小块的损失除以 k。", fixed)
    assert missing == ["the English says 'micro-batch'; '微批次' is nowhere"]
    avoided = terms.inconsistencies(english, "微批次，即微批量。", fixed)
    assert avoided == ["writes '微批量' for 'micro-batch' (the glossary: '微批次')"]


def test_the_chinese_site_is_built_beside_the_english(site):
    """Every English page has its Chinese page under zh/, in Chinese (lang, the language
    switcher), with the shared code; and the search index holds Chinese cut into words
    (jieba, which keeps the glossary's terms whole), which the search separator splits on."""
    for english in translation.english_pages():
        rel = english.relative_to(ROOT / "docs").with_suffix("")
        folder = rel.parent if rel.name == "index" else rel
        page = site.path / "zh" / folder / "index.html"
        assert page.exists(), f"{page} was not built"
    # The notebooks (code, shared) are notebook pages in both languages, each its own: the
    # i18n plugin once turned them into their source text, then the Chinese build's into
    # the English pages.
    for notebook in sorted(english_notebooks()):
        for lang, folder in (("en", site.path), ("zh", site.path / "zh")):
            page = folder / "notebooks" / notebook.stem / "index.html"
            text = page.read_text("utf-8")
            assert f'<html lang="{lang}"' in text and 'class="jp-Cell' in text, page
    html = (site.path / "zh" / "lessons" / "03_ddp_spawn" / "index.html").read_text("utf-8")
    assert '<html lang="zh"' in html and "简体中文" in html and "English" in html
    assert 'hreflang="en"' in html or 'href="../../../lessons/03_ddp_spawn/"' in html
    assert "dist.init_process_group" in html  # the code is the English page's
    # One index a language (docs/hooks/search_languages.py): the Chinese pages' under /zh/.
    index = json.loads((site.path / "zh" / "search" / "search_index.json").read_text("utf-8"))
    english = json.loads((site.path / "search" / "search_index.json").read_text("utf-8"))
    assert "\\u200b" in index["config"]["separator"]
    zh_docs = index["docs"]
    assert not any(d["location"].startswith("zh/") for d in english["docs"] + zh_docs)
    assert len(english["docs"]) > 100 and len(zh_docs) > 100
    segmented = re.compile("[\u4e00-\u9fff]\u200b[\u4e00-\u9fff]")
    assert any(segmented.search(d["text"]) for d in zh_docs), (
        "Chinese text is not segmented into words (is jieba installed?)"
    )
    # jieba knows the glossary's terms (the hook gives it them): each is one search word.
    text = "".join(d["text"] for d in zh_docs)
    for word in ("微批次", "流水线并行", "梯度累积"):
        assert f"\u200b{word}\u200b" in text, f"search cuts {word} into pieces"


# --- English prose on the Chinese pages ----------------------------------------------------
# A Chinese page keeps commands, code, identifiers and the glossary's English terms; what it
# must not carry is English prose. Its mark is the small words every English sentence needs
# and no term or identifier is: counted on the built page, outside code, outside what is
# marked lang="en" (a TODO's and a hint's text: the starter's own comments, shown as such).
FUNCTION_WORDS = frozenset(
    "the and of to in is on with from by for at its it as that this are be or an each every "
    "after before not which when than then into over only was were has have their there what "
    "how".split()
)  # fmt: skip
# At most this many on a Chinese page: room for the verbatim quotes of English sources a
# page gives (each followed by its Chinese), and no more.
ALLOWANCE = 40
_SKIPPED_TAGS = ("code", "pre", "script", "style", "svg")
# A notebook page's hidden copy of each code cell (for its copy button) and its prompts.
_UNREAD_CLASSES = frozenset({"clipboard-copy-txt", "jp-InputPrompt", "jp-OutputPrompt"})
_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())


def english_prose(html: str) -> list[str]:
    """The function words of a built page's article outside code and lang="en"."""
    from html.parser import HTMLParser

    class Article(HTMLParser):
        def __init__(self):
            super().__init__()
            self.hidden, self.words = [], []

        def handle_starttag(self, tag, attrs):
            if tag not in _VOID:
                attrs = dict(attrs)
                classes = set((attrs.get("class") or "").split())
                self.hidden.append((tag, tag in _SKIPPED_TAGS or attrs.get("lang") == "en"
                                    or bool(classes & _UNREAD_CLASSES)))  # fmt: skip

        def handle_endtag(self, tag):
            # Up to the element it closes: an unclosed <p> or <li> inside closes with it.
            if any(open_tag == tag for open_tag, _ in self.hidden):
                while self.hidden.pop()[0] != tag:
                    pass

        def handle_data(self, data):
            if not any(hidden for _, hidden in self.hidden):
                self.words += [w for w in re.findall(r"[A-Za-z]+", data)
                               if w.lower() in FUNCTION_WORDS]  # fmt: skip

    match = re.search(r"<article.*?</article>", html, re.S)
    parser = Article()
    parser.feed(match.group(0) if match else html)
    return parser.words


def test_the_prose_count_sees_english_and_leaves_code_and_comments():
    html = ('<article><p>每个 rank 的 <code>the x of y</code>：the loss falls on each rank'
            '<br><span lang="en">the starter\'s comment</span>。<ul><li>an item</ul></p>'
            '<div><pre>for x in y</pre></div><p>as it was</p></article>')  # fmt: skip
    assert english_prose(html) == ["the", "on", "each", "an", "as", "it", "was"]


def test_chinese_pages_carry_no_english_prose(site):
    """Each Chinese page has at most ALLOWANCE English function words outside code: its
    tables, figures, provenance lines and notebooks' text are in Chinese (before this test,
    lesson 12's Chinese page alone had 175 "the")."""
    over = []
    for page in sorted((site.path / "zh").rglob("index.html")):
        rel = page.parent.relative_to(site.path / "zh").as_posix()
        if rel.startswith(("search", "assets")):
            continue
        words = english_prose(page.read_text("utf-8"))
        if len(words) > ALLOWANCE:
            over.append(f"zh/{rel}: {len(words)} English function words (at most {ALLOWANCE}): "
                        f"{' '.join(words[:12])} ...")  # fmt: skip
    assert not over, "English prose on Chinese pages:\n" + "\n".join(over)


def test_every_chinese_entry_of_the_generated_texts_is_current():
    """docs/hooks/generated.zh.yml translates texts that exist today, from their English as
    it is today: an entry whose English changed (or whose test, bound or mistake is gone)
    is listed, and the Chinese page shows that text's English until it is translated again."""
    from directives import chinese, grading, tolerances

    current = {}
    for path in registry.tests(None, ROOT):
        current.update(grading.descriptions(path))
    current.update(tolerances.translatable())
    assert not chinese.stale(current)


def test_a_generated_text_shows_its_chinese_only_while_current(tmp_path):
    from directives import chinese

    store = tmp_path / "generated.zh.yml"
    english = "The loss falls below LEARNED."
    store.write_text(f"test 01 x:\n  from: {chinese.english_hash(english)}\n  zh: 损失降到 LEARNED 以下。\n",
                     encoding="utf-8")  # fmt: skip
    assert chinese.words("test 01 x", english, "zh", store) == "损失降到 LEARNED 以下。"
    assert chinese.words("test 01 x", english, "en", store) == english
    assert chinese.words("test 01 x", "The loss falls.", "zh", store) == "The loss falls."
    assert chinese.stale({"test 01 x": "The loss falls."}, store) == [
        "test 01 x: its English changed since it was translated"]
    assert chinese.stale({}, store) == ["test 01 x: no such text today"]


def test_each_notebooks_chinese_twin_runs_its_code_and_translates_its_text():
    """docs/notebooks/NN_name.zh.py, the Chinese notebook page: the English notebook's code
    cells, in its order, and its Markdown translated from the English as it is today."""
    twins = [p for p in english_notebooks() if p.with_suffix(".zh.py").is_file()]
    assert len(twins) == len(english_notebooks()), "a notebook has no Chinese twin"
    problems = [problem for p in twins for problem in notebook_twins.problems(p)]
    assert not problems, "\n".join(problems)


def test_the_twin_check_sees_other_code_and_older_text(tmp_path):
    english = tmp_path / "01_x.py"
    english.write_text("# ---\n# ---\n\n# %% [markdown]\n# Hello\n\n# %%\nx = 1\n")
    stamp = notebook_twins.prose_hash(english.read_text())
    twin = tmp_path / "01_x.zh.py"
    twin.write_text(f"# ---\n# jupyter:\n#   translated_from: {stamp}\n# ---\n\n# %% [markdown]\n# 你好\n\n"
                    "# %%\nx = 1\n")  # fmt: skip
    assert notebook_twins.problems(english) == []
    twin.write_text(twin.read_text().replace("x = 1", "x = 2"))
    assert notebook_twins.problems(english) == ["01_x.zh.py: its code cells are not "
                                                           "01_x.py's"]  # fmt: skip
    english.write_text(english.read_text().replace("Hello", "Hello again").replace("= 1", "= 2"))
    (problem,) = notebook_twins.problems(english)
    assert "01_x.py's text changed since it was translated" in problem
