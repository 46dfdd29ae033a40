"""One search index per language: a query typed on a Chinese page searches the Chinese
pages, one typed on an English page the English pages.

mkdocs-static-i18n builds both languages into one search/search_index.json, and Material's
search reads `search/search_index.json` under each page's `base` (the site's root): on
/zh/, "ring attention" found the English lesson 12 first, and 28 of the first 40 results
were English pages. After the build this hook splits that index in two, the Chinese
documents (their locations without the zh/ prefix) into zh/search/search_index.json, and
points the Chinese pages' `base` at /zh/, where Material then finds that index and
resolves each result's location. Material reads `base` for nothing else this site uses
(no instant navigation, no versions).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.plugins import event_priority

ZH = "zh/"
_BASE = re.compile(r'("base": ")([^"]*)(")')


def on_post_page(output, page, config):
    if page.file.dest_uri.startswith(ZH):
        output = _BASE.sub(lambda m: f"{m[1]}{m[2].rstrip('/')}/{ZH}{m[3]}", output, count=1)
    return output


def split(index: dict) -> tuple[dict, dict]:
    """(the English index, the Chinese one) from one index of both languages."""
    english = [d for d in index["docs"] if not d["location"].startswith(ZH)]
    chinese = [{**d, "location": d["location"][len(ZH) :]} for d in index["docs"]
               if d["location"].startswith(ZH)]  # fmt: skip
    return {**index, "docs": english}, {**index, "docs": chinese}


@event_priority(-100)  # after mkdocs-static-i18n has merged both languages' indexes
def on_post_build(config):
    path = Path(config.site_dir) / "search" / "search_index.json"
    if not path.exists():
        return
    english, chinese = split(json.loads(path.read_text("utf-8")))
    path.write_text(json.dumps(english, ensure_ascii=False), "utf-8")
    target = Path(config.site_dir) / ZH / "search" / "search_index.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(chinese, ensure_ascii=False), "utf-8")
