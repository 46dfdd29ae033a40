"""Mutants that behave exactly as the reference does, by lesson: {lesson: {key: reason}}.

`python -m course mutate` (course/tools/author/mutate.py) makes them and records them as
equivalent instead of grading them. A key is `FILE:BEFORE -> AFTER`, the mutated line as
the engine's record shows it (stripped); the reason says in one line why no test can tell
the two apart. Kept here with the mutants: they name the reference's lines.
"""

EQUIVALENT: dict[str, dict[str, str]] = {}
