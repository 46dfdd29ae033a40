"""``<!-- output: NAME -->``: a recorded output (docs/results/outputs/NAME.json, written by
`python -m course record`) as a text block, with its provenance folded into one line, in the
page's language."""

from __future__ import annotations

from directives.common import read_record


def render_output(name: str, lang: str = "en") -> str:
    """A recorded output as a text block, its provenance folded into one line that expands
    (in the page's language; the machine's own strings stay as code)."""
    doc = read_record(name)
    prov = doc["provenance"]
    body = "\n".join(["```text", f"$ {doc['shown']}", doc["output"], "```"])
    # One line on a phone: the card's short name ("NVIDIA H100 80GB HBM3": H100); the
    # whole name is in the line that unfolds.
    where = prov["device"].removeprefix("NVIDIA ").split()[0] if prov.get("device") else "CPU"
    torch = prov["torch"].split("+")[0]
    machine = (f"`{prov['machine']}`"
               + (f", `{prov['processor']}`" if prov.get("processor") else ""))  # fmt: skip
    gpu = (f", `{prov['device']}` (CUDA {prov['cuda']}, NCCL {prov['nccl']})"
           if prov.get("device") else "")  # fmt: skip
    command = f"`{prov['command']} {name}`"
    if lang == "zh":
        summary = f"录制于 {prov['date']} · PyTorch {torch} · {where}"
        detail = (
            f"由 {command} 录制：PyTorch {prov['torch']}，Python {prov['python']}，{machine}"
            f"{gpu}。计时每次运行都不同；其他数字由测试套件与参考答案核对"
            + (
                "（在装有这个 PyTorch 的 GPU 机器上）。"
                if prov.get("device")
                else "（换一种处理器，最后几位可能略有不同）。"
            )  # fmt: skip
        )
    else:
        summary = f"Recorded {prov['date']} · PyTorch {torch} · {where}"
        detail = (
            f"By {command}: PyTorch {prov['torch']}, Python {prov['python']}, {machine}{gpu}"
            ". Timings vary from run to run; the other figures are checked against the "
            + (
                "reference by the test suite on a GPU machine with this PyTorch."
                if prov.get("device")
                else "reference by the test suite (another processor can print slightly "
                "other ones)."
            )  # fmt: skip
        )
    return f'{body}\n\n??? course-provenance "{summary}"\n\n    {detail}\n'
