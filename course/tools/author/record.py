"""Recorded outputs for the site: `python -m course record [NAME ...]`.

A page never shows an output block typed by hand. It shows a record: the
reference solution run on the CPU by this command (on GPUs, for the few
recordings that name them: only where they are visible), its exact output,
and where and when it ran. tests/site/test_recorded_outputs.py runs the same commands
again and fails when what they print today differs from the record (timings
and throughput aside, which differ from run to run), so a page cannot drift
from the code. Re-record with `python -m course record` after a change.

Records live in docs/results/outputs/NAME.json; a page includes one with
`<!-- output: NAME -->` and quotes a single figure with `[[fact:NAME:KEY]]`.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
from pathlib import Path

from course import REPO_ROOT, atomic, launch
from course.launch.warm import protocol
from course.tools.author.recording_catalogue import EARLY, Recording
from course.tools.author.recordings_late import LATE

FOLDER = REPO_ROOT / "docs" / "results" / "outputs"
RECORDINGS = (*EARLY, *LATE)

# Figures that change from run to run: masked before a record is compared.
VOLATILE = [
    (re.compile(r"[\d,]+ img/s"), "N img/s"),
    (re.compile(r"\([\d.]+ s training\)"), "(N s training)"),
    (re.compile(r"t=[\d.]+"), "t=N"),
    (re.compile(r"restart overhead: [\d.]+ s"), "restart overhead: N s"),
    # torchrun's own log lines: "W1129 18:26:01.851000 4912 torch/...", pids, paths
    (re.compile(r"^([WEI])\d{4} [\d:.]+ \d+ ", re.M), r"\1 "),
    (re.compile(r"\S*(torch/\S+\.py):\d+\]"), r"\1]"),
    (re.compile(r"\b(pid:? )\d+"), r"\1N"),
    (re.compile(r"(Sending process )\d+"), r"\1N"),
    (re.compile(r"(of binary: )\S+"), r"\1python"),
    (re.compile(r"(did not receive grad for rank )\d+"), r"\1N"),  # the first rank to fail
    (re.compile(r"Thread 0x[0-9a-f]+"), "Thread 0x..."),  # faulthandler's stacks
    # course clock's timings, and the data-wait share derived from them
    (re.compile(r"steps [\d.]+ ms \([\d.]+ ms a step\)"), "steps N ms (N ms a step)"),
    (re.compile(r"data wait \d+%"), "data wait N%"),
    # lesson 11: a bubble measured on a shared processor
    (re.compile(r"bubble [\d.]+ of the step"), "bubble N of the step"),
    # lesson 09: find_unused_parameters' cost, timed (python -m course find-unused)
    (re.compile(r"(forward|step) -?\d+ to -?\d+ us"), r"\1 N to N us"),
    (re.compile(r" *-?\d+ us\b"), " N us"),  # the padding too: widths vary
    (re.compile(r"[+-][\d.]+ % a step"), "N % a step"),
    # the GPU's model, which a record on GPUs names: another model prints the same claims
    (re.compile(r"\bon (?:NVIDIA|AMD) [^,\n]+"), "on GPU"),
    # lesson 12: a step's time, in checkpoint.py's sweep (its last column) and ring.py's lines
    (
        re.compile(r"^(\s*\d+\s+(?:none|full|selective|hand)(?:\s+[\d.]+){3})\s+[\d.]+$", re.M),
        r"\1 N",
    ),
    (re.compile(r"step \d+ ms,"), "step N ms,"),
    # ...and ring.py's peak: the all-gather's varies by a buffer (1.3 MiB in 5) from run to run
    (re.compile(r"peak [\d.]+ MiB, step"), "peak N MiB, step"),
    # lesson 13: moe.py --time
    (re.compile(r" *[\d.]+ ms forward and backward"), " N ms forward and backward"),
]
# Lines a record leaves out, because whether and in which form they appear
# varies from run to run: the traceback a surviving rank prints when its peer
# is killed (if it gets that far before torchrun stops it), and torchrun's own
# log lines ("W1130 02:21:27.759000 7418 .../api.py:1028] ...": which rank it
# reports first depends on timing), and the course's own notes (a launch
# repeated after torchrun's error-file race, course/launch/).
DROPPED = re.compile(r"^(\[rank\d+\]:|[WEI]\d{4} \d\d:|course: )")


def cleaned(output: str, keep: str | None = None) -> str:
    """The output as a record keeps it: DROPPED lines out, only `keep`'s lines if given,
    and paths relative to the course (a stack's files: the clone's folder varies)."""
    output = re.sub(r'[^\s"]*/site-packages/', ".../site-packages/", output)
    output = output.replace(f"{REPO_ROOT}/", "")
    lines = output.strip("\n").splitlines()
    kept = [line for line in lines if not DROPPED.match(line)]
    return "\n".join(line for line in kept if keep is None or re.search(keep, line))


FACTS = {
    "final_accuracy": re.compile(r"final test accuracy ([\d.]+%)"),
    "steps": re.compile(r"after (\d+) steps"),
    "epoch1_test_loss": re.compile(r"epoch 1/\d+: .*?test loss ([\d.]+)"),
    "epoch1_accuracy": re.compile(r"epoch 1/\d+: .*?test accuracy ([\d.]+%)"),
    # lesson 10's FSDP2: block parameters still whole after forward, of how many
    "whole_after_forward": re.compile(r"after forward (\d+) of \d+ block parameters"),
    "block_parameters": re.compile(r"after forward \d+ of (\d+) block parameters"),
    # lesson 09: what find_unused_parameters=True costs (python -m course find-unused)
    "autograd_nodes": re.compile(r"walks after each forward: (\d+) autograd nodes"),
    "find_unused_forward": re.compile(r"True - False \(paired\) +(-?\d+ us)"),
    "find_unused_step": re.compile(r"True - False \(paired\) +-?\d+ us +(-?\d+ us)"),
    "find_unused_share": re.compile(r"find_unused_parameters=True: ([+-][\d.]+ %) a step"),
    # lesson 09's oom.py on a GPU: what the CUDA allocator held at most in step 1
    "cuda_peak": re.compile(r"step 1: .*allocated at most ([\d.]+ MiB)"),
}


def masked(text: str) -> str:
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def facts(output: str) -> dict[str, str]:
    found = {}
    for key, pattern in FACTS.items():
        match = pattern.search(output)
        if match:
            found[key] = match.group(1)
    killed = re.search(r"SIGKILL at t=([\d.]+)", output)
    resumed = re.search(r"first step after the restart done at t=([\d.]+)", output)
    if killed and resumed:  # lesson 04: from the kill to the first step after the restart
        found["restart_overhead"] = f"{float(resumed.group(1)) - float(killed.group(1)):.1f} s"
    return found


def get(name: str) -> Recording:
    for recording in RECORDINGS:
        if recording.name == name:
            return recording
    known = ", ".join(r.name for r in RECORDINGS)
    raise ValueError(f"no recording {name!r}; known: {known}")


# The CPU kernels PyTorch and oneDNN pick depend on the processor's vector instructions,
# and the environment caps them: KERNELS names each set. Every recording and its check run
# with the AVX2 kernels, which every x86-64 machine of the last decade has, and with one
# thread per process whatever the caller's OMP_NUM_THREADS says (course.launch pins it).
# That narrows what the processor changes, and does not remove it: on an AMX Xeon lesson
# 01's epoch-3 test accuracy was 96.66 %, on the processor of the records 97.49 %, both
# pinned; the `default` kernels print the Xeon's figures on the records' processor. So the
# suite checks each record with its own kernels and with OTHER_KERNELS, which every x86-64
# processor runs: what another processor would print, seen on one machine
# (course/tools/author/agreement.py says how far each kind of figure may move).
KERNELS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
PINNED_ENV = KERNELS["avx2"]
OTHER_KERNELS = "default"


def capability_note(environ, capability: str) -> str | None:
    """One line for a student whose CPU runs other kernels than the records' (`capability`:
    torch.backends.cpu.get_cpu_capability()): their last digits will differ, and how to
    get the page's. None where the environment pins the records' kernels, or they match."""
    pinned = environ.get("ATEN_CPU_CAPABILITY", "").lower() == PINNED_ENV["ATEN_CPU_CAPABILITY"]
    if pinned or capability.lower() == PINNED_ENV["ATEN_CPU_CAPABILITY"]:
        return None
    same = " ".join(f"{k}={v}" for k, v in {**PINNED_ENV, "OMP_NUM_THREADS": "1"}.items())
    return (f"note: this CPU runs PyTorch's {capability} kernels, the pages were recorded "
            f"with {PINNED_ENV['ATEN_CPU_CAPABILITY'].upper()}: losses and accuracies may "
            f"differ in the last digits. {same} before the command prints the pages' "
            "numbers.")  # fmt: skip


def say_capability() -> None:
    """Print capability_note's line, where the environment does not pin the kernels."""
    import torch

    if not os.environ.get("ATEN_CPU_CAPABILITY"):
        note = capability_note(os.environ, torch.backends.cpu.get_cpu_capability())
        if note:
            print(note, flush=True)


