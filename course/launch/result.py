"""What a launch ended as: RunResult, the deadlines' scale, and how a hang reads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

# A hang is a rank waiting in a collective that another rank never reaches.
# The process-group timeout (course.ranks.process_group_timeout) is set to half
# the deadline of every launch here, so PyTorch's own error, which names the
# operation, arrives before the deadline kills the group.
PG_TIMEOUT_SHARE = 0.5
TIMEOUT_SIGNS = ("Timed out waiting", "Watchdog caught collective operation timeout", "timed out")
# What a hang's report says: what was seen (the grader cannot know why a rank never came),
# and where to look, by whether the ranks printed where they stopped.
HANG_CAUSE = (
    "seen: the job waited until its timeout, so a rank waited in a collective or a "
    "send/receive that another rank never reached"
)
HANG_WHERE = "each rank's last lines above show where it stopped"
HANG_NO_LINES = (
    "no rank's lines were kept: run it again with TORCH_DISTRIBUTED_DEBUG=DETAIL, or under "
    "`python -m course spy`, to see where each rank waits"
)


def timeout_scale() -> float:
    """Slow machines can stretch every deadline with COURSE_TIMEOUT_SCALE=2."""
    try:
        return max(float(os.environ.get("COURSE_TIMEOUT_SCALE", "1")), 0.1)
    except ValueError:
        return 1.0


@dataclass
class RunResult:
    args: list[str]
    returncode: int | None
    output: str
    timed_out: bool
    seconds: float
    timeout: float
    pgid: int
    rank_logs: dict[str, str] = field(default_factory=dict)

    reported: bool = False
    started: float = 0.0  # time.time() at the start: to compare with what the child logged
    ready: float | None = None  # seconds until the child had imported torch (`after_import`)
    after_import: float | None = None  # the deadline after that, scaled

    @classmethod
    def not_launched(cls, args, timeout: float, reason: str) -> RunResult:
        """A launch refused before it started (its Cancel says why)."""
        output = f"course: not launched: {reason}\n"
        return cls([str(a) for a in args], None, output, False, 0.0, timeout, 0)

    @property
    def killed_after_import(self) -> bool:
        """Timed out by the `after_import` deadline (not by the whole run's)."""
        if not self.timed_out or self.ready is None or self.after_import is None:
            return False
        return self.ready + self.after_import < self.timeout

    @property
    def after_ready(self) -> float | None:
        """Seconds the child ran after importing torch, when `after_import` measured it."""
        return None if self.ready is None else max(0.0, self.seconds - self.ready)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def failure(self, lines: int = 12) -> str:
        """describe() the first time; after that one line, so that several tests
        sharing one failed launch show its story once."""
        if self.reported:
            return "the shared launch failed: its output is in the first failing test's message"
        self.reported = True
        return self.describe(lines)

    def describe(self, lines: int = 12) -> str:
        """A short account of what happened, for a failing test's message."""
        command = " ".join(Path(a).name if os.sep in a else a for a in self.args)
        if self.timed_out and self.killed_after_import:
            head = (
                f"`{command}` was still running {self.after_import:.0f} s after it imported "
                f"torch ({self.ready:.1f} s after its start), and was killed"
            )
        elif self.timed_out:
            head = f"`{command}` did not finish within {self.timeout:.0f} s and was killed"
        else:
            head = f"`{command}` exited with code {self.returncode} after {self.seconds:.1f} s"
        parts = [head]
        for name, text in [("output", self.output), *sorted(self.rank_logs.items())]:
            tail = [line for line in text.rstrip().splitlines() if line.strip()][-lines:]
            if tail:
                parts.append(f"--- last lines of {name} ---")
                parts.extend(tail)
        if self.timed_out or self.collective_timed_out:
            where = HANG_WHERE if self.rank_logs else HANG_NO_LINES
            parts.append(f"{HANG_CAUSE}; {where}.")
        return "\n".join(parts)

    @property
    def collective_timed_out(self) -> bool:
        """PyTorch's own process-group timeout fired in some rank (gloo or NCCL)."""
        text = "\n".join([self.output, *self.rank_logs.values()])
        return any(sign in text for sign in TIMEOUT_SIGNS)
