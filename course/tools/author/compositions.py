"""Lesson 14's shapes, trained and counted: `python -m course compositions`.

    python -m course compositions --out docs/results/14_composing/cpu.json

Runs the reference compose.py on 8 gloo ranks in four shapes, (dp 8), (dp 2, tp 4),
(dp 4, tp 2) and (pp 2, dp 2, tp 2), STEPS steps each from one seed, logging every step;
then (pp 2, dp 2, tp 2) saves a checkpoint half-way, which (dp 4, tp 2) resumes. Then the
grader's case script (tests/lessons/cases/lesson_14.py, case `composed`) runs on the
reference, and what the grading kit's recorder saw in its step 2, on rank 0 and on rank 4
(the first rank of each stage), is summed by axis and kind. The record keeps the losses and
the sums; the site draws the curves and the table from it (render_html).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import io
import json
import os
import platform
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from course import REPO_ROOT, __version__, atomic, launch

KIND = "course-compositions"
SCRIPT = REPO_ROOT / "solutions" / "14_composing" / "compose.py"
CASES = REPO_ROOT / "tests" / "lessons" / "cases" / "lesson_14.py"
SHAPES = ((1, 8, 1), (1, 2, 4), (1, 4, 2), (2, 2, 2))  # the control first
RESUMED = (1, 4, 2)
STEPS = 40
AXIS_OF = {"all_gather": "dp", "reduce_scatter": "dp", "all_reduce": "tp", "send": "pp",
           "recv": "pp"}  # fmt: skip
CARRIES_ZH = {"all_gather": "权重（FSDP 收集一个块的分片）",
              "reduce_scatter": "梯度（FSDP，每个 rank 留下自己分片的）",
              "all_reduce": "激活及其梯度（TP 的部分和）",
              "send": "前向传激活，反向传它们的梯度",
              "recv": "前向传激活，反向传它们的梯度"}  # fmt: skip
CARRIES = {"all_gather": "weights (FSDP gathers a block's shards)",
           "reduce_scatter": "gradients (FSDP, each rank keeps its shard's)",
           "all_reduce": "activations, and their gradients (TP's partial sums)",
           "send": "activations forward, their gradients back",
           "recv": "activations forward, their gradients back"}  # fmt: skip
LOSS = re.compile(r"step (\d+)/\d+: loss ([\d.]+)")


def name(shape) -> str:
    return "pp {}, dp {}, tp {}".format(*shape)


def train(shape, steps: int, folder: Path, checkpoint: bool = False) -> dict[int, float]:
    """The reference on mesh `shape` up to `steps`: {step: loss} as it prints them."""
    pp, dp, tp = shape
    args = ["--pp", str(pp), "--dp", str(dp), "--tp", str(tp), "--backend", "gloo",
            "--steps", str(steps), "--log-every", "1"]  # fmt: skip
    args += ["--checkpoint", "ckpt"] if checkpoint else []
    result = launch.run(args=[sys.executable, str(SCRIPT), *args], timeout=600, cwd=folder)
    if not result.ok:
        raise RuntimeError(f"compose.py {' '.join(args)}: {result.failure()}")
    return {int(s): float(loss) for s, loss in LOSS.findall(result.output)}


def counted(folder: Path) -> tuple[list[dict], int]:
    """Step 2 of the grader's composed case on the reference, summed by rank, axis and kind;
    and the micro-batches it ran."""
    from course.grader.case_runs import run_cases

    results = run_cases(CASES, SCRIPT, folder, timeout=600, only=["composed"])
    found = results.value("composed")
    rows = []
    for rank in ("0", "4"):
        sums = defaultdict(lambda: [0, 0])
        for record in found[rank]["records"]:
            if record["phase"] == "2":
                sums[record["op"]][0] += 1
                sums[record["op"]][1] += record["bytes"] or record["received"]
        for op, (count, size) in sorted(sums.items(), key=lambda kv: "pdt".index(
                AXIS_OF[kv[0]][0])):  # fmt: skip
            rows.append({"rank": int(rank), "stage": found[rank]["stage"], "op": op,
                         "axis": AXIS_OF[op], "group": found[rank]["groups"][AXIS_OF[op]],
                         "count": count, "bytes": size})  # fmt: skip
    return rows, found["micro_batches"]


def measure() -> dict:
    with tempfile.TemporaryDirectory() as folder:
        curves = {name(s): train(s, STEPS, Path(folder)) for s in SHAPES}
        train(SHAPES[-1], STEPS // 2, Path(folder), checkpoint=True)
        resumed = train(RESUMED, STEPS, Path(folder), checkpoint=True)
        curves[f"{name(RESUMED)}, resumed"] = resumed
        rows, micro = counted(Path(folder))
    return {"kind": KIND, "steps": STEPS, "micro_batches": micro, "curves": curves, "axes": rows}


def largest_gap(doc: dict) -> float:
    """The largest difference of any printed loss from the control's at the same step."""
    curves = {k: {int(s): v for s, v in c.items()} for k, c in doc["curves"].items()}
    control = curves[name(SHAPES[0])]
    return max(abs(v - control[s]) for c in curves.values() for s, v in c.items())


