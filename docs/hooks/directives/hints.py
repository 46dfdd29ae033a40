"""The lessons' own blocks: hints (``<!-- hints: NN -->``), the lesson card and the course path,
in English or, on a Chinese page (``lang="zh"``), in Chinese: the lessons' Chinese titles and
summaries are in docs/hooks/lessons.zh.yml; the TODOs and hints are code comments, English."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml
from mkdocs.exceptions import PluginError

from directives.common import ROOT, lesson_page, lesson_todos, load_lessons, run_command
from directives.solutions import included

LESSONS_ZH = Path(__file__).resolve().parents[1] / "lessons.zh.yml"
LEVELS_ZH = {"foundations": "基础", "core": "核心", "advanced": "进阶"}


def lesson_hash(lesson) -> str:
    """What a Chinese title and summary were translated from: the English pair's hash."""
    return hashlib.sha256(f"{lesson.title}\n{lesson.summary}".encode()).hexdigest()[:12]


def chinese_lessons(path: Path = LESSONS_ZH) -> dict[str, dict]:
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))
        return {str(n): {k: str(e[k]) for k in ("title", "summary", "translated_from")}
                for n, e in entries.items()}  # fmt: skip
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise PluginError(
            f"{path.name}: not lessons with a title, summary and hash: {exc}"
        ) from exc


def lesson_translation_problems(lessons, entries: dict[str, dict]) -> list[str]:
    """Lessons with no Chinese title and summary, or whose English changed since."""
    problems = []
    for lesson in lessons:
        entry = entries.get(lesson.number)
        if entry is None:
            problems.append(f"lesson {lesson.number} has no entry")
        elif entry["translated_from"] != lesson_hash(lesson):
            problems.append(f"lesson {lesson.number}'s English title or summary changed since")
    return problems


def _words(lesson, lang: str) -> tuple[str, str, str]:
    """The lesson's title, summary and level in `lang`."""
    if lang != "zh":
        return lesson.title, lesson.summary, lesson.level.capitalize()
    entry = chinese_lessons().get(lesson.number)
    if entry is None:
        raise PluginError(f"lesson {lesson.number} has no Chinese title in {LESSONS_ZH.name}")
    return entry["title"], entry["summary"], LEVELS_ZH.get(lesson.level, lesson.level)


def render_hints(number: str, lang: str = "en") -> str:
    todos = lesson_todos("hints", number)
    scripts = list(dict.fromkeys(t["id"].rsplit(":", 1)[0].rsplit("/", 1)[-1] for t in todos))
    second = scripts[1].removesuffix(".py") if len(scripts) > 1 else ""
    one_script = f"`python -m course hint {number} {second}`"
    if lang == "zh":
        one = f"只看一个脚本：{one_script}。" if len(scripts) > 1 else ""
        intro = (
            f"卡住了？`python -m course hint {number}` 会为你第一个尚未完成的 TODO 打印提示 1，"
            f"`python -m course hint {number} 2` 打印下一条。{one}同样的提示（来自代码注释，"
            "英文），折叠如下："
        )
    else:
        one = f" In one script: {one_script}." if len(scripts) > 1 else ""
        intro = (
            f"Stuck? `python -m course hint {number}` prints hint 1 for your first unsolved "
            f"TODO, `python -m course hint {number} 2` the next one.{one} The same hints, folded:"
        )

    # On a Chinese page the TODOs and hints stay the starter's English comments, marked so
    # (lang="en": a reader's tools, and the page's count of English words, know them).
    def comment(text: str) -> str:
        return f'<span lang="en">{text}</span>' if lang == "zh" else text

    out = [intro, ""]
    for index, todo in enumerate(todos, start=1):
        where = todo["id"].removeprefix("TODO at ").split("/", 1)[-1]
        head = f"（`{where}`）：" if lang == "zh" else f" (`{where}`): "
        out += [f"**TODO {index}**{head}{comment(todo['goal'])}", ""]
        for k, text in enumerate(todo["hints"], start=1):
            tip = f'??? tip "{"提示" if lang == "zh" else "Hint"} {k}"'
            out += [tip, "", f"    {comment(text)}", ""]
    return "\n".join(out)


CARD = {  # the lesson card's labels
    "en": ("Lesson", "Level", "Starter (you edit this)", "Reference solution", "Launcher",
           "Run it", "Grade it"),
    "zh": ("第 {} 课", "难度", "起始代码（你来修改）", "参考答案", "启动方式", "运行", "评分"),
}  # fmt: skip


def render_lesson_card(number: str, lang: str = "en") -> str:
    lessons = {lesson.number: lesson for lesson in load_lessons()}
    if number not in lessons:
        raise PluginError(f"lesson-card: lesson {number!r} is not in course.registry.LESSONS")
    lesson = lessons[number]
    starter = f"lessons/{lesson.slug}/{lesson.script}"
    solution = f"solutions/{lesson.slug}/{lesson.script}"
    shown = (starter, solution) if included() else (starter,)  # the instructor build: none
    for rel in shown:
        if not (ROOT / rel).is_file():
            raise PluginError(f"lesson-card {number}: missing {rel}")
    title, summary, level = _words(lesson, lang)
    head, lv, start, ref, launcher, run, grade = CARD.get(lang, CARD["en"])
    head = head.format(number) if "{}" in head else f"{head} {number}"
    reference = f"| {ref} | `{solution}` |\n" if included() else ""
    return (
        f"| {head} | {title} |\n| --- | --- |\n"
        f"| {lv} | {level} |\n"
        f"| {start} | `{starter}` |\n"
        f"{reference}"
        f"| {launcher} | `{lesson.launcher}` |\n"
        f"| {run} | `{run_command(lesson)}` |\n"
        f"| {grade} | `python -m course grade {number}` |\n\n"
        f"{summary}\n"
    )


def render_lessons_table(page_dir: str, lang: str = "en") -> str:
    rows = []
    for lesson in load_lessons():
        title, summary, level = _words(lesson, lang)
        if lesson_page(lesson).is_file():
            rel = f"lessons/{lesson.slug}.md"
            if page_dir == "lessons":
                rel = f"{lesson.slug}.md"
            title = f"[{title}]({rel})"
        else:
            title += " *（即将推出）*" if lang == "zh" else " *(coming soon)*"
        rows.append(f"| {lesson.number} | {title} | {level} | {summary} |")
    head = (
        "| # | 课程 | 难度 | 你将学到 |"
        if lang == "zh"
        else "| # | Lesson | Level | What you learn |"
    )
    return head + "\n| --- | --- | --- | --- |\n" + "\n".join(rows)
