"""course.tools.student.planning (python -m course plan), plan_here and planner: predictions on
this machine, a shape timed, the presets ranked, a mesh checked at a fake world, and bad
input refused in one line."""

from __future__ import annotations

import json

import pytest

from course import REPO_ROOT, launch
from course.tools.student import plan_here, planning

BANDWIDTH = "docs/results/05_allreduce/cpu-gloo.json"


def _plan(*args: str, timeout: float = 120):
    return launch.python("-m", "course", "plan", *args, timeout=timeout, cwd=REPO_ROOT)


def _one_line_error(run, *words: str) -> None:
    lines = [line for line in run.output.splitlines() if line.strip()]
    assert run.returncode == 2 and lines, run.describe()
    assert lines[-1].startswith("python -m course plan: error:"), run.describe()
    assert "Traceback" not in run.output and all(w in lines[-1] for w in words), lines[-1]


def test_predict_prices_every_shape_and_writes_a_record(tmp_path):
    out = tmp_path / "plan.json"
    # gloo: every shape runs here, whatever GPUs the machine has (the nccl case is below)
    run = _plan("--predict", "--impl", "solutions", "--bandwidth", BANDWIDTH, "--dim", "32",
                "--seq", "8", "--backend", "gloo", "--out", str(out))  # fmt: skip
    assert run.ok, run.describe()
    doc = json.loads(out.read_text())
    assert doc["kind"] == planning.KIND and doc["model"]["dim"] == 32
    rows = {r["lesson"]: r for r in doc["rows"]}
    assert list(rows) == list(planning.SHAPES)
    for row in rows.values():
        p = row["predicted"]
        assert p["compute"] > 0 and row["flops"] > 0 and "measured" not in row
        assert abs(p["total"] - (p["busy"] + p["bubble"] + p["exposed"])) < 1e-12
    assert rows["01"]["predicted"]["total"] == rows["01"]["predicted"]["compute"]
    assert rows["03"]["predicted"]["dp"] > 0 and rows["03"]["predicted"]["bubble"] == 0
    assert rows["11"]["predicted"]["tp"] > 0 and rows["11"]["predicted"]["bubble"] > 0
    assert doc["provenance"]["bandwidth"] == BANDWIDTH
    assert run.output.count("predicted") == len(planning.SHAPES)


@pytest.mark.gpus(1)
def test_on_gpus_a_shape_that_needs_more_is_skipped_and_says_so(tmp_path):
    """nccl, one rank a GPU: the shapes this machine has GPUs for are priced, the others are
    skipped with the count they need, and carry no prediction."""
    from course.runtime import visible_gpus

    out = tmp_path / "plan.json"
    run = _plan("--predict", "--impl", "solutions", "--dim", "32", "--seq", "8",
                "--backend", "nccl", "--out", str(out))  # fmt: skip
    assert run.ok, run.describe()
    rows = json.loads(out.read_text())["rows"]
    gpus = visible_gpus()
    for row in rows:
        fits = row["world"] <= gpus
        assert ("predicted" in row) == fits and ("skipped" in row) != fits, row
        if not fits:
            assert f"needs {row['world']} GPUs; this machine has {gpus}" == row["skipped"]
    assert any("predicted" in row for row in rows), rows  # lesson 01's one rank, at least


def test_measure_times_a_pipeline_shape():
    model = {"vocab": 32, "dim": 16, "depth": 2, "seq": 4}
    median, fastest, slowest = plan_here.measure("gloo", (2, 1, 1, 2), 3, model, timeout=120)
    assert 0 < fastest <= median <= slowest


def test_the_starter_is_refused_in_one_line():
    _one_line_error(_plan("--predict", "--bandwidth", BANDWIDTH), "TODO", "--impl solutions")


