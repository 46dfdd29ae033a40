"""course.ranks: each rank's share of the CPU."""

from __future__ import annotations

import os

from course.ranks import cpu_share


def test_cpu_share_splits_the_cores_between_the_ranks(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert cpu_share(1) == cores
    assert cpu_share(2) == max(1, cores // 2)
    assert cpu_share(10 * cores) == 1  # never zero threads


def test_omp_num_threads_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_share(2) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert cpu_share(1) == len(os.sched_getaffinity(0))
