"""Grades lesson 05: collectives and a ring all-reduce by hand (lessons/05_collectives/).

The ring is called in gloo ranks that a child process starts (tests/lessons/cases/lesson_05.py),
never in this process: 2, 3 and 4 ranks, on tensors of 1, 5, 1000 and 4099 values
(fewer values than ranks, chunks of unequal length), then 2 ranks on 4M values (16 MB).
A ring in which every rank sends before it receives, with blocking sends, waits
forever at any size (gloo's send waits for the matching receive): it fails when the
process-group timeout fires, with the likely cause. The inputs are integer-valued floats, so every
order of summation gives the same bits and the test compares exactly, with no
tolerance; it computes the expected sums itself. The case script also logs what
ring_all_reduce calls from torch.distributed: a ring uses no collective, sends only
to one neighbour, receives only from the other, and sends at most 2(world - 1)
chunks of 1/world of the tensor, so dist.all_reduce inside it, or every rank sending
its whole tensor to every other, gets no points.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from course import registry
from course.grader.case_runs import CaseFailed, run_lesson_cases
from course.grader.launches import needed

LESSON = registry.get("05")
CASES = Path(__file__).with_name("cases") / "lesson_05.py"
SIZES = (1, 5, 1000, 4099)
LARGE = 1 << 22


def ring_input(world: int, size: int, rank: int) -> torch.Tensor:
    """The case script's inputs, made again here (a copy of its ring_input)."""
    gen = torch.Generator().manual_seed(1000 * world + 7 * size + rank)
    return torch.randint(-1000, 1000, (size,), generator=gen).float()


_cases: dict = {}


CASE_NAMES = ("ring_2", "ring_3", "ring_4", "ring_large", "ring_nccl")


@pytest.fixture
def cases(impl, tmp_path_factory, request):
    """The case script's results: every case the selected tests need, run in one child."""
    if str(impl) not in _cases:
        folder = tmp_path_factory.mktemp("cases")
        only = needed(request, CASE_NAMES)
        _cases[str(impl)] = run_lesson_cases(impl, LESSON, CASES, folder, only=only)
    return _cases[str(impl)]


DEADLOCK = (
    "ring_all_reduce calls the blocking dist.send: when every rank sends first and waits "
    "for its neighbour, which is sending too, none receives. Start the send with "
    "dist.isend, then receive, then wait for the send"
)
STUCK = (
    "Some rank waited for a message that never came: check that every receive has a "
    "matching send on the neighbour (same step, same size), and that each rank runs as "
    "many steps as the others"
)


