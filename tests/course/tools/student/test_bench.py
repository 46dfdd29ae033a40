"""python -m course bench: the launches, the step clock, the ratios, the table and the plot.

On this CPU-only machine the command runs its tiny gloo version, which goes
through every code path that the GPU version does except the GPUs: the
lessons launched as their pages say, the sitecustomize hook in every rank,
the windows, the JSON record and the plot.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from course import REPO_ROOT
from course.launch import command as launching
from course.tools.student.bench import catalogue, launch, provenance, render

RECORDS = sorted(
    path
    for path in (REPO_ROOT / "docs" / "results").glob("*/*.json")
    if '"kind": "course-bench"' in path.read_text()
)

TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
    "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n"
)


def test_interconnect_reads_nvidia_smi_topo():
    assert provenance.interconnect(TOPO) == "NV18"
    assert provenance.interconnect(TOPO.replace("NV18", "SYS")) == "SYS"
    assert provenance.interconnect("No devices were found") == ""


def test_windows_drop_the_warm_up_and_count_images():
    row = catalogue.Row("03", "03", "DDP", 2, window=10, warmup=2, windows=2)
    points = [(10, 1.0), (20, 2.0), (30, 2.5), (40, 3.0)]  # the first window ends at step 10
    # global batch 64: 10 steps x 64 images in 0.5 s, twice; the warm-up window is dropped
    assert launch.windows_of(points, row, 64) == [1280.0, 1280.0]


def test_ratios_are_against_one_device():
    rows = [
        {"key": "01", "ok": True, "samples_per_s": 100.0, "world_size": 1},
        {"key": "03", "ok": True, "samples_per_s": 180.0, "world_size": 2},
        {"key": "04", "ok": False, "world_size": 2},
    ]
    launch.add_ratios(rows)
    assert rows[1]["speedup"] == 1.8 and rows[1]["efficiency"] == 0.9
    assert "efficiency" not in rows[2]


def test_the_mp_spawn_lessons_are_given_their_ranks():
    """Lesson 03 starts like 01 (python train.py), with --nproc and the backend added."""
    settings = catalogue.Settings("cuda", 2, "resnet50", 224, 128, "off", False)
    (row,) = catalogue.plan(settings, ["03"], window=10, warmup=2, windows=5)
    at = row.extra.index("--nproc")
    assert row.world == 2 and row.extra[at : at + 4] == ["--nproc", "2", "--backend", "nccl"]


def test_lesson_06_rows_compare_step_times_with_torch_ddp():
    """Lesson 06's three launches, and each one's step time over DDP's in the same run."""
    settings = catalogue.Settings("cuda", 2, "resnet50", 224, 128, "off", False)
    rows = catalogue.plan(settings, ["06"], window=10, warmup=2, windows=5)
    assert [r.key for r in rows] == ["06-torch", "06-mini", "06-mini-each"]
    assert all("--nproc" in r.extra and "--wrapper" in r.extra for r in rows)
    assert rows[2].extra[-2:] == ["--bucket-cap-mb", "0"]
    records = [
        {"key": "01", "lesson": "01", "ok": True, "samples_per_s": 100.0, "step_ms": 10.0},
        {"key": "06-torch", "lesson": "06", "ok": True, "samples_per_s": 190.0, "step_ms": 20.0},
        {"key": "06-mini", "lesson": "06", "ok": True, "samples_per_s": 180.0, "step_ms": 21.0},
        {"key": "06-mini-each", "lesson": "06", "ok": False},
    ]
    for r, world in zip(records, (1, 2, 2, 2), strict=True):
        r.update(mode=r["key"], world_size=world, global_batch=8 * world)
    launch.add_ratios(records)
    assert records[1]["step_vs_ddp"] == 1.0 and records[2]["step_vs_ddp"] == 1.05
    assert "step_vs_ddp" not in records[0] and "step_vs_ddp" not in records[3]
    text = render.table({"settings": {"device": "cuda"}, "rows": records})
    head, *lines = text.splitlines()
    assert head.split()[2:5] == ["step", "/", "DDP's"]
    assert "1.050" in lines[2] and "failed" in lines[3]
    markdown = render.table({"settings": {"device": "cuda"}, "rows": records}, markdown=True)
    widths = {line.count("|") for line in markdown.splitlines()}
    assert len(widths) == 1, markdown  # every row has every column


