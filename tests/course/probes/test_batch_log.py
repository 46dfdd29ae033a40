"""course.probes.batch_log: the probe that records which samples each rank's DataLoader loads."""

import sys

from course import launch
from course.probes import batch_log

SCRIPT = """
import torch
from torch.utils.data import DataLoader, TensorDataset
data = TensorDataset(torch.arange(10))
gen = torch.Generator().manual_seed(0)
loader = DataLoader(data, batch_size=4, shuffle=True, generator=gen)
for epoch in range(2):
    for _ in loader:
        pass
for _ in DataLoader(TensorDataset(torch.arange(3)), batch_size=2):
    pass
"""


def test_every_pass_over_a_dataset_is_logged(tmp_path):
    logs = tmp_path / "batches"
    logs.mkdir()
    env = {batch_log.LOG_ENV: str(logs), "RANK": "1"}
    result = launch.run([sys.executable, "-c", SCRIPT], timeout=60, env=env, cwd=tmp_path)
    assert result.ok, result.describe()
    passes = batch_log.passes(logs, rank=1, length=10)
    assert len(passes) == 2 and all(sorted(p) == list(range(10)) for p in passes)
    assert passes[0] != passes[1], "the shuffle differs between the two epochs"
    assert batch_log.passes(logs, rank=1, length=3) == [[0, 1, 2]]
    assert batch_log.passes(logs, rank=0, length=10) == []
    # The first batch of each pass: its inputs' shape, once a pass (the last batch of 10
    # samples in 4s holds 2, and is not the one logged).
    assert batch_log.shapes(logs, rank=1, length=10) == [(4,), (4,)]
    assert batch_log.shapes(logs, rank=1, length=3) == [(2,)]
