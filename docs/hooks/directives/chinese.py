"""The Chinese words of what the site generates from the course's sources: a graded test's
description (its docstring), a bound's "what it measures", a known mistake's one line.

They live in docs/hooks/generated.zh.yml, one entry a text: ``KEY: {from: HASH, zh: TEXT}``,
where KEY names the source (``test 12 test_name``, ``bound 12.exact``, ``mistake 13 name``)
and HASH is the English text's, so that an English change shows: a Chinese page then shows the
English until the entry is translated again, and tests/site/test_translation.py lists the
entries whose English moved on. Commands, code and identifiers stay as they are.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import yaml
from mkdocs.exceptions import PluginError

STORE = Path(__file__).resolve().parents[1] / "generated.zh.yml"


def english_hash(text: str) -> str:
    """What an entry was translated from: the English, its spaces folded, hashed."""
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:12]


@cache
def _entries(path: Path = STORE, mtime: float = 0.0) -> dict[str, dict]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return {str(key): {"from": str(e["from"]), "zh": str(e["zh"])}
                for key, e in loaded.items()}  # fmt: skip
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise PluginError(f"{path.name}: not entries of a hash and a text: {exc}") from exc


def entries(path: Path = STORE) -> dict[str, dict]:
    """The store, read again when it changes (`mkdocs serve`)."""
    return _entries(path, path.stat().st_mtime if path.is_file() else 0.0)


def words(key: str, english: str, lang: str, path: Path = STORE) -> str:
    """`english` on an English page; on a Chinese page the entry's Chinese if it was
    translated from this very English, else the English."""
    if lang != "zh":
        return english
    entry = entries(path).get(key)
    if entry is None or entry["from"] != english_hash(english):
        return english
    return entry["zh"]


def stale(current: dict[str, str], path: Path = STORE) -> list[str]:
    """The entries whose English changed since (or whose source is gone), given every
    translatable text the site shows today, {key: English}."""
    problems = []
    for key, entry in entries(path).items():
        if key not in current:
            problems.append(f"{key}: no such text today")
        elif entry["from"] != english_hash(current[key]):
            problems.append(f"{key}: its English changed since it was translated")
    return problems