def run(recording: Recording, cwd: Path, kernels: str = "avx2") -> launch.RunResult:
    """Run the recording's command with one CPU thread per process, so that the
    figures do not depend on the machine's core count (the order of a parallel
    sum does), and with KERNELS[kernels] (PINNED_ENV's, unless the suite asks what
    another processor's would print); into a file, the lessons draw no progress bars."""
    start = launch.run_torchrun if recording.torchrun else launch.run
    env = {**KERNELS[kernels], **dict(recording.env)}
    if not recording.gpus:  # a CPU recording stays one where GPUs are visible (device auto)
        env["CUDA_VISIBLE_DEVICES"] = ""
    if recording.stacks:
        env[protocol.SWITCH_ENV] = "0"
    if recording.before:  # what the recorded command starts from, in the same folder
        first = launch.run(args=recording.before_command(), timeout=180, cwd=cwd, env=env)
        if not first.ok:
            return first
    return start(args=recording.command(), timeout=180, cwd=cwd, env=env)


def processor() -> str:
    """The processor, as /proc/cpuinfo names it, with the vector extensions that choose
    CPU kernels (the pins above cap some, not all: oneDNN's and MKL's choices also follow
    the model). A record made on another processor may print other figures."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(
        line.split(":", 1) for line in info.splitlines()[:40] if ":" in line
    )  # the first processor's block
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    extensions = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{fields.get('model name', platform.machine())} ({' '.join(extensions) or 'no AVX2'})"


def provenance(gpus: int = 0) -> dict:
    """Where the record was made; for a recording on GPUs, which ones too."""
    import torch

    import course

    info = {
        "course": course.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, OMP_NUM_THREADS=1, "
        + ", ".join(f"{k}={v}" for k, v in PINNED_ENV.items()),
        "processor": processor(),
        "date": datetime.date.today().isoformat(),
        "command": "python -m course record",
    }
    if gpus:
        info["device"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = gpus
        info["cuda"] = torch.version.cuda or ""
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return info


def record(recording: Recording, cwd: Path) -> dict:
    result = run(recording, cwd)
    if result.timed_out or result.returncode != recording.exit_code:
        raise RuntimeError(
            f"{recording.name}: expected exit code {recording.exit_code}\n{result.describe()}"
        )
    output = cleaned(result.output, recording.keep)
    return {
        "kind": "course-record",
        "name": recording.name,
        "what": recording.what,
        "shown": recording.shown(),
        "output": output,
        "facts": facts(output),
        "provenance": provenance(recording.gpus),
    }


def load(name: str) -> dict:
    path = FOLDER / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such record (python -m course record {name})")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from course import runtime  # torch: not for the site's hook, which reads records
    from course.options import ArgumentParser  # errors in one line

    parser = ArgumentParser(prog="python -m course record", description=__doc__)
    parser.add_argument("names", nargs="*", help="which recordings (default: all)")
    args = parser.parse_args(argv)
    chosen = [get(n) for n in args.names] or list(RECORDINGS)
    gpus = runtime.visible_gpus() if any(r.gpus for r in chosen) else 0
    for recording in [r for r in chosen if r.gpus > gpus]:
        # named: an error; among all of them: left for a machine that has the GPUs
        message = f"{recording.name} needs {recording.gpus} GPU(s), this machine has {gpus}"
        if args.names:
            parser.error(message)
        print(f"skipped {message}")
    FOLDER.mkdir(parents=True, exist_ok=True)
    for recording in [r for r in chosen if r.gpus <= gpus]:
        with tempfile.TemporaryDirectory() as tmp:
            doc = record(recording, Path(tmp))
        path = FOLDER / f"{recording.name}.json"
        atomic.write_json(doc, path, indent=1)
        print(f"wrote {path.relative_to(REPO_ROOT)}: {doc['facts']}")
    return 0
