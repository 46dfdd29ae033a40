"""The graders' bounds and what the reference reached, from the ``course tolerances`` record:
``<!-- tolerances: NN -->`` (a lesson's table) and ``[[tolerance:NN:NAME]]`` (one bound, inline).

A page never types a measured tolerance: it quotes docs/results/tolerances/cpu.json, which
`python -m course tolerances` writes and tests/course/grader/test_tolerances.py keeps in step with
the
bounds the tests declare. A bound with only a floor is an accuracy in this course (the
test checks that every such bound is a `learned` one), and shows as a percentage.
"""

from __future__ import annotations

import json
from pathlib import Path

from mkdocs.exceptions import PluginError

from course.tools.author.tolerance_store import outside_by
from directives import chinese
from directives.common import ROOT, known_figure

RECORD = Path("docs") / "results" / "tolerances" / "cpu.json"


def _doc(root: Path = ROOT) -> dict:
    path = root / RECORD
    if not path.is_file():
        raise PluginError(f"tolerances: no record {RECORD} (`python -m course tolerances`)")
    known_figure(path, root)
    return json.loads(path.read_text(encoding="utf-8"))


def number(value: float, percent: bool = False) -> str:
    """2.5e-4, not 2.5e-04; 0.15; a percentage with one decimal; never split over two
    lines (a narrow column would break "2.5e-4" at its minus sign)."""
    if percent:
        text = f"{value:.1%}".replace("%", " %")
    elif value == 0:
        text = "0"
    elif abs(value) >= 0.01:
        text = f"{value:.2g}"
    else:
        mantissa, exponent = f"{value:.1e}".split("e")
        text = f"{mantissa.removesuffix('.0')}e{int(exponent)}"
    return f'<span style="white-space: nowrap">{text}</span>'


def _is_floor(entry: dict) -> bool:
    return entry.get("high") is None and entry.get("low") is not None


def allowed(entry: dict, lang: str = "en") -> str:
    low, high = entry.get("low"), entry.get("high")
    zh = lang == "zh"
    if _is_floor(entry):
        return f"{'至少' if zh else 'at least'} {number(low, True)}"
    if low is None:
        return f"{'至多' if zh else 'at most'} {number(high)}"
    return f"{number(low)} {'至' if zh else 'to'} {number(high)}"


def reached(entry: dict, lang: str = "en") -> str:
    percent = _is_floor(entry)
    if "min" not in entry:
        return "未测量" if lang == "zh" else "not measured"
    lo, hi = number(entry["min"], percent), number(entry["max"], percent)
    return lo if lo == hi else f"{lo} {'至' if lang == 'zh' else 'to'} {hi}"


def _seeds(entry: dict, lang: str = "en") -> str:
    seeds = sorted(int(s) for s, values in entry.get("seen", {}).items() if values)
    if not seeds:
        return "无" if lang == "zh" else "none"
    if entry.get("busy"):  # a timing: repeated runs, the machine loaded as the CI loads it
        if lang == "zh":
            return f"{len(seeds)} 次运行，旁边有 {entry['busy']} 个忙循环"
        return f"{len(seeds)} runs beside {entry['busy']} busy loops"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{len(seeds)} ({seeds[0]}–{seeds[-1]})"
    return f"{len(seeds)}"


def _entry(doc: dict, key: str) -> dict:
    entry = doc.get("tolerances", {}).get(key)
    if entry is None:
        raise PluginError(f"tolerance {key!r} is not in {RECORD} (`python -m course tolerances`)")
    return entry


def render_tolerance_figure(lesson: str, name: str, root: Path = ROOT, lang: str = "en") -> str:
    """[[tolerance:NN:NAME]]: the bound and what the reference reached, to follow "within" or
    "of": "1e-3 (the reference solution reached 4e-8 to 2.5e-4 over 12 seeds)"; on a Chinese
    page (``lang="zh"``) the same figures in Chinese."""
    entry = _entry(_doc(root), f"{lesson}.{name}")
    low, high = entry.get("low"), entry.get("high")
    to = " 至 " if lang == "zh" else " to "
    bound = (number(low, True) if _is_floor(entry) else number(high) if low is None
             else f"{number(low)}{to}{number(high)}")  # fmt: skip
    count = len([s for s, values in entry.get("seen", {}).items() if values])
    seen = reached(entry, lang)
    if lang == "zh":
        over = (
            f"{count} 次运行（旁边有 {entry['busy']} 个忙循环）"
            if entry.get("busy")
            else (f"{count} 个种子")
        )
        return f"{bound}（参考答案在 {over}上达到 {seen}）"
    over = (
        f"{count} runs beside {entry['busy']} busy loops" if entry.get("busy") else f"{count} seeds"
    )
    return f"{bound} (the reference solution reached {seen} over {over})"


def bound_key(key: str) -> str:
    return f"bound {key}"


def mistake_key(key: str, name: str) -> str:
    return f"mistake {key.split('.', 1)[0]} {name}"


def translatable(root: Path = ROOT) -> dict[str, str]:
    """{key: English} of every bound's "what" and every measured mistake's line."""
    found = {}
    for key, e in _doc(root).get("tolerances", {}).items():
        found[bound_key(key)] = " ".join(e["what"].split())
        for name, m in e.get("mistakes", {}).items():
            found[mistake_key(key, name)] = " ".join(m["why"].split())
    return found


