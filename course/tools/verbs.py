"""The verbs of `python -m course`, by who runs them: what a verb is, and the parser and
--help built from a table of them (the table itself is course/tools/cli.py's VERBS).

A verb names its audience (students, instructors, the course's authors: its heading in
--help), the module below course.tools that does its work, and its line of --help. A verb
whose `arguments` are declared in its entry is parsed here and calls its `run`; the others
parse their own (python -m course bench --help) and get the rest of the command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

STUDENT, INSTRUCTOR, AUTHOR = "student", "instructor", "author"
HEADINGS = {  # --help lists the verbs under these, in this order
    STUDENT: "for students (the lessons)",
    INSTRUCTOR: "for instructors (grading a class)",
    AUTHOR: "for the course's authors (starters, records, figures)",
}


def arg(*names: str, **options) -> tuple[tuple[str, ...], dict]:
    """One argument of a verb parsed here, as argparse's add_argument takes it."""
    return names, options


@dataclass(frozen=True)
class Verb:
    name: str  # on the command line
    audience: str  # STUDENT, INSTRUCTOR or AUTHOR: its heading in --help
    module: str  # what does the work, below course.tools ("cli": course/tools/cli.py)
    help: str  # its line in --help
    run: Callable[[argparse.Namespace], int] | None = None  # None: module.main(the rest)
    arguments: tuple[tuple[tuple[str, ...], dict], ...] = ()  # parsed here, for `run`
    epilog: str | None = None
    # A verb that parses its own arguments: the errors that become a one-line message
    # (None: the command line's usual ones); the others keep their traceback.
    errors: type[Exception] | tuple[type[Exception], ...] | None = None


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        # One line, not a usage dump: the student should see what to fix.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _CourseParser(OneLineParser):
    """python -m course itself: its --help lists the verbs by audience, in table order."""

    verbs: Sequence[Verb] = ()

    def format_help(self) -> str:
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        formatter.add_text(self.description)
        for audience, heading in HEADINGS.items():
            formatter.start_section(heading)
            for verb in (v for v in self.verbs if v.audience == audience):
                formatter.add_argument(argparse.Action([], verb.name, help=verb.help))
            formatter.end_section()
        for group in self._action_groups:  # the options (the verbs' own action is hidden)
            formatter.start_section(group.title)
            formatter.add_arguments(group._group_actions)
            formatter.end_section()
        formatter.add_text(self.epilog)
        return formatter.format_help()


def parser(verbs: Sequence[Verb], description: str, version: str) -> argparse.ArgumentParser:
    """python -m course's parser: a sub-parser for each verb, --help grouped by audience."""
    if unknown := {v.audience for v in verbs} - set(HEADINGS):
        raise ValueError(f"verbs for no audience of {sorted(HEADINGS)}: {sorted(unknown)}")
    top = _CourseParser(
        prog="python -m course",
        usage="%(prog)s [-h] [--version] VERB ...",
        description=description,
        epilog="python -m course VERB --help: the arguments of one verb.",
    )
    top.verbs = tuple(verbs)
    top.add_argument("--version", action="version", version=version)
    sub = top.add_subparsers(dest="command", required=True, parser_class=OneLineParser,
                             prog=top.prog, help=argparse.SUPPRESS)  # fmt: skip
    for verb in verbs:
        if verb.run is None:  # its module parses the rest (python -m course bench --help)
            sub.add_parser(verb.name, add_help=False)
            continue
        one = sub.add_parser(verb.name, epilog=verb.epilog)
        for names, options in verb.arguments:
            one.add_argument(*names, **options)
    return top
