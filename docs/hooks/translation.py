"""The Chinese site's bookkeeping: which page translates which, whether it is stale, and
whether its structure matches the English.

Every English page ``docs/PAGE.md`` has a Chinese page ``docs/PAGE.zh.md`` (the suffix
layout of mkdocs-static-i18n). The Chinese page starts with front matter naming the hash
of the English text it was translated from::

    ---
    translated_from: 3f2a9c01b7de
    ---

and gives every heading the English heading's id (``## 目标 {#goal}``), so links and
anchors are the same in both languages. Code is never translated: the snippet includes,
directives, inline references and fenced blocks must be the very same on both sides (a
diagram may include its ``.zh.mmd`` twin instead, for translated labels).

Run from the repository root::

    python docs/hooks/translation.py status          # missing, stale and broken pages
    python docs/hooks/translation.py ids PAGE.md     # the English headings and their ids
    python docs/hooks/translation.py stamp PAGE.md   # after a review: record the new hash

The site's build hook (course_site.py) fails on a missing or broken page and puts a
notice, linking the English, on a stale one; tests/site/test_translation.py lists them.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from markdown.extensions.toc import slugify, unique
from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SUFFIX = ".zh.md"
# Folders of docs/ that hold no page of the site (mkdocs.yml's exclude_docs).
NOT_PAGES = ("hooks/",)

FRONT_MATTER = re.compile(r"\A---\n(?P<body>.*?)\n---\n", re.S)
HASH_LINE = re.compile(r"^translated_from:\s*(?P<hash>[0-9a-f]{12})\s*$", re.M)
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<text>.*?)\s*$")
EXPLICIT_ID = re.compile(r"\s*\{:?\s*#(?P<id>[\w-]+)\s*\}\s*$")
INCLUDE = re.compile(r'^[ \t]*--8<--\s+"(?P<path>[^"]+)"\s*$', re.M)
DIRECTIVE = re.compile(r"^[ \t]*(<!-- [a-z-]+:?[^>]*?-->)[ \t]*$", re.M)
INLINE = re.compile(r"\[\[[a-z-]+:[^\]]+\]\]")
ADMONITION = re.compile(r"^[ \t]*(?P<kind>!!!|\?\?\?\+?)\s+(?P<type>[a-z]+)", re.M)
TAB = re.compile(r'^[ \t]*===\+?\s+"', re.M)


def english_pages() -> list[Path]:
    """Every English page of the site, as a path under docs/."""
    pages = []
    for path in sorted(DOCS.rglob("*.md")):
        rel = path.relative_to(DOCS).as_posix()
        if not rel.endswith(SUFFIX) and not rel.startswith(NOT_PAGES):
            pages.append(path)
    return pages


def chinese_of(english: Path) -> Path:
    return english.with_name(english.name[: -len(".md")] + SUFFIX)


def english_of(chinese: Path) -> Path:
    return chinese.with_name(chinese.name[: -len(SUFFIX)] + ".md")


def source_hash(english: Path) -> str:
    """The first 12 hex digits of the English page's SHA-256 (line endings normalised)."""
    text = english.read_text(encoding="utf-8").replace("\r\n", "\n")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def recorded_hash(chinese_text: str) -> str | None:
    m = FRONT_MATTER.match(chinese_text)
    found = HASH_LINE.search(m.group("body")) if m else None
    return found.group("hash") if found else None


def without_front_matter(text: str) -> str:
    return FRONT_MATTER.sub("", text, count=1)


@dataclass
class Structure:
    """What must be the same on both sides of a translation."""

    headings: list[tuple[int, str]] = field(default_factory=list)  # (level, id)
    includes: list[str] = field(default_factory=list)
    directives: list[str] = field(default_factory=list)
    inline: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)  # fenced blocks, verbatim
    admonitions: list[str] = field(default_factory=list)
    tabs: int = 0
    missing_ids: list[str] = field(default_factory=list)  # headings with no {#id}