WORDS = {
    "en": {
        "known": "The known mistakes, measured by the same tests",
        "known_intro": (
            "Each mistake of the course's mutation tests (`tests/mutants/`) that a bounded "
            "test catches, run through that test once at its own seed by `python -m course "
            "tolerances {lesson} --mistakes`:"
        ),
        "known_head": "| The mistake | What the grader measures | It reached |",
        "earlier": "stopped earlier by another check",
        "inside": ", inside the bound: another check caught it",
        "head": "| What the grader measures | Allowed | The reference reached | Nearest mistake "
        "| Seeds |",
        "median": "median",
        "measured": (
            "*Measured on the reference solution by `python -m course tolerances {lesson}` on "
            "{dates}: PyTorch {torches}, {cpus} CPU cores ({where}), gloo. Record: `{record}`. "
            "A value outside its bound, an upper bound less than twice the worst value "
            "reached, or a bound changed since it was measured fails the course's own tests. "
            "The nearest mistake is the value nearest the bound, from outside it, that one of "
            "the known mistakes below reached.*"
        ),
    },
    "zh": {
        "known": "已知的错误，由同样的测试测量",
        "known_intro": (
            "课程变异测试（`tests/mutants/`）中每个被有界测试抓住的错误，由 `python -m course "
            "tolerances {lesson} --mistakes` 在该测试自己的种子下各运行一次："
        ),
        "known_head": "| 错误 | 评分器测量的量 | 它达到的值 |",
        "earlier": "更早被另一项检查拦下",
        "inside": "，在界内：由另一项检查抓住",
        "head": "| 评分器测量的量 | 允许范围 | 参考答案达到的值 | 最近的错误 | 种子 |",
        "median": "中位数",
        "measured": (
            "*由 `python -m course tolerances {lesson}` 于 {dates} 在参考答案上测得：PyTorch "
            "{torches}，{cpus} 个 CPU 核心（`{where}`），gloo。记录：`{record}`。某个值超出其界、"
            "上界小于所达最差值的两倍、或测量之后界被改动，课程自己的测试都会失败。最近的错误，"
            "是下面已知错误在界外达到的、离界最近的值。*"
        ),
    },
}


def render_tolerances(lesson: str, root: Path = ROOT, lang: str = "en") -> str:
    """<!-- tolerances: NN -->: every bound lesson NN's tests declare, with what the reference
    reached over its seeds, and where and when that was measured."""
    doc = _doc(root)
    said = WORDS.get(lang, WORDS["en"])
    keys = sorted(k for k in doc.get("tolerances", {}) if k.split(".", 1)[0] == lesson)
    if not keys:
        raise PluginError(f"tolerances: {RECORD} has no bound of lesson {lesson}")
    rows, mistakes = [], []
    for key in keys:
        e = doc["tolerances"][key]
        percent = _is_floor(e)
        what = chinese.words(bound_key(key), " ".join(e["what"].split()), lang)
        median = number(e["median"], percent) if "median" in e else "-"
        rows.append(f"| {what} | {allowed(e, lang)} | {reached(e, lang)} ({said['median']} "
                    f"{median}) | {_nearest_mistake(e)} | {_seeds(e, lang)} |")  # fmt: skip
        for name, m in e.get("mistakes", {}).items():
            value = (said["earlier"] if m["value"] is None
                     else number(m["value"], percent))  # fmt: skip
            if m["value"] is not None and not _beyond(e, m["value"]):
                value += said["inside"]
            why = chinese.words(mistake_key(key, name), " ".join(m["why"].split()), lang)
            mistakes.append(f"    | {why} | {what} | {value} |")
    dates = sorted({doc["tolerances"][k]["date"][:10] for k in keys})
    torches = sorted({doc["tolerances"][k]["torch"] for k in keys})
    prov = doc.get("provenance", {})
    known = ""
    if mistakes:
        known = (
            f'??? note "{said["known"]}"\n\n    '
            + said["known_intro"].format(lesson=lesson)
            + "\n\n    "
            + said["known_head"]
            + "\n    | --- | --- | --- |\n"
            + "\n".join(mistakes)
            + "\n\n"
        )
    measured = said["measured"].format(
        lesson=lesson, dates=", ".join(dates), torches=", ".join(torches),
        cpus=prov.get("cpus", "?"), where=prov.get("processor") or prov.get("machine", ""),
        record=RECORD,
    )  # fmt: skip
    return (
        '<div class="course-bench" markdown>\n\n'
        + said["head"]
        + "\n| --- | --- | --- | --- | --- |\n"
        + "\n".join(rows)
        + "\n\n</div>\n\n"
        + measured
        + "\n\n"
        + known
    )


def _beyond(entry: dict, value: float) -> float:
    return outside_by(entry.get("low"), entry.get("high"), value)


def _nearest_mistake(entry: dict) -> str:
    values = [m["value"] for m in entry.get("mistakes", {}).values() if m["value"] is not None]
    outside = [v for v in values if _beyond(entry, v) > 0]
    if not outside:
        return "-"
    return number(min(outside, key=lambda v: _beyond(entry, v)), _is_floor(entry))
