"""What lesson 03 does on 2 GPUs when a rank never calls torch.cuda.set_device.

    python docs/results/experiments/no_set_device.py > docs/results/experiments/no_set_device.txt

The experiment behind lesson 03's exercise 3 and its answer. It runs the
reference solution of lesson 03 with nccl on 2 GPUs, as it is and with the
calls that tell each rank its GPU taken out one by one:

    reference            set_device, init_process_group(device_id=...), DDP(device_ids=...)
    no set_device        the torch.cuda.set_device call removed
    no set_device, no device_id   ... and init_process_group without device_id
    ... and no device_ids         ... and DDP without device_ids

While each run trains, it samples `nvidia-smi --query-compute-apps` every
second and prints, per GPU, the processes on it and their largest memory
use; then the run's exit code and last lines. Needs 2 CUDA GPUs.
"""

import datetime
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
LESSON = ROOT / "solutions" / "03_ddp_spawn" / "train.py"
ARGS = ["--backend", "nccl", "--nproc", "2", "--data", "synthetic:8192", "--image-size", "64"]
ARGS += ["--model", "resnet18", "--batch-size", "128", "--epochs", "3", "--quiet"]
VARIANTS = {
    "reference": [],
    "no set_device": [("        torch.cuda.set_device(gpu)\n", "        pass\n")],
}
VARIANTS["no set_device, no device_id"] = [
    *VARIANTS["no set_device"],
    ("timeout=limit, device_id=gpu)", "timeout=limit)"),
]
VARIANTS["... and no device_ids"] = [
    *VARIANTS["no set_device, no device_id"],
    (
        '        model, device_ids=[device.index] if device.type == "cuda" else None,',
        "        model, device_ids=None,",
    ),
]


def smi(*query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True
    ).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line]


def run(name: str, edits) -> None:
    source = LESSON.read_text()
    for old, new in edits:
        assert source.count(old) == 1, f"{name}: {old!r} not found once"
        source = source.replace(old, new)
    gpu_of = {uuid: index for index, uuid in smi("--query-gpu=index,uuid")}
    seen: dict[tuple[str, str], int] = {}  # (gpu, pid) -> largest MiB
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid, uuid, mib in smi("--query-compute-apps=pid,gpu_uuid,used_memory"):
                key = (gpu_of.get(uuid, uuid), pid)
                seen[key] = max(seen.get(key, 0), int(mib) if mib.isdigit() else 0)
            time.sleep(1)

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(source)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COURSE_PG_TIMEOUT": "60"}
        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        tic = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(script), *ARGS],
            capture_output=True, text=True, env=env, cwd=tmp, timeout=240,
        )  # fmt: skip
        seconds = time.monotonic() - tic
        done.set()
        thread.join()
    print(f"== {name}: exit code {proc.returncode} after {seconds:.0f} s")
    for gpu in sorted({g for g, _ in seen}):
        apps = sorted((pid, mib) for (g, pid), mib in seen.items() if g == gpu)
        listed = ", ".join(f"pid {pid} {mib} MiB" for pid, mib in apps)
        print(f"   GPU {gpu}: {len(apps)} process(es): {listed}")
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    for line in lines[-3:]:
        print(f"   | {line[:160]}")


def main() -> None:
    if torch.cuda.device_count() < 2:
        sys.exit("no_set_device.py: needs 2 CUDA GPUs")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"# {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}, NCCL "
        f"{'.'.join(map(str, torch.cuda.nccl.version()))}, {when}"
    )
    print(f"# python docs/results/experiments/no_set_device.py  (lesson 03: {' '.join(ARGS)})")
    for name, edits in VARIANTS.items():
        run(name, edits)


if __name__ == "__main__":
    main()
