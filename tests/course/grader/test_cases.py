"""course.grader.cases: what a case script reports when the submission fails in spawned ranks."""

from __future__ import annotations

from pathlib import Path

from course.grader import case_ranks, cases

LESSON = Path("/course/lessons/05_collectives/collectives.py")

SPAWN_MESSAGE = f"""

-- Process 1 terminated with the following error:
Traceback (most recent call last):
  File "/venv/torch/multiprocessing/spawn.py", line 87, in _wrap
    fn(i, *args)
  File "/course/tests/lessons/cases/lesson_05.py", line 41, in _rank
    lesson.ring_all_reduce(tensor)
  File "{LESSON}", line 83, in ring_all_reduce
    raise NotImplementedError("TODO at 05_collectives/collectives.py:83 is not done yet")
NotImplementedError: TODO at 05_collectives/collectives.py:83 is not done yet


During handling of the above exception, another exception occurred:
Traceback (most recent call last):
  File "/elsewhere.py", line 1, in f
ValueError: not this one
"""

TIMEOUT_MESSAGE = """
-- Process 0 terminated with the following error:
Traceback (most recent call last):
  File "/venv/torch/distributed/distributed_c10d.py", line 2712, in recv
    pg.recv([tensor], src, tag).wait()
torch.distributed.DistBackendError: [../gloo/transport/tcp/pair.cc:534] Timed out waiting 45000ms
Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:672
frame #0: c10::Error::Error(...) + 0x98
"""


class ProcessRaisedException(Exception):
    pass


def test_a_ranks_exception_is_reported_in_one_line_with_the_lesson_line():
    got = cases._error(ProcessRaisedException(SPAWN_MESSAGE), LESSON)
    assert got == {
        "type": "NotImplementedError",
        "message": "on rank 1: TODO at 05_collectives/collectives.py:83 is not done yet",
        "where": "collectives.py:83",
    }


def test_a_ranks_timeout_keeps_its_words_and_drops_the_cpp_frames():
    got = cases._error(ProcessRaisedException(TIMEOUT_MESSAGE), LESSON)
    assert got["type"] == "DistBackendError" and got["where"] is None
    assert "Timed out waiting 45000ms" in got["message"] and "frame #0" not in got["message"]


def test_other_exceptions_keep_their_message_and_line():
    try:
        raise ValueError("plain")
    except ValueError as err:
        got = cases._error(err, Path(__file__))
    assert got["type"] == "ValueError" and got["message"] == "plain"
    assert got["where"].startswith(Path(__file__).name + ":")


def test_a_timeout_on_any_rank_is_reported_when_its_peer_failed_first(tmp_path):
    """mp.spawn reports one rank's error; when the rank that timed out left first, its
    peer fails with "connection closed" and may be the one reported. Each rank's own
    error (written by _noting_errors) shows the timeout."""
    import pytest

    with pytest.raises(RuntimeError):
        case_ranks._noting_errors(1, _raises, str(tmp_path), "Timed out waiting 10000ms for recv")
    assert "Timed out" in (tmp_path / "rank1.txt").read_text()
    peer = RuntimeError("Connection closed by peer [127.0.0.1]:1234")
    assert case_ranks.timeout_among(peer, tmp_path).startswith("rank 1: RuntimeError: Timed out")
    assert case_ranks.timeout_among(RuntimeError("Timed out waiting"), tmp_path) == ""
    assert case_ranks.timeout_among(peer, tmp_path / "none") is None


def _raises(rank: int, message: str) -> None:
    raise RuntimeError(message)


def test_a_rank_that_aborts_in_cpp_is_reported_with_its_own_line(tmp_path):
    """mp.spawn says only "terminated with signal SIGABRT"; the rank's stderr has gloo's
    reason, and a size mismatch gets its cause."""
    err = RuntimeError("process 1 terminated with signal SIGABRT")
    assert case_ranks.native_error(err, tmp_path) is None  # nothing written: nothing claimed
    (tmp_path / "rank1.err").write_text(
        "some warning\nterminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at pair.cc:464] op.preamble.length <= op.nbytes. 8 vs 4.\n"
    )
    text = case_ranks.native_error(err, tmp_path)
    assert text.startswith("rank 1 died of SIGABRT; its last error line: what():")
    assert "8 vs 4" in text and "different sizes" in text
    (tmp_path / "rank1.err").write_text("  what():  std::bad_alloc\n")
    other = case_ranks.native_error(err, tmp_path)
    assert "bad_alloc" in other and "different sizes" not in other
    assert case_ranks.native_error(RuntimeError("process 1 exited with code 1"), tmp_path) is None


def test_a_rank_killed_by_a_signal_is_reported_before_its_peers_symptom():
    """gloo aborts the rank that got a message too large for its buffer; its peer raises
    "Connection reset by peer". When both have ended by the grader's next look, the report
    names the aborted rank, whatever its number."""
    assert case_ranks._cause([1, -6]) == 1  # the peer raised, rank 1 died of SIGABRT
    assert case_ranks._cause([-6, 1]) == 0
    assert case_ranks._cause([1, None]) == 0  # one failure so far: that one
    assert case_ranks._cause([0, 1, 1]) == 1  # several raised: the lowest rank, as mp.spawn does
    assert case_ranks._cause([None, 0]) is None and case_ranks._cause([0, 0]) is None


def test_a_gradient_that_never_arrived_is_named_not_a_crash(tmp_path):
    """A case that returns a gradient which is None (the submission detached the tensor, or
    never used it) fails that case in one line naming the tensor; the child goes on."""
    import json

    import torch

    lesson = tmp_path / "lesson.py"
    lesson.write_text("x = 1\n")
    out = tmp_path / "out"
    runner = cases.Cases([str(lesson), str(out)])

    @runner.case
    def grads(_lesson):
        return cases.Tensors({"grad/w": None, "grad/b": torch.ones(2)})

    @runner.case
    def after(_lesson):
        return {"ran": True}

    runner.run()
    results = json.loads((out / cases.RESULTS).read_text())["cases"]
    assert results["after"] == {"value": {"ran": True}}
    error = results["grads"]["error"]
    assert "grad/w" in error["message"] and "grad/b" not in error["message"], error
    assert "None" in error["message"] and error["type"] == "NoGradient"
