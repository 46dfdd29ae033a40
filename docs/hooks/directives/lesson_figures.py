"""Figures of one lesson drawn from a record: lesson 10's ZeRO stages, lesson 11's
pipeline schedules and bubble, lesson 14's meshes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

from course.tools.author import compositions, schedules, zero_stages
from directives.common import ROOT, known_figure, read_record


def render_schedules(path: str, which: str, root: Path = ROOT) -> str:
    """Lesson 11's measured schedules (`python -m course schedules`): "timeline" or "bubble"."""
    return _measured(schedules, "schedules", path, which, root)


def render_compositions(path: str, which: str, root: Path = ROOT, lang: str = "en") -> str:
    """Lesson 14's meshes (`python -m course compositions`): "curves" or "axes"."""
    return _measured(compositions, "compositions", path, which, root, lang)


def _measured(tool, directive: str, path: str, which: str, root: Path, lang: str = "en") -> str:
    """A CPU figure that `tool` (its load and render_html) draws from the record at `path`,
    with its provenance."""
    if not (root / path).is_file():
        raise PluginError(f"{directive}: no such file {path!r}")
    known_figure(root / path, root)
    doc = tool.load(root / path)
    prov = doc["provenance"]
    try:
        image = tool.render_html(doc, which, lang) if lang != "en" else tool.render_html(doc, which)
    except ValueError as exc:
        raise PluginError(str(exc)) from exc
    if not image.startswith("|"):  # an image; a Markdown table stays the page's own
        image = f'<div class="course-figure">{image}</div>'
    torch = prov["torch"].split("+")[0]
    if lang == "zh":
        return (f'{image}\n\n??? course-provenance "测量于 {prov["date"][:10]} · PyTorch {torch} '
                f'· CPU"\n\n    在 `{prov["device"]}`（{prov["cpus"]} 个核心）上，PyTorch '
                f"{prov['torch']}，由 `{prov['command']}` 测得；记录：`{path}`。\n")  # fmt: skip
    return (
        f"{image}\n\n"
        f'??? course-provenance "Measured {prov["date"][:10]} · PyTorch {torch} · CPU"\n\n'
        f"    On {prov['device']} ({prov['cpus']} cores), PyTorch {prov['torch']}, by "
        f"`{prov['command']}`; record: `{path}`.\n"
    )


SKIPPED = re.compile(r"needs (\d+) GPUs; this machine has (\d+)")


def _skipped_zh(reason: str) -> str:
    """Why a shape was not measured, in Chinese (the record keeps the English)."""
    if m := SKIPPED.fullmatch(reason):
        return f"跳过：需要 {m[1]} 块 GPU，本机只有 {m[2]} 块"
    return f"跳过：`{reason}`"


# Lesson 15's plan table in Chinese (course/tools/student/planning.py's ENGLISH).
PLAN_ZH = {
    "heading": "| 课 | 网格 (pp, dp, tp) × m | 预测 | 计算 / tp+pp / dp / 气泡 "
               "| 实测（最小-最大） | 比值 |",
    "skipped": _skipped_zh,
    "score": lambda s: (f"在实测的 {s['shapes']} 种形状上：最大误差 |预测 / 实测 − 1| 为 "
                        f"{s['error']:.0%}，预测顺序与实测顺序之间的 Kendall τ 为 {s['tau']:.2f}"
                        "（1 表示每一对的顺序都对）。"),
}  # fmt: skip


def render_plan(path: str, root: Path = ROOT, lang: str = "en") -> str:
    """Lesson 15's predicted and measured step times (`python -m course plan --measure`)."""
    import json

    from course.tools.student import planning

    if not (root / path).is_file():
        raise PluginError(f"plan: no such file {path!r}")
    known_figure(root / path, root)
    doc = json.loads((root / path).read_text())
    prov, model = doc["provenance"], doc["model"]
    where = prov["device"] if prov["device"] == "CPU" else f"1 × {prov['device']}"
    short = where if prov["device"] == "CPU" else "1 × " + prov["device"].split()[1]  # H100
    gpu = f", CUDA {prov['cuda']}, NCCL {prov['nccl']}" if prov.get("nccl") else ""
    torch = prov["torch"].split("+")[0]
    if lang == "zh":
        summary = f"测量于 {prov['date'][:10]} · PyTorch {torch} · {short}"
        detail = (
            f"在 {where}（{prov['cpus']} 个核心）上，PyTorch {prov['torch']}{gpu}，由 "
            f"`{prov['command']}` 测得；带宽：`{prov['bandwidth']}`；记录：`{path}`。单位为每步"
            f"毫秒；模型：词表 {model['vocab']}，宽度 {model['dim']}，{model['depth']} 个块，"
            f"每步 {doc['batch']} 个长为 {model['seq']} 的序列。"
        )
    else:
        summary = f"Measured {prov['date'][:10]} · PyTorch {torch} · {short}"
        detail = (
            f"On {where} ({prov['cpus']} cores), PyTorch {prov['torch']}{gpu}, by "
            f"`{prov['command']}`; bandwidth: {prov['bandwidth']}; record: `{path}`. "
            f"Milliseconds a step; the model: vocabulary {model['vocab']}, dim "
            f"{model['dim']}, {model['depth']} blocks, {doc['batch']} sequences of "
            f"{model['seq']} a step."
        )
    table = planning.render_markdown(doc, PLAN_ZH if lang == "zh" else planning.ENGLISH)
    return f'{table}\n\n??? course-provenance "{summary}"\n\n    {detail}\n'


def render_zero_stages(name: str) -> str:
    """Lesson 10's figure of the ZeRO stages, from a `course memory` recording."""
    doc = read_record(name)
    try:
        image = zero_stages.render_html(doc)
    except ValueError as exc:
        raise PluginError(str(exc)) from exc
    return (
        f'<div class="course-figure">{image}</div>\n\n'
        f'??? course-provenance "Formula · counted: {name}"\n\n'
        f"    The bars are the formula's, for the model and rank count of `{doc['shown']}`; "
        "the counted figures are that command's, recorded on "
        f"{doc['provenance']['date']} with PyTorch {doc['provenance']['torch']}.\n"
    )


def render_planning_figure(record: str, name: str, root: Path = ROOT, lang: str = "en") -> str:
    """[[planning:FILE:flops]]: the float32 GEMM rate a `course plan --measure` record
    (docs/results/15_planning/FILE.json) measured, in TFLOP/s. [[planning:tracked:band]]:
    how far the planner's peak() came from the one torch's MemTracker tracked, at least and
    at most (course.tools.student.planner.TRACKED, measured)."""
    if (record, name) == ("tracked", "band"):
        from course.tools.student.planner import TRACKED

        low, high = TRACKED
        return f"{low:.2f} 至 {high:.2f} 倍" if lang == "zh" else f"{low:.2f} to {high:.2f} times"
    path = root / "docs" / "results" / "15_planning" / f"{record}.json"
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError) as exc:
        raise PluginError(f"[[planning:{record}:{name}]]: cannot read {path}: {exc}") from exc
    if name != "flops" or not any(name in row for row in rows):
        raise PluginError(f"[[planning:{record}:{name}]]: no such figure (flops)")
    rate = next(row[name] for row in rows if name in row)
    return f"{rate / 1e12:.0f} TFLOP/s"
