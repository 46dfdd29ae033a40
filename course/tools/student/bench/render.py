"""A benchmark record as text, a Markdown table, a plot (PNG or SVG) or HTML: what the CLI prints
and what the site shows (docs/hooks/course_site.py)."""

from __future__ import annotations

import base64
import io
import json
import textwrap
from pathlib import Path

KIND = "course-bench"  # a record's "kind": what `load` accepts


def title(doc: dict) -> str:
    s, p = doc["settings"], doc["provenance"]
    precision = "bf16 autocast" if s["amp"] == "bf16" else "fp32"
    layout = ", channels-last" if s["channels_last"] else ""
    where = (
        f"{s['gpus']}x {p['device']}" if s["device"] == "cuda" else f"CPU, {s['gpus']} gloo ranks"
    )
    size = f"{s['image_size']}x{s['image_size']}"
    own = {r.get("model") for r in doc["rows"]}
    on = p["device"] if s["device"] == "cuda" else "the CPU"
    if doc["rows"] and len(own) == 1 and None not in own:  # rows that bring their own model
        first, world = doc["rows"][0], max(r["world_size"] for r in doc["rows"])
        batch = first["global_batch"] // (1 if first.get("shared_batch") else first["world_size"])
        processes = f"up to {world} processes" if world > 1 else "one process"
        return f"{own.pop()}, {precision}, batch {batch}, {processes} on {on}"
    if doc["rows"] and None not in own:  # several (lesson 11's two scripts)
        world = max(r["world_size"] for r in doc["rows"])
        ranks = f", up to {world} {'GPUs' if s['device'] == 'cuda' else 'ranks'}" * (world > 1)
        return f"the lesson scripts' own models, {precision}{ranks}, on {on}"
    return f"{s['model']} {size}, {precision}{layout}, batch {s['batch_size']} per GPU, {where}"


def table(doc: dict, markdown: bool = False) -> str:
    """The rows as a text table (for the terminal) or a Markdown table (for the site)."""
    ranks = "GPUs" if doc["settings"]["device"] == "cuda" else "ranks"
    units = {r.get("unit", "img") for r in doc["rows"]}
    rate = f"{units.pop()}/s" if len(units) == 1 else "samples/s"
    head = ["lesson", "mode", ranks, "global batch", rate, "speed-up", "efficiency", "step ms"]
    bubbles = any("theory_bubble" in r for r in doc["rows"])  # lesson 11's pipelines
    comm = any("comm_share" in r for r in doc["rows"])  # lesson 11's tensor parallel rows
    versus = any("step_vs_ddp" in r for r in doc["rows"])  # lesson 06: MiniDDP against DDP
    bases = [r["versus"] for r in doc["rows"] if "vs_base" in r]  # lesson 08: against row 08
    lines = []
    for r in doc["rows"]:
        cells = [r["lesson"], r["mode"], str(r["world_size"]), str(r["global_batch"])]
        if not r["ok"]:
            lines.append([*cells, "failed", "", "", ""])
        else:
            ratio = ["", ""]
            if "speedup" in r:
                ratio = [f"{r['speedup']:.2f}", f"{r['efficiency']:.2f}"]
            lines.append([*cells, f"{r['samples_per_s']:,.0f}", *ratio, f"{r['step_ms']:.1f}"])
        if versus:  # right after the mode: the column lesson 06's table is about
            lines[-1].insert(2, f"{r['step_vs_ddp']:.3f}" if "step_vs_ddp" in r else "")
        if bases:
            lines[-1].insert(2, f"{r['vs_base']:.3f}" if "vs_base" in r else "")
        if comm:
            lines[-1].append(f"{r['comm_share']:.0%}" if "comm_share" in r else "")
        if bubbles:  # at the end: measured, then the formula's
            lines[-1].append(f"{r['bubble']:.3f}" if "bubble" in r else "")
            lines[-1].append(f"{r['theory_bubble']:.3f}" if "theory_bubble" in r else "")
    if comm:
        head.append("in collectives")
    if bubbles:
        head += ["bubble", "(p-1)/(m+p-1)"]
    if versus:
        head.insert(2, "step / DDP's")
    if bases:  # one base (lesson 08's, 09's) names the column; several: each row's own
        head.insert(2, f"x {bases[0]}" if len(set(bases)) == 1 else "x its base")
    if not any("speedup" in r for r in doc["rows"]):  # no row scales (lesson 09's): no columns
        gone = {head.index("speed-up"), head.index("efficiency")}
        head = [h for i, h in enumerate(head) if i not in gone]
        lines = [[c for i, c in enumerate(cells) if i not in gone] for cells in lines]
    if markdown:
        rule = "|---|---|" + "--:|" * (len(head) - 2)
        rows = ["| " + " | ".join(cells) + " |" for cells in [head, *lines]]
        return "\n".join([rows[0], rule, *rows[1:]])
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]

    def fmt(cells):
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs)

    return "\n".join([fmt(head), *(fmt(cells) for cells in lines)])


