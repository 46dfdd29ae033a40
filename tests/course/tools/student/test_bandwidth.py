"""course.tools.student.bandwidth: python -m course bandwidth, the all_reduce bandwidth table
and record."""

from __future__ import annotations

import json

from course import REPO_ROOT, launch
from course.tools.student import bandwidth


def test_two_gloo_ranks_write_a_record(tmp_path):
    out = tmp_path / "bw.json"
    args = ["--backend", "gloo", "--nproc", "2", "--sizes", "65536", "4096"]
    args += ["--warmup", "1", "--iters", "2", "--out", str(out)]
    run = launch.python("-m", "course", "bandwidth", *args, timeout=120, cwd=REPO_ROOT)
    assert run.ok, run.failure()
    doc = json.loads(out.read_text())
    assert doc["kind"] == bandwidth.KIND
    assert [r["bytes"] for r in doc["rows"]] == [4096, 65536]  # sorted
    for row in doc["rows"]:
        assert row["time_us"] > 0
        assert abs(row["algbw_gb_s"] - row["bytes"] / (row["time_us"] * 1e-6) / 1e9) < 1e-9
        assert abs(row["busbw_gb_s"] - row["algbw_gb_s"]) < 1e-12  # 2 (n - 1) / n = 1 for n = 2
    p = doc["provenance"]
    assert (p["backend"], p["ranks"], p["device"]) == ("gloo", 2, "CPU")
    assert p["command"].startswith("python -m course bandwidth --backend gloo")
    assert "64 KiB" in run.output and "busbw" in run.output


def test_one_rank_is_a_one_line_error():
    run = launch.python("-m", "course", "bandwidth", "--nproc", "1", timeout=60, cwd=REPO_ROOT)
    lines = [line for line in run.output.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1 and "at least 2" in lines[0], run.describe()


def test_table_formats():
    doc = {"rows": [{"bytes": 1 << 20, "time_us": 500.0, "algbw_gb_s": 2.0, "busbw_gb_s": 3.0}]}
    assert "| 1 MiB | 500.0 | 2.000 | 3.000 |" in bandwidth.table(doc, markdown=True)
    assert bandwidth.table(doc).splitlines()[1].split() == ["1", "MiB", "500.0", "2.000", "3.000"]


def test_table_against_a_rated_limit():
    doc = {"rows": [{"bytes": 1 << 30, "time_us": 5.0, "algbw_gb_s": 300.0, "busbw_gb_s": 300.0}]}
    markdown = bandwidth.table(doc, markdown=True, limit_gb_s=450)
    assert "busbw / 450 GB/s" in markdown and "| 67% |" in markdown
    assert bandwidth.table(doc, limit_gb_s=450).splitlines()[1].split()[-1] == "67%"


def test_the_latency_bound_is_the_largest_size_within_twice_the_smallest_time():
    rows = [(4096, 30.0), (65536, 33.0), (1 << 20, 59.0), (1 << 24, 61.0), (1 << 26, 50.0)]
    doc = {"rows": [{"bytes": b, "time_us": t, "busbw_gb_s": b / t / 1e3} for b, t in
                    reversed(rows)]}  # any order  # fmt: skip
    # 16 MiB is past twice 30 us; 64 MiB, faster again (noise), comes after the break.
    got = bandwidth.figures(doc)
    assert (got["smallest_time"], got["latency_bound"]) == ("30 us", "1 MiB")
    doc["rows"][-1]["time_us"] = 10.0  # the smallest message: all but it are over 2 x 10
    assert bandwidth.figures(doc)["latency_bound"] == "4 KiB"


def test_the_peak_bus_bandwidth_is_the_largest_measured():
    rows = [(1 << 20, 1.5, 300.0), (1 << 30, 2.0, 323.4), (1 << 10, 0.004, 0.01)]
    doc = {"rows": [{"bytes": b, "time_us": t, "busbw_gb_s": bw} for b, t, bw in rows]}
    assert bandwidth.figures(doc)["peak_busbw"] == "323 GB/s"
    doc["rows"] = [dict(r, busbw_gb_s=r["busbw_gb_s"] / 250) for r in doc["rows"]]
    assert bandwidth.figures(doc)["peak_busbw"] == "1.29 GB/s"  # under 10: two decimals