def test_the_planner_ranks_the_meshes_that_fit():
    """Fastest first, each mesh's whole peak plus the stated headroom within the GPU's 80
    GB; on 64 A100s nothing fits Llama 3.1 8B in float32 at 512 sequences of 8192."""
    from course.tools.student import planner

    run = _plan("--model", "llama-8b", "--gpus", "256", "--gpu", "h100-80gb", "--top", "4")
    assert run.ok, run.describe()
    lines = run.output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    rows = [line.split() for line in lines[head + 1 : head + 5]]
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    steps = [float(r[6]) for r in rows]
    most = (80 - planner.HEADROOM_GB) / (1 + planner.HEADROOM_SHARE)
    assert steps == sorted(steps) and all(float(r[5]) <= most for r in rows), rows
    assert all(int(r[1]) * int(r[2]) * int(r[3]) == 256 for r in rows)
    assert "arXiv:2407.21783" in run.output  # the preset's source
    assert f"GB + {planner.HEADROOM_SHARE:.0%} + {planner.HEADROOM_GB} GB of headroom" in run.output
    _one_line_error(_plan("--model", "llama-8b", "--gpus", "64", "--gpu", "a100-80gb"),
                    "no mesh of 64 GPUs fits llama-8b in 80 GB")  # fmt: skip


def test_check_counts_what_it_predicts_at_a_fake_world():
    run = _plan("--model", "course-14", "--gpus", "64", "--mesh", "2", "8", "4", "2",
                "--check", "1", "--rank", "45")  # fmt: skip
    assert run.ok, run.describe()
    assert "rank 45 of 64: (pp 2, dp 8, tp 4), 2 micro-batches; its stage 1" in run.output
    counted = [line for line in run.output.splitlines() if line.startswith("  ") and "," in line]
    keys = {line.split()[0] for line in counted}
    assert {"params", "activations", "dp.all_gather", "pp.send", "tp.all_reduce"} <= keys
    assert "differs" not in run.output


def test_bad_input_is_one_line():
    _one_line_error(_plan("--model", "llama-8b", "--gpus", "256", "--mesh", "2", "64", "4"),
                    "pp x dp x tp = 2 x 64 x 4 = 512", "256")  # fmt: skip
    _one_line_error(_plan("--model", "llama-8b", "--gpus", "24", "--mesh", "1", "8", "3"),
                    "does not split over 3")  # fmt: skip
    _one_line_error(_plan("--model", "nope"), "not a preset")
    _one_line_error(_plan("--model", "course-14", "--gpus", "3"), "no mesh of 3 GPUs")


def test_the_planner_is_scored_by_its_error_and_its_ranking():
    """score(): the largest |predicted / measured - 1| and Kendall's tau over the measured
    shapes (skipped ones aside): one swapped pair of three gives tau 1/3."""
    from course.tools.student import planning

    def row(predicted, measured):
        return {"predicted": {"total": predicted}, "measured": measured}

    rows = [row(1.0, 2.0), row(2.0, 3.0), row(3.0, 2.5), {"skipped": "needs 2 GPUs"}]
    scored = planning.score(rows)
    assert scored["shapes"] == 3 and abs(scored["error"] - 0.5) < 1e-12
    assert abs(scored["tau"] - 1 / 3) < 1e-12  # (2 concordant - 1 discordant) / 3 pairs
    assert planning.score([row(1.0, 1.0)]) is None
    table = planning.render_markdown({"rows": [{"lesson": "01", "shape": [1, 1, 1, 1],
        "predicted": {"total": 1.0, "compute": 1.0, "tp": 0, "pp": 0, "exposed": 0,
                      "bubble": 0}, "measured": 2.0, "fastest": 2.0, "slowest": 2.0,
        "ratio": 2.0}] * 2})  # fmt: skip
    assert "largest error |predicted / measured − 1| is 50%" in table and "τ" in table
    skipped = {"lesson": "03", "shape": [1, 2, 1, 1], "skipped": "needs 2 GPUs; this machine has 1"}
    words = {
        "heading": "| a | b | c | d | e | f |",
        "skipped": "not run ({})".format,
        "score": lambda s: f"error {s['error']:.0%}",
    }  # another language's words
    table = planning.render_markdown({"rows": [skipped]}, words)
    assert table.startswith("| a | b |") and "not run (needs 2 GPUs" in table
    assert "error" not in table  # one measured shape scores nothing
