"""course/launch/warm/protocol.py: which launches may start warm."""

from __future__ import annotations

import sys

import pytest

from course.launch.warm import protocol

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def test_a_gpu_box_starts_warm_only_what_cannot_reach_its_gpus():
    """Where a GPU is present, a launch whose processes see it starts cold (its zygote's
    imports must never be forked past the driver); one with CUDA_VISIBLE_DEVICES "" or -1
    (a mutant's grading, a CPU recording) starts warm, as everything does without a GPU.
    The switch and a child user turn warm starts off everywhere."""
    assert protocol.allowed({}, gpus_present=False)
    assert not protocol.allowed({}, gpus_present=True)
    assert not protocol.allowed({"CUDA_VISIBLE_DEVICES": "0"}, gpus_present=True)
    assert protocol.allowed({"CUDA_VISIBLE_DEVICES": ""}, gpus_present=True)
    assert protocol.allowed({"CUDA_VISIBLE_DEVICES": "-1"}, gpus_present=True)
    assert not protocol.allowed({protocol.SWITCH_ENV: "0"}, gpus_present=False)
    hidden_but_switched_off = {"CUDA_VISIBLE_DEVICES": "", protocol.SWITCH_ENV: "0"}
    assert not protocol.allowed(hidden_but_switched_off, gpus_present=True)
    assert not protocol.allowed({"COURSE_CHILD_USER": "runner"}, gpus_present=False)
