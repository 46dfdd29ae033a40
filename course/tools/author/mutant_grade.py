"""The test command `python -m course mutate` gives the mutation engine for each mutant:

    python -m course.tools.author.mutant_grade NN IMPL FILE SEEDS DEADLINE

grades lesson NN of the folder IMPL (the mutant is written into IMPL/<slug>/FILE) with the
tests that read FILE, stopping at the first failure, once per grading seed of SEEDS (comma
separated, COURSE_GRADE_SEED), each within DEADLINE seconds. It exits 0 (the engine's
"survived") as soon as one seed's grading passes, and 1 ("killed") only if every seed's
grading rejects the mutant. Its last line, `course-mutant: {...}`, says what each seed
did and which test failed first.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

from course import REPO_ROOT, launch, registry


def reading(test_file: Path, exercise: str) -> list[str]:
    """The tests of `test_file` marked @pytest.mark.exercise(..., `exercise`, ...)."""
    names = []
    for node in ast.parse(test_file.read_text()).body:
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Call) and ast.unparse(d.func) == "pytest.mark.exercise"
            and exercise in [getattr(a, "value", None) for a in d.args]
            for d in node.decorator_list
        ):  # fmt: skip
            names.append(node.name)
    return names


def command(lesson, impl: str, file: str) -> list[str]:
    """The pytest command that grades the tests of `lesson` that read `file`: all of them
    for the main file, those marked with it for another."""
    files = [str(f) for f in registry.tests(lesson)]
    from course.grader.grading import Grading

    grading = Grading(tuple(files), str(impl), ("-x",))
    if file != lesson.script:
        names = [n for f in registry.tests(lesson) for n in reading(f, file)]
        if names:
            grading = grading.with_options("-k", " or ".join(names))
    return grading.command()


def grade(argv: list[str]) -> int:
    """The test command's work (not a verb of its own: `course mutate` runs it)."""
    number, impl, file, seeds, deadline = argv
    lesson = registry.get(number)
    verdicts, first = {}, ""
    for seed in seeds.split(","):
        result = launch.run(args=command(lesson, impl, file), timeout=float(deadline),
                            cwd=REPO_ROOT, env={"COURSE_GRADE_SEED": seed})  # fmt: skip
        if result.timed_out:
            verdicts[seed] = "timeout"
            continue
        if result.returncode == 0:
            verdicts[seed] = "passed"
            break  # one seed that passes it: a survivor, whatever the others say
        verdicts[seed] = "rejected"
        failed = re.search(r"^FAILED (\S+)", result.output, re.M)
        first = first or (failed.group(1) if failed else result.output.strip()[-200:])
    if "passed" in verdicts.values():
        outcome = "survived"
    elif "timeout" in verdicts.values():
        outcome = "timeout"
    else:
        outcome = "killed"
    print("course-mutant: " + json.dumps({"outcome": outcome, "seeds": verdicts,
                                           "test": first}), flush=True)  # fmt: skip
    return 1 if outcome == "killed" else 0


if __name__ == "__main__":
    sys.exit(grade(sys.argv[1:]))
