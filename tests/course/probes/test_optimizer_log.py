"""course/probes/optimizer_log.py: the classes of the optimizers that step, seen from inside
a process that knows nothing of the probe (armed the way the grader arms it)."""

from __future__ import annotations

import sys

from course import launch
from course.probes import optimizer_log

SCRIPT = """
import torch
w = torch.nn.Parameter(torch.ones(3))
class Wrapper(torch.optim.Optimizer):  # a lesson's own optimizer, stepping an inner one
    def __init__(self, params):
        super().__init__(params, {})
        self.inner = torch.optim.AdamW(self.param_groups[0]["params"], lr=0.1)
    def step(self, closure=None):
        self.inner.step()
for opt in (torch.optim.SGD([w], lr=0.1), Wrapper([w])):
    for _ in range(2):
        w.grad = torch.ones(3)
        opt.step()
"""


def test_each_stepping_class_is_noted_once_inner_ones_too(tmp_path):
    result = launch.run([sys.executable, "-c", SCRIPT], timeout=60,
                        env={optimizer_log.LOG_ENV: str(tmp_path)})  # fmt: skip
    assert result.ok, result.describe()
    (classes,) = optimizer_log.read(tmp_path).values()
    assert classes == ["torch.optim.sgd.SGD", "torch.optim.adamw.AdamW", "__main__.Wrapper"]
