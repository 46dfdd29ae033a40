"""Lesson 10's figure of what each ZeRO stage shards, with the bytes a rank keeps.

Drawn from the record of `python -m course memory` (docs/results/outputs/10_memory.json):
its first line gives the model's parameter count P and the rank count N, its table what
each way was counted to keep on the largest rank. Each bar is one rank's parameters,
gradients and optimizer state, a segment drawn whole or as its 1/N shard:

- fp32 AdamW (the lesson's): 4 + 4 + 8 bytes a parameter, beside what was counted;
- mixed precision as the ZeRO paper counts it: 2 (bf16 weight) + 2 (bf16 gradient) + 12
  (fp32 master weight and the two moments, all optimizer state), computed only.
"""

from __future__ import annotations

import base64
import io
import re

BYTES = {"fp32 AdamW": (4, 4, 8), "bf16, as ZeRO counts": (2, 2, 12)}
PARTS = ("parameters", "gradients", "optimizer state")
COLOURS = ("#4c72b0", "#dd8452", "#55a868")
# stage -> which of PARTS it shards
STAGES = {"DDP": (), "ZeRO-1": (2,), "ZeRO-2": (1, 2), "ZeRO-3 (FSDP)": (0, 1, 2)}
COUNTED = {"DDP": "DDP", "ZeRO-1": "ZeRO-1 (yours)", "ZeRO-3 (FSDP)": "FSDP2"}


def from_record(doc: dict) -> tuple[int, int, dict[str, int]]:
    """(parameters, ranks, {way: bytes counted on the largest rank}) from 10_memory's output."""
    text = doc["output"]
    head = re.search(r"([\d,]+) parameters .*?; (\d+) \w+ ranks", text)
    if head is None:
        raise ValueError("10_memory: no 'N parameters ...; K ranks' line in its output")
    counted = {
        m.group(1).strip(): int(m.group(3).replace(",", ""))
        for m in re.finditer(r"^(\S.*?)\s{2,}([\d,]+)\s+([\d,]+)\s+[\d.]+\s*$", text, re.M)
    }
    return int(head.group(1).replace(",", "")), int(head.group(2)), counted


def per_rank(params: int, ranks: int, precision: str) -> dict[str, list[float]]:
    """{stage: [bytes of each part a rank keeps]}."""
    return {
        stage: [b * params / (ranks if i in sharded else 1) for i, b in enumerate(BYTES[precision])]
        for stage, sharded in STAGES.items()
    }


def svg(doc: dict) -> str:
    """Both panels as one SVG, base64."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params, ranks, counted = from_record(doc)
    with plt.rc_context({"font.size": 10, "svg.fonttype": "none"}):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
        for ax, precision in zip(axes, BYTES, strict=True):
            rows = per_rank(params, ranks, precision)
            for y, (stage, parts) in enumerate(rows.items()):
                left = 0.0
                for i, size in enumerate(parts):
                    hatch = "//" if i in STAGES[stage] else None
                    label = PARTS[i] if y == 0 else None
                    ax.barh(y, size / 1e6, left=left, color=COLOURS[i], hatch=hatch,
                            edgecolor="white", label=label)  # fmt: skip
                    left += size / 1e6
                note = f"{left:.1f} MB"
                if precision == "fp32 AdamW" and COUNTED.get(stage) in counted:
                    note += f" (counted {counted[COUNTED[stage]] / 1e6:.1f})"
                ax.text(left + 0.5, y, note, va="center")
            ax.set_yticks(range(len(STAGES)), list(STAGES))
            ax.set_xlim(0, max(sum(p) for p in rows.values()) / 1e6 * 1.6)
            ax.set_xlabel("MB a rank keeps")
            ax.set_title(f"{precision}: {sum(BYTES[precision])} B a parameter", loc="left")
        axes[0].invert_yaxis()  # shared: DDP on top, once for both panels
        fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3,
                   frameon=False)  # fmt: skip
        fig.suptitle(f"{params:,} parameters on {ranks} ranks; hatched: sharded, 1/{ranks} "
                     "on each rank", x=0.01, ha="left", fontsize=10)  # fmt: skip
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", transparent=True)
        plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def render_html(doc: dict) -> str:
    alt = "What each ZeRO stage shards, and the bytes a rank keeps"
    return f'<img class="course-plot" alt="{alt}" src="data:image/svg+xml;base64,{svg(doc)}">'