def test_lesson_08_rows_change_one_thing_each_against_the_lesson_as_it_stands(tmp_path):
    """Every 08 variant is the base run plus its own flags, environment or data."""
    settings = catalogue.Settings("cuda", 2, "resnet50", 224, 128, "bf16", True)
    rows = {r.key: r for r in catalogue.plan(settings, ["08"], window=10, warmup=2, windows=5)}
    assert {"01-fp32", "08", "08-b100", "08-acc2", "08-fp32", "08-files0", "08-compile"} <= set(
        rows
    )
    base = rows["08"].extra
    for key, row in rows.items():
        if key.startswith("08-"):
            assert row.extra[: len(base)] == base and row.versus == "08", key
    impl = REPO_ROOT / "solutions"
    command = launch.command(rows["08"], impl, settings)
    assert "--amp" in command and "--channels-last" in command
    fp32 = launch.command(rows["08-fp32"], impl, settings)
    assert "--amp" not in fp32 and "--channels-last" not in fp32
    assert rows["08-fp32"].single == "01-fp32"
    acc = launch.command(rows["08-acc2"], impl, settings)
    images = int(acc[acc.index("--data") + 1].split(":")[1])
    assert images == rows["08-acc2"].steps * 128 * 2 * 2  # micro-batches x accumulate
    files = launch.command(rows["08-files"], impl, settings, files=tmp_path)
    assert files[files.index("--data") + 1] == str(tmp_path)
    assert rows["08-ch4"].env == {"NCCL_MAX_NCHANNELS": "4"}
    cpu = catalogue.Settings("cpu", 2, "cnn", 32, 32, "off", False)
    cpu_keys = [r.key for r in catalogue.plan(cpu, ["08"], window=5, warmup=1, windows=3)]
    assert not {"08-compile", "08-ch4", "08-files"} & set(cpu_keys)


