"""Lesson 07's cluster recipes (solutions/07_multinode/): the Slurm script and the Kubernetes
PyTorchJob must hand the launcher flags it accepts, and turn into the torchrun command
the page explains. Neither scheduler runs here: each recipe's launcher line is taken out,
its variables are given the values the scheduler would set, and the reference launcher
runs it with --dry-run (it prints the torchrun command and starts nothing).
"""

from __future__ import annotations

import re
import shlex
import string
import sys
from pathlib import Path

import pytest

from course import REPO_ROOT, launch

yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifest (the dev extra installs it)")

FOLDER = REPO_ROOT / "solutions" / "07_multinode"
LAUNCH = "lessons/07_multinode/launch.py"


def dry_run(command: str, values: dict[str, str]) -> str:
    """Run the recipe's launcher line with `values` for its variables, with --dry-run."""
    line = string.Template(command.replace('"', "")).substitute(values)
    words = shlex.split(line)
    start = words.index(LAUNCH)
    words[start] = str(FOLDER / "launch.py")
    split = words.index("--")
    words[split:split] = ["--dry-run"]
    result = launch.run([sys.executable, *words[start:]], timeout=30, cwd=REPO_ROOT)
    assert result.ok, result.describe()
    return result.output


def test_slurm_script_starts_one_launcher_per_node():
    text = (FOLDER / "slurm.sbatch").read_text()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    assert directives["nodes"] == "2" and directives["ntasks-per-node"] == "1"
    srun = re.search(r"^srun (.*?)(?<!\\)$", text, re.M | re.S).group(1).replace("\\\n", " ")
    values = {
        "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_GPUS_ON_NODE": "4",
        "head_node": "gpu-node-17", "SLURM_JOB_ID": "4242",
    }  # fmt: skip
    out = dry_run(srun, values)
    for flag in ("--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d"):
        assert flag in out, out
    assert "--rdzv_endpoint=gpu-node-17:29400" in out and "--rdzv_id=4242" in out, out
    assert "lessons/04_torchrun/train.py --backend nccl --snapshot" in out, out
    # Slurm does not create --output's folder: the script says to, before it is submitted.
    folder = str(Path(directives["output"]).parent)
    assert f"mkdir -p {folder} && sbatch" in text, f"no `mkdir -p {folder}` before sbatch"


def test_pytorchjob_has_a_master_and_a_worker_running_the_launcher():
    job = yaml.safe_load((FOLDER / "pytorchjob.yaml").read_text())
    assert job["kind"] == "PyTorchJob" and job["apiVersion"] == "kubeflow.org/v1"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] >= 1
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    values = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "course-07-master-0"}
    out = dry_run(container["args"][0], {**values, "MASTER_PORT": "23456"})
    assert "--nnodes=2" in out and "--rdzv_endpoint=course-07-master-0:23456" in out, out
    assert "--nproc_per_node=4" in out and "--max_restarts=3" in out, out
