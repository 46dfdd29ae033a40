"""When a recorded output line and what the reference prints today agree: each figure is
compared by what its line claims it is.

tests/site/test_recorded_outputs.py runs every record's command again (course/tools/author/
record.py) and compares the two outputs line by line: the words must be the same, and each
figure (read as a number, exponent included: `3.0e-07` is one number) must agree as its
kind, below, says. The kind comes from the words around the figure, first match wins:

- a count, a step, a shape or a byte total (no decimal point, or a byte unit after it):
  exact, on every processor;
- a difference from a reference ("largest difference from one process 3.0e-07"): rounding
  noise, a bound to stay under, at most NOISE_FACTOR times the recorded figure;
- a statistic of a chaotic run (a loss, an accuracy, an expert's load or the dropped
  share): within a band. On the processor and kernels the record was made with, the band
  is the last printed digit's; with other kernels (another processor, or another
  ATEN_CPU_CAPABILITY on this one) it is the band measured for that kind of figure;
- any other decimal (a ratio, a formula's MiB): it measured the same with every kernel,
  so relative 1e-3 and the last printed digit.

The bands between kernels were measured on 2026-12-06 on one AMD EPYC (avx2, avx512f),
running every CPU record's command under ATEN_CPU_CAPABILITY avx2 (the records' pin),
default and avx512, and lessons 13's two runs at seeds 0 to 5 and lessons 01's (10
epochs) and 10's at seeds 0 to 3 under each: each band is the largest difference seen,
times about 1.5 (MEASURED gives each maximum). Between the avx2 and default kernels the
records' figures move as they did between the records' processor and an Intel Xeon
(97.49 % and 96.66 %, 1.55 and 1.59 x the mean). A training run's losses move little in
its first steps and up to a quarter late in the run; an accuracy on 359 test images moves
by whole images.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A figure as printed: digits with thousands' commas, a decimal part, an exponent, a percent.
NUMBER = re.compile(r"\d[\d,]*(?:\.\d*)?(?:[eE][+-]?\d+)?%?")
BYTES_AFTER = re.compile(r"^\s*(?:B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|bytes)\b")
CLAUSE_END = re.compile(r"(?:[,;:]\s|\()")  # the words a figure belongs to start after it

NOISE_FACTOR = 10.0  # a difference from a reference may grow to this times the record's


@dataclass(frozen=True)
class Kind:
    name: str  # what the figure is, in a failure message
    before: str  # a regular expression on the words before the figure, in its clause
    after: str = ""  # ...and on the words after it
    percent: bool | None = None  # True: only a figure printed with %; False: only without
    # Allowed |recorded - now| with other kernels: absolute, plus relative times the record.
    absolute: float = 0.0
    relative: float = 0.0
    here: float = 0.0  # allowed with the record's own kernels, beyond the last digit

    def matches(self, clause: str, after: str, figure: str) -> bool:
        if self.percent is not None and figure.endswith("%") != self.percent:
            return False
        return bool(re.search(self.before, clause) and re.search(self.after, after))


# The largest differences measured between kernels beyond the last printed digit (module
# docstring), per kind, with the lines that showed them; each band below is about 1.5 times.
MEASURED = {
    "a difference from a reference": "1.2 times (3.0e-07, 3.6e-07: lesson 12's ring)",
    "an expert's load, averaged over steps": "0.007 (1.227, 1.219: lesson 13, seed 1)",
    "the share of choices dropped, averaged over steps": "0.03 points (6.03%, 6.07%)",
    "the busiest expert's load at one step": "0.21 (1.31, 1.09: lesson 13, step 300)",
    "the share of choices dropped at one step": "3.7 points (1.0%, 4.8%: step 300)",
    "a loss": "23 % of it (0.1853, 0.1418: lesson 10's test loss, epoch 2)",
    "an accuracy": "1.94 points (83.57%, 85.52%: lesson 10, epoch 1)",
}

BANDED = (
    Kind("an expert's load, averaged over steps", r"busiest expert\s*$",
         r"^\s*x the mean on average", absolute=0.011),
    Kind("the share of choices dropped, averaged over steps", r"", r"^\s*of the choices dropped",
         percent=True, absolute=0.05),
    Kind("the busiest expert's load at one step", r"busiest expert\s*$", absolute=0.32),
    Kind("the share of choices dropped at one step", r"\bdropped\s*$", percent=True,
         absolute=5.5),
    Kind("a loss", r"\bloss\s*$", percent=False, relative=0.35),
    Kind("an accuracy", r"\baccuracy\s*$", percent=True, absolute=3.0, here=0.3),
)  # fmt: skip


def last_place(figure: str) -> float:
    """One unit in the figure's last printed digit: 0.0001 for 0.1305, 0.01 for 97.49%."""
    mantissa = figure.rstrip("%").lower().split("e")[0]
    digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(figure.rstrip("%").lower().split("e")[1]) if "e" in figure.lower() else 0
    return 10.0 ** (exponent - digits)


def value(figure: str) -> float:
    return float(figure.rstrip("%").replace(",", ""))


def kind_of(clause: str, after: str, figure: str) -> str:
    """Which kind a figure is: 'exact', 'noise', a BANDED kind's name, or 'decimal'."""
    mantissa = figure.rstrip("%").lower().split("e")[0]
    if "." not in mantissa and "e" not in figure.lower() or BYTES_AFTER.search(after):
        return "exact"
    if re.search(r"\bdifference\b", clause):
        return "noise"
    for kind in BANDED:
        if kind.matches(clause, after, figure):
            return kind.name
    return "decimal"


def figures(line: str) -> list[tuple[str, str]]:
    """Each figure of a line with its kind: [(figure, kind)]."""
    found = []
    for m in NUMBER.finditer(line):
        clause = CLAUSE_END.split(line[: m.start()])[-1]
        found.append((m.group(0), kind_of(clause, line[m.end() :], m.group(0))))
    return found


def disagreement(want: str, got: str, other_kernels: bool) -> str | None:
    """None where the recorded line `want` and today's `got` agree, else what differs: the
    words, or which figure, of what kind, by how much against what was allowed.
    `other_kernels`: `got` was printed by other CPU kernels than the record's."""
    if NUMBER.sub("#", want) != NUMBER.sub("#", got):
        return "the words differ"
    for (old, kind), (new, _) in zip(figures(want), figures(got), strict=True):
        if old == new:
            continue
        if kind == "exact":
            return f"{old} became {new}: a count, a step, a shape or a byte total, exact"
        a, b = value(old), value(new)
        if kind == "noise":
            if b <= NOISE_FACTOR * a:
                continue
            return (f"{old} became {new}: a difference from a reference, rounding noise that "
                    f"may grow to {NOISE_FACTOR:g} times the record's and no more")  # fmt: skip
        allowed = last_place(old) + 1e-3 * abs(a)
        band = next((k for k in BANDED if k.name == kind), None)
        if band and other_kernels:
            allowed = last_place(old) + band.absolute + band.relative * abs(a)
        elif band:
            allowed += band.here
        if abs(a - b) > allowed * (1 + 1e-9):
            where = "with other kernels" if other_kernels and kind != "decimal" else "here"
            return (f"{old} became {new}: {kind}, allowed {where} to differ by "
                    f"{allowed:.3g}, not {abs(a - b):.3g}")  # fmt: skip
    return None
