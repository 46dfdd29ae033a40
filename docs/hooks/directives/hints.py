"""The lessons' own blocks: hints (``<!-- hints: NN -->``), the lesson card and the course path."""

from __future__ import annotations

from mkdocs.exceptions import PluginError

from directives.common import ROOT, lesson_page, lesson_todos, load_lessons, run_command
from directives.solutions import included


def render_hints(number: str) -> str:
    todos = lesson_todos("hints", number)
    scripts = list(dict.fromkeys(t["id"].rsplit(":", 1)[0].rsplit("/", 1)[-1] for t in todos))
    one = (
        f" In one script: `python -m course hint {number} {scripts[1].removesuffix('.py')}`."
        if len(scripts) > 1
        else ""
    )
    out = [
        f"Stuck? `python -m course hint {number}` prints hint 1 for your first unsolved "
        f"TODO, `python -m course hint {number} 2` the next one.{one} The same hints, folded:",
        "",
    ]
    for index, todo in enumerate(todos, start=1):
        where = todo["id"].removeprefix("TODO at ").split("/", 1)[-1]
        out += [f"**TODO {index}** (`{where}`): {todo['goal']}", ""]
        for k, text in enumerate(todo["hints"], start=1):
            out += [f'??? tip "Hint {k}"', "", f"    {text}", ""]
    return "\n".join(out)


def render_lesson_card(number: str) -> str:
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
    reference = f"| Reference solution | `{solution}` |\n" if included() else ""
    return (
        f"| Lesson {number} | {lesson.title} |\n| --- | --- |\n"
        f"| Level | {lesson.level.capitalize()} |\n"
        f"| Starter (you edit this) | `{starter}` |\n"
        f"{reference}"
        f"| Launcher | `{lesson.launcher}` |\n"
        f"| Run it | `{run_command(lesson)}` |\n"
        f"| Grade it | `python -m course grade {number}` |\n\n"
        f"{lesson.summary}\n"
    )


def render_lessons_table(page_dir: str) -> str:
    rows = []
    for lesson in load_lessons():
        title = lesson.title
        if lesson_page(lesson).is_file():
            rel = f"lessons/{lesson.slug}.md"
            if page_dir == "lessons":
                rel = f"{lesson.slug}.md"
            title = f"[{title}]({rel})"
        else:
            title += " *(coming soon)*"
        rows.append(
            f"| {lesson.number} | {title} | {lesson.level.capitalize()} | {lesson.summary} |"
        )
    return "| # | Lesson | Level | What you learn |\n| --- | --- | --- | --- |\n" + "\n".join(rows)
