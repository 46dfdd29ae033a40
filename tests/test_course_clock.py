"""`python -m course clock`: the step clock's data-wait fraction, on scripts whose waits
are known (course/tools/clock.py, course/probes/step_clock.py)."""

from __future__ import annotations

import re
import sys

from course import procs

SCRIPT = """
import time, torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    {before}  # "waiting for the batch": between the step and the next forward
    loss = model(torch.ones(8, 4)).sum()
    {during}  # "the GPU computing": inside the step
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained")
"""


def clock(tmp_path, before: float, during: float):
    script = tmp_path / f"train_{before}_{during}.py"
    # No sleep(0): that yields the CPU, a wait of its own on a busy machine.
    sleeps = {
        k: f"time.sleep({v})" if v else "pass"
        for k, v in dict(before=before, during=during).items()
    }
    script.write_text(SCRIPT.format(**sleeps))
    return procs.run([sys.executable, "-m", "course", "clock", str(script)], timeout=60)


def test_clock_reports_the_data_wait_of_a_script(tmp_path):
    """30 ms of waiting before each forward and nothing else: a data wait near 100 %; the
    same 30 ms inside the step instead: near 0 %. Sleeps, so load moves the figures little
    (under load, with 10 ms, the second read 21 %); the bounds (>= 80 %, <= 20 %) leave
    the few milliseconds a busy machine adds to a step a tenth of the step."""
    starved, fed = clock(tmp_path, 0.03, 0), clock(tmp_path, 0, 0.03)
    shares = []
    for result in (starved, fed):
        assert result.ok and "trained" in result.output, result.failure()
        found = re.search(r"clock: 40 steps; .*\nclock: data wait (\d+)%", result.output)
        assert found, f"expected the steps and the data wait:\n{result.output}"
        shares.append(int(found.group(1)))
    assert shares[0] >= 80 and shares[1] <= 20, f"data waits {shares} (expected >= 80, <= 20)"


def test_clock_of_a_missing_script_is_one_line(tmp_path):
    result = procs.run(
        [sys.executable, "-m", "course", "clock", str(tmp_path / "nope.py")], timeout=60
    )
    assert result.returncode == 2, result.describe()
    assert result.output.strip().count("\n") == 0 and "nope.py: not found" in result.output


def test_typical_wait_is_the_median_window_and_data_wait_the_mean(tmp_path):
    """Windows of 5 steps, each waiting 10 ms a step, but one (a loader's workers starting
    again at an epoch) waiting 500 ms once: the mean per step moves, the median does not.
    Both read from the end of the second window on (the first: start-up)."""
    from course.probes import step_clock

    waits = [1.0, 0.05, 0.05, 0.55, 0.05, 0.05, 0.05]  # seconds a window
    lines = [f"{5 * (i + 1)} {float(i)} {wait}" for i, wait in enumerate(waits)]
    (tmp_path / "rank0.1.txt").write_text("\n".join(lines) + "\n")
    typical = step_clock.typical_wait(tmp_path)
    mean = step_clock.data_wait(tmp_path, per_step=True)
    assert typical is not None and abs(typical - 0.01) < 1e-9, typical
    assert mean is not None and abs(mean - 0.75 / 25) < 1e-9, mean
    assert step_clock.typical_wait(tmp_path, rank=1) is None, "rank 1 wrote nothing"