def provenance_line(doc: dict) -> str:
    p = doc["provenance"]
    parts = [p["device"]]
    if p.get("gpu_count"):
        parts.append(f"{p['gpu_count']} visible")
    if p.get("interconnect"):
        parts.append(f"GPU0-GPU1 link {p['interconnect']} (nvidia-smi topo -m)")
    parts.append(f"torch {p['torch']}")
    if p.get("cuda"):
        parts.append(f"CUDA {p['cuda']}")
    if p.get("nccl"):
        parts.append(f"NCCL {p['nccl']}")
    parts += [f"{p['cpus']} CPUs", p["date"]]
    return ", ".join(parts)


# Every text of the plot, in points, and the figure's width, in inches: a page shows a plot
# at most 906 px wide at 1280 px, and 768 px wide on a phone (course.css), so text of 10 pt
# on a figure of 10.5 in is drawn at 10 px or more on both (the browser test measures it).
TEXT_PT = 10
WIDTH_IN = 10.5


def plot(docs: list[dict], path: str | Path | None = None, fmt: str = "png") -> bytes:
    """Throughput and scaling efficiency of every row, one colour per record; returns the image.

    Each bar is the row's median window; the dots on it are every timed window, so the
    spread shows beside the median. The background is transparent (the site recolours
    the SVG for its dark scheme). matplotlib: the de-facto plotting library, and the one
    a student already has.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(r["key"] for doc in docs for r in doc["rows"] if r["ok"]))
    many = len(keys) > 8  # lesson 08's variants: slanted labels, on fewer lines
    labels = {  # wrapped, so that neighbouring labels never run into each other
        r["key"]: textwrap.fill(
            f"{r['lesson']} {r['mode']}", 24 if many else 11, break_long_words=False
        )  # fmt: skip
        for d in docs
        for r in d["rows"]
    }
    scaled = {r["key"] for d in docs for r in d["rows"] if "efficiency" in r}
    pkeys = [key for key in keys if not key.startswith("01") and key in scaled]  # parallel rows
    # Side by side when each panel's labels fit half the width, else one above the other.
    stacked = bool(pkeys) and len(keys) > 4
    height = (5.6 + 1.2 * many) * (1.8 if stacked else 1)
    with plt.rc_context({"font.size": TEXT_PT, "svg.fonttype": "none"}):
        # No row that scales (lesson 09's one process against itself): throughput alone.
        shape = (2, 1) if stacked else (1, 2 if pkeys else 1)
        fig, axes = plt.subplots(*shape, figsize=(WIDTH_IN if pkeys else 8, height))
        left, right = (axes[0], axes[1]) if pkeys else (axes, None)
        width = 0.8 / max(len(docs), 1)
        offset = (len(docs) - 1) * width / 2  # from a group's first bar to its centre
        for i, doc in enumerate(docs):
            rows = {r["key"]: r for r in doc["rows"] if r["ok"]}
            name = title(doc).split(" per GPU")[0]
            shown = [key for key in keys if key in rows]
            where = [keys.index(k) + i * width for k in shown]
            bars = left.bar(where, [rows[k]["samples_per_s"] for k in shown], width, label=name)
            left.bar_label(bars, fmt="{:,.0f}", padding=2)
            for x, key in zip(where, shown, strict=True):  # right of the centred label
                windows = rows[key].get("window_samples_per_s") or []
                dots = [x + 0.3 * width] * len(windows)
                left.plot(dots, windows, "o", ms=3, color="black", alpha=0.6)
            shown = [key for key in pkeys if key in rows and "efficiency" in rows[key]]
            if right is None:
                continue
            bars = right.bar(
                [pkeys.index(k) + i * width for k in shown],
                [rows[k]["efficiency"] for k in shown],
                width,
            )
            right.bar_label(bars, fmt="{:.2f}", padding=2)
        slant = dict(rotation=45, ha="right", rotation_mode="anchor") if many else {}
        left.set_xticks([k + offset for k in range(len(keys))], [labels[k] for k in keys], **slant)
        left.set_ylabel("images / s (bar: median window; dots: every window)")
        left.set_title("Throughput")
        left.margins(y=0.12)
        if right is not None:
            right.set_xticks(
                [k + offset for k in range(len(pkeys))], [labels[k] for k in pkeys], **slant
            )
            right.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
            right.set_ylim(0, 1.15)
            right.set_ylabel("throughput / (GPUs x one device)")
            right.set_title("Scaling efficiency")
        fig.legend(loc="lower center", ncol=max(len(docs), 1), frameon=False)
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, dpi=200, transparent=True)
        plt.close(fig)
    image = buffer.getvalue()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(image)
    return image


def plot_html(docs: list[dict]) -> str:
    """The plot as an inline SVG image, for the course site (course.css recolours it dark)."""
    data = base64.b64encode(plot(docs, fmt="svg")).decode()
    scales = any("efficiency" in r for doc in docs for r in doc["rows"])
    alt = "Throughput (median and every window)" + (" and scaling efficiency" if scales else "")
    return f'<img class="course-plot" alt="{alt}" src="data:image/svg+xml;base64,{data}">'


def load(path: str | Path) -> dict:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError(f'{path}: not a `course bench` record (no "kind": "{KIND}")')
    return doc