def structure(text: str, explicit_ids: bool = False) -> Structure:
    """The page's structure. English headings get the ids Python-Markdown's toc gives them;
    with ``explicit_ids`` (a Chinese page) each heading must name its id itself."""
    out, used, prose, fence, block, ticks = Structure(), set(), [], None, [], 3
    for line in without_front_matter(text).splitlines():
        stripped = line.lstrip()
        if fence is None and stripped.startswith("```"):
            fence, block = len(line) - len(stripped), []
            ticks = len(stripped) - len(stripped.lstrip("`"))  # ```` holds ``` inside it
            prose.append("")
            continue
        if fence is not None:
            closing = stripped.rstrip()
            if (
                closing == "`" * len(closing)
                and len(closing) >= ticks
                and len(line) - len(stripped) == fence
            ):
                out.code.append("\n".join(block))
                fence = None
            elif not INCLUDE.match(line):
                block.append(line[fence:] if line[:fence].strip() == "" else line)
            prose.append(line if INCLUDE.match(line) else "")
            continue
        prose.append(line)
        m = HEADING.match(line)
        if m:
            title, given = m.group("text"), EXPLICIT_ID.search(m.group("text"))
            if given:
                ident = given.group("id")
            elif explicit_ids:
                out.missing_ids.append(title)
                ident = "?"
            else:
                ident = unique(slugify(re.sub(r"[`*]", "", title), "-"), used)
            used.add(ident)
            out.headings.append((len(m.group("hashes")), ident))
    body = "\n".join(prose)
    out.includes = [re.sub(r"\.zh\.mmd$", ".mmd", m.group("path")) for m in INCLUDE.finditer(body)]
    out.directives = [m.group(1) for m in DIRECTIVE.finditer(body)]
    out.inline = INLINE.findall(body)
    out.admonitions = [m.group("type") for m in ADMONITION.finditer(body)]
    out.tabs = len(TAB.findall(body))
    return out


def differences(english: Path, chinese: Path) -> list[str]:
    """How the Chinese page's structure differs from the English page's (empty: none)."""
    en = structure(english.read_text(encoding="utf-8"))
    zh_text = chinese.read_text(encoding="utf-8")
    zh = structure(zh_text, explicit_ids=True)
    problems = []
    if recorded_hash(zh_text) is None:
        problems.append("no `translated_from: <hash>` in its front matter")
    if zh.missing_ids:
        problems.append(f"headings without {{#id}}: {zh.missing_ids[:3]}")
    for name in ("headings", "includes", "directives", "inline", "admonitions", "tabs"):
        a, b = getattr(en, name), getattr(zh, name)
        if a != b:
            problems.append(f"{name} differ: English {_first_difference(a, b)}")
    if en.code != zh.code:
        problems.append(f"fenced code differs: English {_first_difference(en.code, zh.code)}")
    return problems


def _first_difference(a, b) -> str:
    if not isinstance(a, list):
        return f"{a!r}, Chinese {b!r}"
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"#{i + 1} {x!r}, Chinese {y!r}"
    return f"has {len(a)}, Chinese {len(b)}" + (
        f" (first extra: {(a if len(a) > len(b) else b)[min(len(a), len(b))]!r})"
        if len(a) != len(b)
        else ""
    )


def missing() -> list[Path]:
    return [p for p in english_pages() if not chinese_of(p).exists()]


def stale() -> list[Path]:
    """Chinese pages whose English source changed since they were translated."""
    out = []
    for english in english_pages():
        chinese = chinese_of(english)
        if chinese.exists():
            recorded = recorded_hash(chinese.read_text(encoding="utf-8"))
            if recorded is not None and recorded != source_hash(english):
                out.append(chinese)
    return out


def broken() -> dict[Path, list[str]]:
    out = {}
    for english in english_pages():
        chinese = chinese_of(english)
        if chinese.exists() and (problems := differences(english, chinese)):
            out[chinese] = problems
    return out


