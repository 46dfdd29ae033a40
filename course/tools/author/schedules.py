"""Lesson 11's schedules, measured and drawn: `python -m course schedules`.

    python -m course schedules --out docs/results/11_model_parallel/schedules-cpu.json

Runs the reference pipeline.py on the CPU with a controlled stage cost (--stage-ms: each
forward waits T, each backward 2T, course/stages.py) and reads back, from its last step,
when each stage was busy (COURSE_STAGE_TIMELINE). First GPipe and 1F1B on 3 stages and 4
micro-batches, whose busy intervals become a timeline; then 1F1B with 1 to 12 micro-batches,
whose measured bubbles are plotted against (p - 1) / (m + p - 1). The record keeps the
intervals and the printed bubbles; the site draws both from it (render_html).
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
import statistics
import sys
import tempfile
from pathlib import Path

from course import REPO_ROOT, __version__, atomic, launch

KIND = "course-schedules"
SCRIPT = REPO_ROOT / "solutions" / "11_model_parallel" / "pipeline.py"
STAGES, TIMELINE_M, BUBBLE_M = 3, 4, (1, 2, 4, 8, 12)
COLOURS = {"F": "#4c72b0", "B": "#dd8452"}  # forward blue, backward orange


def run_once(schedule: str, micro: int, stage_ms: float, steps: int) -> dict:
    """One run of the reference: the last step's busy intervals per stage, and each stage's
    printed bubble."""
    args = ["--nproc", str(STAGES), "--backend", "gloo", "--schedule", schedule,
            "--micro-batches", str(micro), "--batch-size", str(12 * micro),
            "--stage-ms", f"{stage_ms:g}", "--steps", str(steps)]  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        result = launch.run(args=[sys.executable, str(SCRIPT), *args], timeout=300,
                           env={"COURSE_STAGE_TIMELINE": folder})  # fmt: skip
        if not result.ok:
            raise RuntimeError(f"pipeline.py {' '.join(args)}: {result.failure()}")
        timeline = {
            int(p.stem.removeprefix("stage")): json.loads(p.read_text())
            for p in Path(folder).glob("stage*.json")
        }
    bubbles = {int(r): float(b) for r, b in re.findall(r"stage (\d+): bubble ([\d.]+)",
                                                        result.output)}  # fmt: skip
    if sorted(timeline) != list(range(STAGES)) or sorted(bubbles) != list(range(STAGES)):
        raise RuntimeError(f"pipeline.py {' '.join(args)}: no notes from every stage:\n"
                           f"{result.output[-800:]}")  # fmt: skip
    return {
        "schedule": schedule,
        "stages": STAGES,
        "micro_batches": micro,
        "command": f"python lessons/11_model_parallel/pipeline.py {' '.join(args)}",
        "timeline": [timeline[r] for r in range(STAGES)],
        "bubble": [bubbles[r] for r in range(STAGES)],
        "theory": (STAGES - 1) / (micro + STAGES - 1),
    }


def measure(stage_ms: float = 20, steps: int = 3) -> dict:
    runs = [run_once(s, TIMELINE_M, stage_ms, steps) for s in ("gpipe", "1f1b")]
    runs += [run_once("1f1b", m, stage_ms, steps) for m in BUBBLE_M if m != TIMELINE_M]
    return {"kind": KIND, "stage_ms": stage_ms, "runs": runs}


def _figure_svg(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", transparent=True)
    return base64.b64encode(buffer.getvalue()).decode()


def timeline_svg(doc: dict) -> str:
    """GPipe above 1F1B: one row a stage, a box a forward (blue) or backward (orange),
    labelled with its micro-batch, on the measured time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in doc["runs"] if r["micro_batches"] == TIMELINE_M]
    with plt.rc_context({"font.size": 10, "svg.fonttype": "none"}):
        fig, axes = plt.subplots(len(shown), 1, figsize=(9, 1.3 + 1.1 * len(shown)), sharex=True)
        for ax, run in zip(axes, shown, strict=True):
            for stage, notes in enumerate(run["timeline"]):
                count = {"F": 0, "B": 0}
                for start, end, kind in notes:
                    ax.broken_barh([(start, end - start)], (stage - 0.4, 0.8),
                                   color=COLOURS[kind])  # fmt: skip
                    ax.text((start + end) / 2, stage, f"{kind}{count[kind]}", ha="center",
                            va="center", color="white", fontsize=9)  # fmt: skip
                    count[kind] += 1
            bubble = statistics.median(run["bubble"])
            name = "GPipe" if run["schedule"] == "gpipe" else "1F1B"
            title = f"{name}: measured bubble {bubble:.2f} (theory {run['theory']:.2f})"
            ax.set_title(title, loc="left")
            ax.set_yticks(range(run["stages"]), [f"stage {r}" for r in range(run["stages"])])
            ax.invert_yaxis()
        axes[-1].set_xlabel(f"ms in the step (forward {doc['stage_ms']:g} ms, backward "
                            f"{2 * doc['stage_ms']:g} ms of controlled cost)")  # fmt: skip
        fig.tight_layout()
        data = _figure_svg(fig)
        plt.close(fig)
    return data