def calls_blocking_send(path: Path) -> bool:
    """Whether ring_all_reduce's source calls dist.send (read here, never imported)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "ring_all_reduce":
            return any(
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "send"
                for call in ast.walk(node)
            )
    return False


def check_ring(cases, case: str, world: int, sizes) -> None:
    try:
        got, message = cases.results.tensors(case), None
    except CaseFailed as err:
        hung = "timed out" in str(err).lower()
        cause = DEADLOCK if calls_blocking_send(cases.lesson_file) else STUCK
        message = f"the {world}-rank ring did not finish: {err}\n{cause}" if hung else str(err)
    if message is not None:  # outside `except`: no chained traceback
        pytest.fail(message, pytrace=False)
    for size in sizes:
        want = sum(ring_input(world, size, rank) for rank in range(world))
        for rank in range(world):
            tensor = got.get(f"{size}/{rank}")
            assert tensor is not None and tensor.shape == want.shape, (
                f"{world} ranks, {size} values: rank {rank} returned {tensor!r}"
            )
            wrong = (tensor != want).nonzero().flatten().tolist()
            assert not wrong, (
                f"{world} ranks, {size} values: on rank {rank}, {len(wrong)} of {size} "
                f"values differ from the sum over the ranks (first at index {wrong[0]}: "
                f"{tensor[wrong[0]].item():g} instead of {want[wrong[0]].item():g}). Likely "
                "cause: a chunk index off by one step, a chunk added twice or never, or "
                "the all-gather writing into the wrong chunk"
            )
    check_ring_messages(cases.results.value(case).get("ops", {}), world, sizes)


POINT_TO_POINT = {"send": "out", "isend": "out", "recv": "in", "irecv": "in"}


def check_ring_messages(ops: dict, world: int, sizes) -> None:
    """The sums came from a ring: inside ring_all_reduce each rank calls no collective,
    sends only to one neighbour and receives only from the other, and sends at most the
    ring's 2(world - 1) chunks of ceil(size / world) values (the case script logs the calls)."""
    for size in sizes:
        bound = 2 * (world - 1) * -(-size // world)
        for rank in range(world):
            log = ops.get(f"{size}/{rank}")
            assert log is not None, f"{world} ranks, {size} values: rank {rank} logged no calls"
            where = f"{world} ranks, {size} values: rank {rank}"
            library = sorted({name for name, _, _ in log if name not in POINT_TO_POINT})
            assert not library, (
                f"{where} called dist.{library[0]} inside ring_all_reduce. The sums are right, "
                "but the exercise is the ring itself: point-to-point messages only "
                "(dist.isend, dist.irecv, dist.send, dist.recv) between neighbours"
            )
            out = {peer for name, peer, _ in log if POINT_TO_POINT[name] == "out"}
            into = {peer for name, peer, _ in log if POINT_TO_POINT[name] == "in"}
            right, left = (rank + 1) % world, (rank - 1) % world
            ring = (out, into) in (({right}, {left}), ({left}, {right}))
            if size >= world or out or into:
                assert ring, (
                    f"{where} sent to ranks {sorted(out, key=str)} and received from ranks "
                    f"{sorted(into, key=str)}; around a ring, a rank sends to one neighbour "
                    f"only ({right} or {left}) and receives from the other"
                )
            sent = sum(n for name, _, n in log if POINT_TO_POINT[name] == "out")
            assert sent <= bound, (
                f"{where} sent {sent} values; a ring sends at most 2 x (world - 1) chunks of "
                f"{-(-size // world)}, {bound} values. Likely cause: whole tensors sent "
                "instead of 1/world chunks"
            )


@pytest.mark.core
@pytest.mark.points(3)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.needs("ring_{world}")
def test_ring_all_reduce_sums_over_every_rank(cases, world):
    """Every rank ends with the exact sum, for 2, 3 and 4 ranks and uneven lengths."""
    check_ring(cases, f"ring_{world}", world, SIZES)


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.needs("ring_large")
def test_ring_all_reduce_sums_a_large_tensor(cases):
    """16 MB over 2 ranks, summed exactly."""
    check_ring(cases, "ring_large", 2, (LARGE,))


@pytest.mark.gpus(2)
@pytest.mark.points(2)
@pytest.mark.needs("ring_nccl")
def test_ring_all_reduce_on_two_gpus(cases):
    """The same sums with nccl, on two GPUs."""
    check_ring(cases, "ring_nccl", 2, SIZES)


@pytest.mark.points(1)
def test_the_tour_prints_every_collective(impl, tmp_path, launcher):
    """`--nproc 2` runs the tour: one line per collective, printed by rank 0 alone, then
    the ring on --size values (7 here, not the default) checked against dist.all_reduce."""
    args = ["--nproc", "2", "--backend", "gloo", "--size", "7"]
    result = launcher.python(LESSON.path(impl), *args, timeout=90, cwd=tmp_path)
    assert result.ok, result.failure()
    for name in ("broadcast", "all_reduce", "reduce(dst=0)", "all_gather", "reduce_scatter"):
        lines = [line for line in result.output.splitlines() if line.startswith(name)]
        assert len(lines) == 1, f"expected one line for {name}, got {lines}\n{result.output}"
    assert "your ring (7 values)" in result.output, (
        f"--size 7: expected the ring's line to say 7 values\n{result.output[-1500:]}"
    )
    assert "your ring equals dist.all_reduce on rank 0: True" in result.output, result.output


@pytest.mark.points(1)
def test_one_rank_is_refused_in_one_line(impl, tmp_path, launcher):
    """`--nproc 1` is refused in one line: a collective needs at least 2 ranks."""
    args = ["--nproc", "1", "--backend", "gloo"]
    result = launcher.python(LESSON.path(impl), *args, timeout=60, cwd=tmp_path)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "at least 2" in lines[0], (
        result.describe()
    )
