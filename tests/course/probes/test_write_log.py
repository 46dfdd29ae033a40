"""course/probes/write_log.py: how each file was put in place, seen from inside a process.

The child is armed the way the grader arms a lesson's run (COURSE_WRITE_LOG, with
course.launch putting the probes on its PYTHONPATH); it writes a checkpoint four ways.
"""

from __future__ import annotations

import sys

from course import launch
from course.probes import write_log
from course.probes.write_log import WRITE_LOG_ENV

SCRIPT = """
import os, sys, torch
from course import checkpoint
out = sys.argv[1]
checkpoint.save({"epoch": 1}, f"{out}/atomic.pt")     # a temporary file, renamed onto
checkpoint.save({"epoch": 2}, f"{out}/atomic.pt")
torch.save({"epoch": 1}, f"{out}/inplace.pt")          # torch.save straight onto the name
torch.save({"epoch": 2}, f"{out}/inplace.pt")
with open(f"{out}/opened.pt", "wb") as f:              # open() over the old file
    torch.save({"epoch": 1}, f)
with open(f"{out}/opened.pt", "wb") as f:
    torch.save({"epoch": 2}, f)
torch.save({"epoch": 1}, f"{out}/removed.pt")
os.remove(f"{out}/removed.pt")                          # gone, then written anew
torch.save({"epoch": 2}, f"{out}/removed.pt")
"""


def test_each_way_of_putting_a_file_in_place_is_told_apart(tmp_path):
    out, log = tmp_path / "out", tmp_path / "writes.log"
    out.mkdir()
    script = tmp_path / "writer.py"
    script.write_text(SCRIPT)
    result = launch.run(
        [sys.executable, str(script), str(out)], timeout=60, env={WRITE_LOG_ENV: str(log)}
    )
    assert result.ok, result.describe()
    hows: dict[str, list[str]] = {}
    for rank, how, name in write_log.placements(log, out):
        assert rank == "-1", f"no process group, no $RANK: rank -1 expected, got {rank}"
        hows.setdefault(name, []).append(how)
    assert hows["atomic.pt"] == ["onto", "onto"], hows
    assert hows["inplace.pt"] == ["new", "over"], hows
    assert hows["opened.pt"] == ["new", "over"], hows
    assert hows["removed.pt"] == ["new", "removed", "new"], hows
    temporary = [n for n in hows if n.endswith(".tmp")]
    assert len(temporary) == 2 and all(hows[n] == ["new"] for n in temporary), hows
    assert write_log.not_replaced_atomically(log, out, "atomic.pt", times=2) == ""
    assert write_log.not_replaced_atomically(log, out, "atomic.pt", times=3) != ""
    for name in ("inplace.pt", "opened.pt", "removed.pt"):
        problem = write_log.not_replaced_atomically(log, out, name, times=2)
        assert name in problem and ("'over'" in problem or "'removed'" in problem), problem
    # the file names only, in order, as test_03/test_04 read them (no removal among them)
    assert [n for _, n in write_log.events(log, out)].count("removed.pt") == 2