def bubble_svg(doc: dict) -> str:
    """The measured bubble of 1F1B against the formula, over the micro-batches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted((r for r in doc["runs"] if r["schedule"] == "1f1b"),
                  key=lambda r: r["micro_batches"])  # fmt: skip
    m = [r["micro_batches"] for r in runs]
    with plt.rc_context({"font.size": 10, "svg.fonttype": "none"}):
        fig, ax = plt.subplots(figsize=(6, 3.4))
        ax.plot(m, [r["theory"] for r in runs], "--", color="grey", label="(p-1)/(m+p-1)")
        ax.plot(m, [statistics.median(r["bubble"]) for r in runs], "o-", color=COLOURS["F"],
                label="measured (median stage)")  # fmt: skip
        for r in runs:
            ax.plot([r["micro_batches"]] * len(r["bubble"]), r["bubble"], ".", color="black",
                    alpha=0.5)  # fmt: skip
        ax.set_xlabel(f"micro-batches m ({STAGES} stages, 1F1B)")
        ax.set_ylabel("bubble: idle share of the step")
        ax.set_xticks(m)
        ax.set_ylim(0, 1)
        ax.legend(frameon=False)
        fig.tight_layout()
        data = _figure_svg(fig)
        plt.close(fig)
    return data


def render_html(doc: dict, which: str) -> str:
    """One figure ("timeline" or "bubble") as an inline SVG image (course.css recolours it
    in the dark scheme)."""
    if which == "timeline":
        alt = "GPipe and 1F1B on 3 stages, 4 micro-batches: when each stage computed what"
        data = timeline_svg(doc)
    elif which == "bubble":
        alt, data = "The measured bubble of 1F1B against (p-1)/(m+p-1)", bubble_svg(doc)
    else:
        raise ValueError(f"schedules: no figure {which!r} (timeline or bubble)")
    narrow = ' style="max-width: 36rem"' if which == "bubble" else ""
    return f'<img class="course-plot"{narrow} alt="{alt}" src="data:image/svg+xml;base64,{data}">'


def load(path: str | Path) -> dict:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError(f'{path}: not a `course schedules` record (no "kind": "{KIND}")')
    return doc


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course schedules",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--out", required=True, help="the record (JSON)")
    p.add_argument("--stage-ms", type=float, default=20, help="forward's cost (default 20)")
    return p


def provenance(argv: list[str]) -> dict:
    import torch

    return {
        "device": f"CPU, {STAGES} gloo ranks",
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m course schedules " + " ".join(argv),
        "course": __version__,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    doc = measure(args.stage_ms)
    doc["provenance"] = provenance(argv)
    atomic.write_json(doc, args.out, indent=1)
    for run in doc["runs"]:
        print(f"{run['schedule']:6} m={run['micro_batches']:2}: bubble by stage "
              f"{run['bubble']}, theory {run['theory']:.3f}")  # fmt: skip
    print(f"wrote {args.out}")
    return 0
