"""Commands that a page gives the reader to type, run here as the page prints them.

Lesson 10's "one file for inference": a DCP checkpoint folder, converted by PyTorch's own
converter to one torch.save file, loaded into a plain TinyLM. The command and the Python
block are read from the page, so the page cannot drift from what was tested.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import torch

from course import REPO_ROOT, models

PAGE = REPO_ROOT / "docs" / "lessons" / "10_sharding.md"
FSDP2 = REPO_ROOT / "solutions" / "10_sharding" / "fsdp2.py"


def page_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def test_lesson_10_dcp_checkpoint_converts_to_one_file_a_plain_model_loads(tmp_path, monkeypatch):
    command = next(
        line for block in page_blocks("bash") for line in block.splitlines()
        if "checkpoint.format_utils dcp_to_torch" in line
    )  # fmt: skip
    snippet = next(block for block in page_blocks("python") if '"model.pt"' in block)
    steps = "4"  # the page's 60 steps, cut to 4: the same folder layout, in seconds
    command = re.sub(r"step-\d+", f"step-{int(steps):06d}", command)
    run = subprocess.run(  # the lesson's own save, on one rank: a few seconds
        [sys.executable, str(FSDP2), "--nproc", "1", "--backend", "gloo", "--steps", steps,
         "--checkpoint", "ckpt"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    words = shlex.split(command)
    assert words[:2] == ["python", "-m"], command
    converted = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, capture_output=True,
                               text=True, timeout=120)  # fmt: skip
    assert converted.returncode == 0 and (tmp_path / "model.pt").is_file(), (
        f"{command}: exit {converted.returncode}\n{converted.stdout}{converted.stderr}"
    )
    vocab = int(re.search(r"^VOCAB, BATCH = (\d+)", FSDP2.read_text(), re.M)[1])
    scope = {"torch": torch, "models": models, "VOCAB": vocab}
    monkeypatch.chdir(tmp_path)  # the snippet opens model.pt where the command wrote it
    exec(compile(snippet, "10_sharding.md", "exec"), scope)
    model, state = scope["model"], scope["state"]
    assert int(state["step"]) == int(steps)
    for name, value in model.state_dict().items():
        assert torch.equal(value, state["model"][name]), f"{name} was not loaded"
    rerun = subprocess.run(  # the same command again: it says it has nothing to train
        [sys.executable, str(FSDP2), "--nproc", "1", "--backend", "gloo", "--steps", steps,
         "--checkpoint", "ckpt"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert rerun.returncode == 0 and "nothing to train" in rerun.stdout, rerun.stdout
