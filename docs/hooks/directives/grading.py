"""``<!-- grading: NN -->``: the table of lesson NN's graded tests (the files the registry
says grade it), read with the grader's own rules (course/grader/rules.py)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

from course import registry
from course.grader.rules import GradedTest, collect_graded_tests, describe, lesson_of
from directives import chinese
from directives.common import ROOT


def _fmt(x: float) -> str:
    return f"{x:g}"


def _runs_on(t: GradedTest, lang: str = "en") -> str:
    if t.backend:
        return f"CPU + {t.gpus or 2} {'块 GPU' if lang == 'zh' else 'GPUs'}"
    if t.gpus:
        if lang == "zh":
            return f"{t.gpus} 块 GPU"
        return f"{t.gpus} GPU{'s' if t.gpus > 1 else ''}"
    return "CPU"


def _breakable(name: str) -> str:
    """A test name as code that may wrap after underscores instead of mid-word."""
    return "<code>" + name.replace("_", "_<wbr>") + "</code>"


def bounds(path: Path) -> dict[str, str]:
    """A test module's named bounds, as the numbers a reader needs: each top-level
    `NAME = tolerance(..., high=H)` (or low=L) and `NAME = <number>`, {NAME: "H"}. A
    docstring says "below LEARNED"; the table says "below 0.5"."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):  # fmt: skip
            continue
        name, value = node.targets[0].id, node.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "tolerance":
            given = {k.arg: k.value for k in value.keywords if k.arg in ("high", "low")}
            value = given.get("high", given.get("low"))
        try:
            number = ast.literal_eval(value) if value is not None else None
        except ValueError:
            continue
        if isinstance(number, int | float) and not isinstance(number, bool) and name.isupper():
            found[name] = _fmt(number)
    return found


def _in_numbers(text: str, named: dict[str, str]) -> str:
    """`text` with each named bound (a whole upper-case word) replaced by its number."""
    if not named:
        return text
    words = re.compile(r"\b(" + "|".join(map(re.escape, sorted(named, key=len, reverse=True)))
                       + r")\b")  # fmt: skip
    return words.sub(lambda m: named[m.group(1)], text)


def test_key(path: Path, name: str) -> str:
    """A graded test's key in the Chinese store: its lesson and its name."""
    return f"test {lesson_of(path)} {name}"


def descriptions(path: Path) -> dict[str, str]:
    """{key: English} of a test file's graded tests, as the store translates them: the
    docstring, its named bounds still names (the table puts their numbers in)."""
    return {test_key(path, t.name): " ".join(t.doc.split())
            for t in collect_graded_tests(path) if t.doc.strip()}  # fmt: skip


WORDS = {
    "en": {
        "generated": "Generated from {files} when this page was built.",
        "head": "| Test | What it checks | Points each | Cases | Max | Runs on |",
        "core": " *(core)*",
        "total": "| **Total** | **{cpu}** of them on a CPU-only machine | | | **{total}** | |",
        "after": (
            "Each case of a test (one per parameter, and per backend for distributed tests) "
            "earns its points only if it passes. Cases that need GPUs the machine lacks are "
            "skipped and count neither way, so a laptop grades out of the CPU total. Tests "
            "marked *core* are the ones every unsolved starter must fail."
        ),
    },
    "zh": {
        "generated": "本表在构建本页时由 {files} 生成。",
        "head": "| 测试 | 检查什么 | 每例分数 | 用例数 | 满分 | 运行于 |",
        "core": " *（核心）*",
        "total": "| **合计** | 其中 **{cpu}** 分在只有 CPU 的机器上 | | | **{total}** | |",
        "after": (
            "一个测试的每个用例（每个参数一个；分布式测试每个后端各一个）只有通过才得分。"
            "需要本机没有的 GPU 的用例会被跳过，不计得失，所以笔记本电脑按 CPU 合计评分。"
            "标为*核心*的测试，是每个未完成的起始代码都必须失败的测试。"
        ),
    },
}


