"""`python -m course clock`: the step clock's data-wait fraction, on scripts whose waits
are known (course/tools/student/clock.py, course/probes/step_clock.py)."""

from __future__ import annotations

import re
import sys

from course import launch

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
    return launch.run([sys.executable, "-m", "course", "clock", str(script)], timeout=60)


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
    result = launch.run(
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


COMM_SCRIPT = """
import sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, store, mode):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    big = torch.ones(1 << 22)  # 16 MB
    for step in range(12):
        model(torch.ones(8, 4)).sum().backward()
        if mode == "all_reduce":
            dist.all_reduce(big)  # gloo's work: the collective the profile must find
        time.sleep(0.01)  # the rest of the step
        optimizer.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=tuple(sys.argv[1:]), nprocs=2)
"""


def test_profiled_steps_give_the_time_in_collectives(tmp_path):
    """COURSE_STEP_PROFILE=4:8 profiles steps 5-8 of two gloo ranks: with an all-reduce of
    16 MB in every step, some but not all of a step is in collectives (the step also
    sleeps 10 ms); without one, none."""
    from course.probes import step_clock

    script = tmp_path / "comm.py"
    script.write_text(COMM_SCRIPT)
    seen = {}
    for mode in ("all_reduce", "none"):
        folder = tmp_path / mode
        folder.mkdir()
        env = {step_clock.LOG_ENV: str(folder), step_clock.EVERY_ENV: "4"}
        env[step_clock.PROFILE_ENV] = "4:8"
        args = [sys.executable, str(script), str(tmp_path / f"store-{mode}"), mode]
        result = launch.run(args, timeout=60, env=env, cwd=tmp_path)
        assert result.ok, result.describe()
        (_, t4), (_, t8) = [p for p in step_clock.read(folder) if p[0] in (4, 8)]
        window = step_clock.profiled(folder)
        assert window is not None, f"COURSE_STEP_PROFILE=4:8, yet no profile in {folder}"
        # The profiled wall time lies inside the clock's window 4-8 (which also holds the
        # profiler's export): the share is taken against the profiled steps themselves.
        assert 0.01 < window[1] <= (t8 - t4) / 4, (window, (t8 - t4) / 4)
        seen[mode] = window
    comm, step = seen["all_reduce"]
    # Measured idle: 14-16 ms of a 27-28 ms step. The 10 ms sleep is never a collective;
    # a 16 MB all-reduce over two processes takes milliseconds, not microseconds.
    said = f"{comm} s of a {step:.4f} s step in collectives (expected 1 ms to the step - 10 ms)"
    assert comm is not None and 0.001 < comm < step - 0.009, said
    assert seen["none"][0] == 0.0, f"no collective, yet {seen['none'][0]} s in them"


def test_merged_seconds_count_overlapping_collectives_once():
    from course.probes.step_clock import is_collective, merged_seconds

    spans = [(0, 10), (5, 20), (30, 40), (35, 38)]  # microseconds
    assert merged_seconds(spans) == (20 + 10) / 1e6
    assert is_collective({"cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL"})
    assert not is_collective({"cat": "kernel", "name": "sm90_xmma_gemm_f32f32"})
    assert is_collective({"cat": "user_annotation", "name": "gloo:all_reduce"})
    assert not is_collective({"cat": "cpu_op", "name": "aten::mm"})
