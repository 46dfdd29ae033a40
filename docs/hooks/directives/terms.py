"""The fixed Chinese terms (docs/hooks/terms.zh.yml): the glossary's table, and the check
that the Chinese pages use them (tests/site/test_translation.py)."""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml
from mkdocs.exceptions import PluginError

TERMS = Path(__file__).resolve().parents[1] / "terms.zh.yml"


@dataclass(frozen=True)
class Term:
    en: str
    zh: str
    note: str
    avoid: tuple[str, ...]

    @property
    def kept(self) -> bool:
        """Whether the Chinese pages keep the English word."""
        return self.zh == self.en


def load(path: Path = TERMS) -> list[Term]:
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))
        return [Term(e["en"], e["zh"], e["note"], tuple(e.get("avoid") or ())) for e in entries]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise PluginError(f"{path.name}: not a list of terms (en, zh, note, avoid): {exc}") from exc


def render_terms(path: Path = TERMS) -> str:
    """``<!-- translation-terms -->``: English | 中文 | 说明, one row a term."""
    rows = ["| English | 中文 | 说明 |", "| --- | --- | --- |"]
    for term in load(path):
        zh = f"{term.zh}（保留英文）" if term.kept else term.zh
        rows.append(f"| {term.en} | {zh} | {term.note} |")
    return "\n".join(rows) + "\n"


def jieba_words(path: Path = TERMS) -> Path:
    """A jieba user dictionary of the Chinese terms (微批次, 流水线并行, ...), so that search
    indexes each as one word, as a reader types it; written beside the system's temporary
    files, named by its content."""
    words = sorted({t.zh for t in load(path) if re.fullmatch(r"[\u4e00-\u9fff]+", t.zh)})
    text = "".join(f"{word} 100000\n" for word in words)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / f"course-jieba-{digest}.txt"
    if not out.exists():
        out.write_text(text, encoding="utf-8")
    return out


# A fenced block (closed by as many backticks at the same indent: ```` may hold ```).
FENCED = re.compile(r"^([ \t]*)(`{3,}).*?^\1\2[ \t]*$", re.M | re.S)
CODE = re.compile(FENCED.pattern + r"|`[^`\n]*`|<!--.*?-->|\[\[[^\]]*\]\]|\([^)\s]*\)", re.M | re.S)


def prose(markdown: str) -> str:
    """The page's words: fenced blocks, inline code, directives, inline references and link
    targets removed."""
    return CODE.sub(" ", markdown)


def uses(text: str, english: str) -> bool:
    """Whether English prose uses the term as a whole word (any case; plural s or es;
    a hyphen or a space between its words)."""
    words = r"[-\s]+".join(re.escape(w) for w in re.split(r"[-\s]+", english))
    return re.search(rf"(?<![\w-]){words}(?:e?s)?(?![\w-])", text, re.I) is not None


def inconsistencies(english: str, chinese: str, terms: list[Term]) -> list[str]:
    """What a Chinese page gets wrong about the fixed terms, given its English page: an
    avoided rendering used, or a term of the English with its fixed form nowhere."""
    en, zh = prose(english), prose(chinese)
    problems = []
    for term in terms:
        for wrong in term.avoid:
            if wrong in zh:
                problems.append(f"writes {wrong!r} for {term.en!r} (the glossary: {term.zh!r})")
        if uses(en, term.en) and term.zh.lower() not in zh.lower():
            problems.append(f"the English says {term.en!r}; {term.zh!r} is nowhere")
    return problems