def render_grading(lesson: str, root: Path = ROOT, lang: str = "en") -> str:
    try:
        paths = registry.tests(lesson, root)
    except registry.UnknownLesson as exc:
        raise PluginError(f"grading: {exc}") from exc
    if not paths:
        raise PluginError(f"grading: no test file grades lesson {lesson}")
    said = WORDS.get(lang, WORDS["en"])
    rows, cpu_total, total = [], 0.0, 0.0
    for path in paths:
        named = bounds(path)
        for t in collect_graded_tests(path):
            english = " ".join(t.doc.split())
            text = chinese.words(test_key(path, t.name), english, lang) if english else ""
            what = _in_numbers(text, named) or describe(t.name)
            if "core" in t.markers:
                what += said["core"]
            max_points = t.worth * t.total_cases
            total += max_points
            if t.backend:
                cpu_total += t.worth * t.cases
            elif not t.gpus:
                cpu_total += max_points
            rows.append(
                f"| {_breakable(t.name)} | {what} | {_fmt(t.worth)} | {t.total_cases} "
                f"| {_fmt(max_points)} | {_runs_on(t, lang)} |"
            )
    if not rows:
        raise PluginError(f"grading: lesson {lesson}'s tests have no test functions")
    files = ", ".join(f"`{p.relative_to(root).as_posix()}`" for p in paths)
    return (
        said["generated"].format(files=files) + "\n\n"
        '<div class="grading" markdown>\n\n'
        + said["head"]
        + "\n| --- | --- | ---: | ---: | ---: | --- |\n"
        + "\n".join(rows)
        + "\n"
        + said["total"].format(cpu=_fmt(cpu_total), total=_fmt(total))
        + "\n\n</div>\n\n"
        + said["after"]
        + "\n"
    )


MUTATION_HEADINGS = {
    "en": ("lesson", "mutants graded", "killed", "survived", "equivalent", "timeout", "score",
           "grading seeds", "measured"),
    "zh": ("课", "已评分的变异体", "被拒绝", "存活", "等价", "超时", "得分", "评分种子",
           "测量时间"),
}  # fmt: skip


def render_mutation_scores(root: Path = ROOT, lang: str = "en") -> str:
    """``<!-- mutation-scores -->``: each lesson's `course mutate` record, one row: how many
    of the mutants its run made were graded, and how the grade took them. The score is the
    killed share of the mutants graded, equivalents aside."""
    from course.tools.author import mutate

    paths = sorted((root / "docs" / "results" / "grading").glob("mutation-*.json"))
    if not paths:
        return (
            "*尚无任何课的变异记录（`python -m course mutate NN`）。*\n"
            if lang == "zh"
            else "*No lesson has a mutation record yet (`python -m course mutate NN`).*\n"
        )
    rows = ["| " + " | ".join(MUTATION_HEADINGS[lang]) + " |", "|" + " --- |" * 9]
    for path in paths:
        doc = json.loads(path.read_text())
        if doc.get("kind") != mutate.KIND:
            raise PluginError(f"mutation-scores: {path.name} is not a `course mutate` record")
        c = doc["counts"]
        graded = len(doc["mutants"]) - c["equivalent"]
        of = "／" if lang == "zh" else " of "
        score = "-" if doc["score"] is None else f"{doc['score']:g} %"
        rows.append(
            f"| {doc['lesson']} | {graded}{of}{doc['planned'] - c['equivalent']} | {c['killed']} "
            f"| {c['survived']} | {c['equivalent']} | {c['timeout'] + c['error']} | {score} "
            f"| {', '.join(map(str, doc['seeds']))} | {doc['provenance']['date'][:10]} |"
        )
    engine = f"cosmic-ray {json.loads(paths[0].read_text())['version']}"
    note = (
        f"*由 `python -m course mutate NN` 测得（{engine}），记录在 "
        "`docs/results/grading/mutation-NN.json`。*"
        if lang == "zh"
        else f"*Measured by `python -m course mutate NN` ({engine}); records: "
        "`docs/results/grading/mutation-NN.json`.*"
    )
    return "\n".join(rows) + "\n\n" + note + "\n"