def test_lesson_09_rows_time_the_handed_out_starter_against_the_fix(tmp_path):
    """starved.py brings its own flags and model: the starter row runs lessons/ (the broken
    loader) whatever --impl says, the fix rows --impl's with workers, every timed step
    inside the epochs asked for, and the table and title say what was trained."""
    from course import data

    assert len(data.digits()[0]) == catalogue.STARVED_TRAIN_IMAGES
    gpu = catalogue.Settings("cuda", 2, "resnet50", 224, 128, "off", False)
    rows = {r.key: r for r in catalogue.plan(gpu, ["09"], window=10, warmup=2, windows=5)}
    assert set(rows) == {"09-starved", "09-fed4", "09-fed8"}
    impl = tmp_path / "impl"
    (impl / "09_debugging").mkdir(parents=True)
    (impl / "09_debugging" / "starved.py").write_text("")
    starter = launch.command(rows["09-starved"], impl, gpu)
    fed = launch.command(rows["09-fed8"], impl, gpu)
    assert starter[1] == str(REPO_ROOT / "lessons" / "09_debugging" / "starved.py"), starter
    assert fed[1] == str(impl / "09_debugging" / "starved.py"), fed
    assert fed[fed.index("--workers") + 1] == "8" and "--workers" not in starter
    for command in (starter, fed):
        assert "--model" not in command and command[command.index("--device") + 1] == "cuda"
        epochs, batch = (int(command[command.index(f) + 1]) for f in ("--epochs", "--batch-size"))
        per_epoch = -(-catalogue.STARVED_TRAIN_IMAGES // batch)
        assert epochs * per_epoch >= rows["09-fed8"].steps
    cpu = catalogue.Settings("cpu", 2, "cnn", 32, 32, "off", False)
    assert [r.key for r in catalogue.plan(cpu, ["09"], 5, 1, 3)] == ["09-starved", "09-fed4"]
    records = [
        {"key": "09-starved", "ok": True, "samples_per_s": 2000.0, "single": ""},
        {"key": "09-fed4", "ok": True, "samples_per_s": 7000.0, "single": "",
         "versus": "09-starved", "window_samples_per_s": [6000.0, 7000.0]},
    ]  # fmt: skip
    for r in records:
        r.update(lesson="09", mode=r["key"], world_size=1, global_batch=32, step_ms=1.0)
        r["model"] = rows["09-fed4"].model
    launch.add_ratios(records)
    assert records[1]["vs_base"] == 3.5
    assert not {"speedup", "efficiency"} & {*records[0], *records[1]}, "one process: no scaling"
    doc = {"settings": {"device": "cuda", "amp": "off", "channels_last": False, "gpus": 2,
                        "model": "resnet50", "image_size": 224, "batch_size": 128},
           "provenance": {"device": "NVIDIA H200"}, "rows": records}  # fmt: skip
    assert render.title(doc) == "SmallCNN, 8x8 digits, fp32, batch 32, one process on NVIDIA H200"
    head = render.table(doc).splitlines()[0].split()
    assert head[2:4] == ["x", "09-starved"] and "efficiency" not in head, head
    pytest.importorskip("matplotlib")
    svg = render.plot([doc], fmt="svg").decode()
    assert "Throughput" in svg and "Scaling efficiency" not in svg


def test_lesson_11_rows_split_one_batch_and_measure_the_bubble_against_theory(tmp_path):
    """Pipeline rows: one batch for the whole job (the stages split the model, not the
    data), 1F1B with 1, 2, 4, 8 micro-batches against the whole model on one device, and
    the measured bubble 1 - efficiency beside (p-1)/(m+p-1). One GPU: the one-device rows."""
    gpu = catalogue.Settings("cuda", 2, "resnet50", 224, 128, "off", False)
    rows = {r.key: r for r in catalogue.plan(gpu, ["11"], window=10, warmup=2, windows=5)}
    pipes = [f"11-1f1b-m{m}" for m in (1, 2, 4, 8)] + ["11-torch-1f1b-m8"]
    assert set(rows) == {"11-pipe1", "11-pipe1-m8", *pipes, "11-tp1", "11-tp-hand", "11-tp-dtensor"}
    for key, m in zip(pipes, (1, 2, 4, 8, 8), strict=True):
        row = rows[key]
        assert row.extra[row.extra.index("--micro-batches") + 1] == str(m), row.extra
        assert row.extra[row.extra.index("--nproc") + 1] == "2" and row.single == "11-pipe1"
        assert row.theory_bubble == round(1 / (m + 1), 3)  # p = 2: (p-1)/(m+p-1)
        assert row.global_batch(gpu) == rows["11-pipe1"].global_batch(gpu)  # not x world
    assert rows["11-tp-hand"].extra[rows["11-tp-hand"].extra.index("--split") + 1] == "hand"
    assert rows["11-tp-dtensor"].single == "11-tp1" and rows["11-tp1"].world == 1
    assert {k for k, r in rows.items() if r.profile} == {"11-tp-hand", "11-tp-dtensor"}
    impl = tmp_path / "impl" / "11_model_parallel"
    impl.mkdir(parents=True)
    (impl / "pipeline.py").write_text("")
    command = launch.command(rows["11-1f1b-m4"], impl.parent, gpu)
    assert command[1] == str(impl / "pipeline.py") and command[-2:] == ["--steps", "70"]
    one = catalogue.Settings("cuda", 1, "resnet50", 224, 128, "off", False)
    assert [r.key for r in catalogue.plan(one, ["11"], 10, 2, 5)] == [
        "11-pipe1", "11-pipe1-m8", "11-tp1"
    ]  # fmt: skip
    records = [
        {"key": "11-pipe1", "ok": True, "samples_per_s": 100.0, "single": ""},
        {"key": "11-1f1b-m2", "ok": True, "samples_per_s": 120.0, "single": "11-pipe1",
         "theory_bubble": 0.333},
    ]  # fmt: skip
    for r, world in zip(records, (1, 2), strict=True):
        r.update(lesson="11", mode=r["key"], world_size=world, global_batch=256, step_ms=1.0)
        r.update(unit="seq", model="pipeline.py's blocks")
    launch.add_ratios(records)
    assert records[1]["efficiency"] == 0.6 and records[1]["bubble"] == 0.4
    assert "bubble" not in records[0]
    text = render.table({"settings": {"device": "cuda"}, "rows": records})
    head, one_device, split = text.splitlines()
    assert "seq/s" in head.split() and head.split()[-2:] == ["bubble", "(p-1)/(m+p-1)"]
    assert split.split()[-2:] == ["0.400", "0.333"] and one_device.split()[-1] == "1.0"
    tp = {**records[0], "key": "11-tp1", "model": "tensor.py's blocks"}  # a second model
    doc = {"settings": {"device": "cuda", "amp": "off", "channels_last": False, "gpus": 2,
                        "model": "resnet50", "image_size": 224, "batch_size": 128},
           "provenance": {"device": "NVIDIA H200"}, "rows": [*records, tp]}  # fmt: skip
    assert render.title(doc) == "the lesson scripts' own models, fp32, up to 2 GPUs, on NVIDIA H200"
    tp.update(world_size=2, comm_share=0.25, single="", efficiency=0.7)  # profiled
    head, *lines = render.table(doc).splitlines()
    assert "collectives" in head.split() and lines[2].split()[-1] == "25%", (head, lines)
    assert "%" not in lines[1] and lines[1].split()[-2:] == ["0.400", "0.333"], lines[1]


def test_lesson_08_ratios_divide_by_their_own_baselines():
    records = [
        {"key": "01", "ok": True, "samples_per_s": 100.0},
        {"key": "01-fp32", "ok": True, "samples_per_s": 50.0},
        {"key": "08", "ok": True, "samples_per_s": 190.0, "step_ms": 10.0},
        {"key": "08-fp32", "ok": True, "samples_per_s": 95.0, "single": "01-fp32"},
        {"key": "08-b100", "ok": False},
    ]
    for r, world in zip(records, (1, 1, 2, 2, 2), strict=True):
        r.update(lesson=r["key"][:2], mode=r["key"], world_size=world, global_batch=8 * world)
        r.setdefault("step_ms", 1.0)
        if r["key"].startswith("08-"):
            r["versus"] = "08"
    launch.add_ratios(records)
    assert records[3]["efficiency"] == 0.95  # against one device in fp32, not in bf16
    assert records[3]["vs_base"] == 0.5 and "vs_base" not in records[2]
    assert "vs_base" not in records[4]
    head, *lines = render.table({"settings": {"device": "cuda"}, "rows": records}).splitlines()
    assert head.split()[2:4] == ["x", "08"] and "0.500" in lines[3]
    markdown = render.table({"settings": {"device": "cuda"}, "rows": records}, markdown=True)
    assert len({line.count("|") for line in markdown.splitlines()}) == 1, markdown


def test_cpu_bench_times_the_lessons_and_writes_a_record_and_a_plot(tmp_path):
    out = tmp_path / "bench.json"
    # 01 (one process) and 04 (torchrun, 2 ranks): both of the bench's launch paths; the
    # mp.spawn lessons start like 01 (python train.py --nproc N). 11's pipeline with 2 gloo
    # stages and its tensor parallel by hand: scripts with flags of their own, which must be
    # pipeline.py's and tensor.py's; the second profiles its last warm-up window.
    args = ["--lessons", "01", "04", "11", "--only", "01", "04", "11-1f1b-m2", "11-tp-hand"]
    args += ["--window", "2", "--warmup", "2", "--windows", "2"]
    result = launching.run(
        [sys.executable, "-m", "course", "bench", *args, "--out", str(out)],
        timeout=150,
        cwd=tmp_path,
        # the CPU's rows: with a GPU visible the bench measures that (other rows, other
        # defaults), as it did on an H200 machine
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.ok, result.describe()
    doc = json.loads(out.read_text())
    assert [r["key"] for r in doc["rows"]] == ["01", "04", "11-1f1b-m2", "11-tp-hand"]
    for row in doc["rows"]:
        assert row["ok"], row.get("error")
        assert len(row["window_samples_per_s"]) == 2 and row["samples_per_s"] > 0
    assert doc["rows"][0]["efficiency"] > 0 and doc["rows"][1]["efficiency"] > 0
    assert doc["rows"][1]["world_size"] == 2 and doc["rows"][1]["global_batch"] == 64
    pipe = doc["rows"][2]  # its one-device row (11-pipe1) was left out: no measured bubble
    assert pipe["theory_bubble"] == 0.333 and pipe["global_batch"] == catalogue.PIPELINE_CPU[2]
    assert "--micro-batches 2" in pipe["command"] and "pipeline.py" in pipe["command"]
    split = doc["rows"][3]  # two gloo ranks, one all-reduce in forward and one in backward
    # The share is taken within the profiled window, against that window's own steps: a
    # busy machine can make the timed windows' steps (step_ms) shorter than the profiled ones.
    assert 0 < split["comm_ms"] < split["profiled_step_ms"], split
    # Both stored rounded (0.01 ms): their ratio agrees with the share to 0.002.
    assert abs(split["comm_share"] - split["comm_ms"] / split["profiled_step_ms"]) < 0.002, split
    assert "in collectives" in result.output and "comm_share" not in doc["rows"][1]
    assert "torch.distributed.run" in doc["rows"][1]["command"]
    assert doc["provenance"]["device"] == "CPU" and doc["provenance"]["torch"]
    assert "efficiency" in result.output and "DDP, torchrun" in result.output
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_a_failing_lesson_is_reported_and_fails_the_command(tmp_path):
    folder = tmp_path / "impl" / "01_single_device"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text("raise RuntimeError('broken on purpose')\n")
    out = tmp_path / "b.json"
    args = ["--lessons", "01", "--impl", str(tmp_path / "impl"), "--out", str(out)]
    args += ["--window", "1", "--warmup", "1", "--windows", "1"]
    result = launching.run([sys.executable, "-m", "course", "bench", *args], timeout=60)
    assert result.returncode == 1
    assert "FAILED" in result.output and "broken on purpose" in result.output
    assert json.loads(out.read_text())["rows"][0]["ok"] is False


def test_bad_arguments_give_one_line():
    result = launching.run([sys.executable, "-m", "course", "bench", "--lessons", "42"], timeout=60)
    assert result.returncode == 2 and "no lesson '42'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(not RECORDS, reason="no course bench records in docs/results")
@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_published_records_are_complete_and_consistent(path: Path):
    """Every record on the results page has its provenance, and its ratios follow from its rows."""
    doc = render.load(path)
    needed = ["device", "gpu_count", "torch", "cuda", "nccl", "date", "command"]
    if doc["settings"]["gpus"] >= 2:  # the link between GPU0 and GPU1
        needed.append("interconnect")
    for key in needed:
        assert doc["provenance"].get(key), f"{path.name}: provenance lacks {key}"
    rows = [dict(r) for r in doc["rows"]]
    for r in rows:
        for key in ("speedup", "efficiency", "step_vs_ddp", "vs_base", "bubble"):
            r.pop(key, None)
    launch.add_ratios(rows)
    for stored, computed in zip(doc["rows"], rows, strict=True):
        assert stored.get("efficiency") == computed.get("efficiency"), stored["mode"]
        assert stored.get("step_vs_ddp") == computed.get("step_vs_ddp"), stored["mode"]
        assert stored.get("vs_base") == computed.get("vs_base"), stored["mode"]
        assert stored.get("bubble") == computed.get("bubble"), stored["mode"]
    assert render.plot([doc])[:4] == b"\x89PNG"