def curves_svg(doc: dict, lang: str = "en") -> str:
    """The loss of every mesh by step, and of the resumed run: drawn wide to narrow, so
    that curves lying on each other still show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Text as text, not paths: the browser test measures its drawn size.
    with plt.rc_context({"svg.fonttype": "none"}):
        fig, ax = plt.subplots(figsize=(6.4, 3.4), layout="constrained")
        widths = (9, 6.5, 4, 1.5, 2.5)
        for (label, curve), width in zip(doc["curves"].items(), widths, strict=True):
            steps = sorted(curve, key=int)
            resumed = label.endswith("resumed")
            if lang == "zh":
                label = label.replace(", resumed", "，恢复后")
            ax.plot([int(s) for s in steps], [curve[s] for s in steps], ":" if resumed else "-",
                    lw=width, alpha=0.45 if width > 2.5 else 1, label=label)  # fmt: skip
        zh = lang == "zh"
        ax.set(xlabel="步" if zh else "step", ylabel="损失" if zh else "loss", yscale="log")
        ax.legend(
            fontsize=8,
            title="网格（对照组：dp 8）" if zh else "mesh (the control: dp 8)",
            title_fontsize=8,
        )
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", transparent=True)
        plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def render_html(doc: dict, which: str, lang: str = "en") -> str:
    """ "curves" (an inline SVG image) or "axes" (a Markdown table), in `lang` (en or zh)."""
    zh = lang == "zh"
    if which == "curves":
        alt = (
            "四种网格和一次恢复运行的损失曲线，彼此重合"
            if zh
            else "Loss curves of four meshes and of a resumed run, lying on each other"
        )
        image = f'<img class="course-plot" alt="{alt}" src="data:image/svg+xml;base64,'
        said = ("任一运行、任一步上与对照组打印的损失的最大差：" if zh
                else "The largest difference from the control's printed loss, at any step of "
                "any run: ")  # fmt: skip
        end = "。" if zh else "."
        return f'{image}{curves_svg(doc, lang)}"><p>{said}{largest_gap(doc):.4f}{end}</p>'
    if which != "axes":
        raise ValueError(f"compositions: no figure {which!r} (curves or axes)")
    carries = CARRIES_ZH if zh else CARRIES
    lines = ["| rank（阶段） | 轴：它的组 | 集合通信 | 传送 | 每步次数 | 每步字节 |" if zh else
             "| rank (stage) | axis: its group | collective | carries | a step | bytes a step |",
             "|---|---|---|---|--:|--:|"]  # fmt: skip
    for row in doc["axes"]:
        lines.append(f"| {row['rank']} ({row['stage']}) | {row['axis']}: {row['group']} | "
                     f"{row['op'].replace('_', '-')} | {carries[row['op']]} | {row['count']} | "
                     f"{row['bytes']:,} |")  # fmt: skip
    lines.append(f"\n{doc['micro_batches']} 个微批次中的第 2 步；字节数是该 rank 发送的量，接收则为"
                 "它收到的量。" if zh else
                 f"\nStep 2 of {doc['micro_batches']} micro-batches; bytes are what the rank "
                 "sends, or for a receive, what it receives.")  # fmt: skip
    return "\n".join(lines)


def load(path: str | Path) -> dict:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError(f'{path}: not a `course compositions` record (no "kind": "{KIND}")')
    return doc


def provenance(argv: list[str]) -> dict:
    import torch

    return {
        "device": "CPU, 8 gloo ranks",
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m course compositions " + " ".join(argv),
        "course": __version__,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course compositions",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--out", required=True, help="the record (JSON)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    doc = measure()
    doc["provenance"] = provenance(argv)
    atomic.write_json(doc, args.out, indent=1)
    for label, curve in doc["curves"].items():
        print(f"{label:28} loss {curve[max(curve)]:.4f} at step {max(curve)}")
    print(f"largest difference from the control, as printed: {largest_gap(doc):.4f}")
    print(f"wrote {args.out}")
    return 0
