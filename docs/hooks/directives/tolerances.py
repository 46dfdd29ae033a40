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


def allowed(entry: dict) -> str:
    low, high = entry.get("low"), entry.get("high")
    if _is_floor(entry):
        return f"at least {number(low, True)}"
    if low is None:
        return f"at most {number(high)}"
    return f"{number(low)} to {number(high)}"


def reached(entry: dict) -> str:
    percent = _is_floor(entry)
    if "min" not in entry:
        return "not measured"
    lo, hi = number(entry["min"], percent), number(entry["max"], percent)
    return lo if lo == hi else f"{lo} to {hi}"


def _seeds(entry: dict) -> str:
    seeds = sorted(int(s) for s, values in entry.get("seen", {}).items() if values)
    if not seeds:
        return "none"
    if entry.get("busy"):  # a timing: repeated runs, the machine loaded as the CI loads it
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
    seen = reached(entry)
    if lang == "zh":
        seen = seen.replace(" to ", to).replace("not measured", "未测量")
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


def render_tolerances(lesson: str, root: Path = ROOT) -> str:
    """<!-- tolerances: NN -->: every bound lesson NN's tests declare, with what the reference
    reached over its seeds, and where and when that was measured."""
    doc = _doc(root)
    keys = sorted(k for k in doc.get("tolerances", {}) if k.split(".", 1)[0] == lesson)
    if not keys:
        raise PluginError(f"tolerances: {RECORD} has no bound of lesson {lesson}")
    rows, mistakes = [], []
    for key in keys:
        e = doc["tolerances"][key]
        percent = _is_floor(e)
        median = number(e["median"], percent) if "median" in e else "-"
        rows.append(f"| {e['what']} | {allowed(e)} | {reached(e)} (median {median}) "
                    f"| {_nearest_mistake(e)} | {_seeds(e)} |")  # fmt: skip
        for m in e.get("mistakes", {}).values():
            value = ("stopped earlier by another check" if m["value"] is None
                     else number(m["value"], percent))  # fmt: skip
            if m["value"] is not None and not _beyond(e, m["value"]):
                value += ", inside the bound: another check caught it"
            mistakes.append(f"    | {m['why']} | {e['what']} | {value} |")
    dates = sorted({doc["tolerances"][k]["date"][:10] for k in keys})
    torches = sorted({doc["tolerances"][k]["torch"] for k in keys})
    prov = doc.get("provenance", {})
    known = ""
    if mistakes:
        known = (
            '??? note "The known mistakes, measured by the same tests"\n\n'
            "    Each mistake of the course's mutation tests (`tests/mutants/`) that a bounded "
            "test catches, run through that test once at its own seed by `python -m course "
            f"tolerances {lesson} --mistakes`:\n\n"
            "    | The mistake | What the grader measures | It reached |\n"
            "    | --- | --- | --- |\n" + "\n".join(mistakes) + "\n\n"
        )
    return (
        '<div class="course-bench" markdown>\n\n'
        "| What the grader measures | Allowed | The reference reached | Nearest mistake "
        "| Seeds |\n| --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n</div>\n\n"
        f"*Measured on the reference solution by `python -m course tolerances {lesson}` on "
        f"{', '.join(dates)}: PyTorch {', '.join(torches)}, {prov.get('cpus', '?')} CPU cores "
        f"({prov.get('processor') or prov.get('machine', '')}), gloo. Record: `{RECORD}`. "
        "A value outside its bound, an upper bound less than twice the worst value reached, "
        "or a bound changed since it was measured fails the course's own tests. The nearest "
        "mistake is the value nearest the bound, from outside it, that one of the known "
        "mistakes below reached.*\n\n" + known
    )


def _beyond(entry: dict, value: float) -> float:
    return outside_by(entry.get("low"), entry.get("high"), value)


def _nearest_mistake(entry: dict) -> str:
    values = [m["value"] for m in entry.get("mistakes", {}).values() if m["value"] is not None]
    outside = [v for v in values if _beyond(entry, v) > 0]
    if not outside:
        return "-"
    return number(min(outside, key=lambda v: _beyond(entry, v)), _is_floor(entry))