def stamp(english: Path) -> None:
    """Record the English page's current hash in its Chinese page (after a review)."""
    chinese = chinese_of(english)
    text = chinese.read_text(encoding="utf-8")
    line = f"translated_from: {source_hash(english)}"
    m = FRONT_MATTER.match(text)
    if m and HASH_LINE.search(m.group("body")):
        body = HASH_LINE.sub(line, m.group("body"))
        text = f"---\n{body}\n---\n" + text[m.end() :]
    elif m:
        text = f"---\n{m.group('body')}\n{line}\n---\n" + text[m.end() :]
    else:
        text = f"---\n{line}\n---\n\n" + text
    chinese.write_text(text, encoding="utf-8")


STALE_NOTICE = """!!! warning "译文可能已过时"

    本页译自英文原文的较早版本，英文原文此后有改动，译文尚未复核。
    以英文原文为准：<a href="{href}">阅读英文原文</a>。

"""


def for_build(markdown: str, file, url: str) -> str:
    """A page of the Chinese build (mkdocs-static-i18n sets ``file.locale_alternate_of`` to
    the language being built, and ``file.locale`` to the page's own): a page with no
    translation, or one whose structure differs from the English, fails the build; a stale
    one gets a notice under its title that links the English page."""
    building = getattr(file, "locale_alternate_of", None)
    if building in (None, "en") or not file.src_uri.endswith(".md"):
        return markdown  # the English build, or a notebook (code: shared, not translated)
    source = Path(file.abs_src_path)
    if getattr(file, "locale", "en") == "en":
        raise PluginError(
            f"{file.src_uri} has no Chinese page {_rel(chinese_of(source))}: translate it "
            "(python docs/hooks/translation.py ids " + _rel(source) + ")"
        )
    english = english_of(source)
    problems = differences(english, source)
    if problems:
        raise PluginError(f"{_rel(source)} does not match {_rel(english)}: {problems[0]}")
    if recorded_hash(source.read_text(encoding="utf-8")) == source_hash(english):
        return markdown
    href = "../" * url.count("/") + url.split("/", 1)[1]  # zh/a/b/ -> ../../../a/b/
    notice = STALE_NOTICE.format(href=href or "./")
    title = re.match(r"\A(?:#[^\n]*\n+)?", markdown)
    return markdown[: title.end()] + notice + markdown[title.end() :]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str]) -> int:
    usage = "usage: python docs/hooks/translation.py status | ids PAGE.md | stamp PAGE.md"
    if argv[:1] not in (["status"], ["ids"], ["stamp"]) or len(argv) != 2 - (argv[0] == "status"):
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "status":
        from directives import hints  # the lessons' titles and summaries (lessons.zh.yml)

        from course.registry import LESSONS

        lines = [f"missing  {_rel(chinese_of(p))}" for p in missing()]
        lines += [f"stale    {_rel(p)} (its English changed: review, then stamp)" for p in stale()]
        lines += [f"broken   {_rel(p)}: {x}" for p, xs in broken().items() for x in xs]
        lessons = hints.lesson_translation_problems(LESSONS, hints.chinese_lessons())
        lines += [f"lesson   docs/hooks/lessons.zh.yml: {x}" for x in lessons]
        print("\n".join(lines or [f"{len(english_pages())} pages: translated, current, in parity"]))
        return int(bool(lines))
    english = (ROOT / argv[1]).resolve()
    if english.name.endswith(SUFFIX):
        english = english_of(english)
    if not english.is_file():
        print(f"error: no English page {argv[1]}", file=sys.stderr)
        return 2
    if argv[0] == "stamp":
        if not chinese_of(english).exists():
            print(f"error: no Chinese page {_rel(chinese_of(english))}", file=sys.stderr)
            return 2
        stamp(english)
        print(f"{_rel(chinese_of(english))}: translated_from {source_hash(english)}")
        return 0
    print(f"translated_from: {source_hash(english)}")
    for level, ident in structure(english.read_text(encoding="utf-8")).headings:
        print(f"{'#' * level} {{#{ident}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
