# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Launching DDP from a notebook
#
# Notebooks are a good place to explore a model, and a bad place to start
# distributed processes from. This notebook shows the failure you will meet
# first, explains it, and then shows two ways that work:
#
# 1. put the worker function in a `.py` file and `mp.spawn` it from here;
# 2. start `torchrun` on a script as a subprocess.
#
# Everything runs on CPU with the `gloo` backend and two ranks, so it works on
# a laptop. On a GPU machine only the backend (`nccl`) and the device of each
# rank (`cuda:<rank>`) change.

# %%
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

# Two processes on a small machine: one thread each, or they fight over the cores.
os.environ["OMP_NUM_THREADS"] = "1"
WORLD_SIZE = 2


def free_port() -> int:
    """A port nobody listens on, picked now: a fixed port collides with other jobs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def children_stderr(path: Path):
    """Send this process's stderr, which spawned children inherit, to a file.

    A child's traceback is written to the kernel's stderr, not to the notebook,
    so without this you would only see that a child died, not why.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


print("torch", torch.__version__, "| CUDA GPUs:", torch.cuda.device_count())

# %% [markdown]
# ## 1. The obvious way fails
#
# Define the worker right here and hand it to `mp.spawn`, exactly as a script
# would:


# %%
def hello(rank: int, world_size: int) -> None:
    print(f"hello from rank {rank} of {world_size}")


# One child is enough to show the failure, and its traceback is then whole: with two,
# mp.spawn stops the second as soon as the first dies, often in the middle of its own.
log = Path(tempfile.mkdtemp()) / "children.log"
try:
    with children_stderr(log):
        mp.spawn(hello, args=(1,), nprocs=1, join=True)
    outcome = "no error?"
except Exception as exc:  # the point of this cell is to show the error
    outcome = f"{type(exc).__name__}: {exc}"
print("mp.spawn raised ->", outcome)
print("\nWhat a child printed before it died:")
# The error line of its traceback (the lines above it are the multiprocessing frames).
lines = log.read_text().strip().splitlines()
print(next((line for line in lines if "Error:" in line), "\n".join(lines[-3:])))

# %% [markdown]
# ### Why
#
# `mp.spawn` uses the *spawn* start method: each child is a **fresh Python
# interpreter**, not a copy of this one. The parent sends the child the
# function to run *by reference*, pickled as "the attribute `hello` of module
# `__main__`", and the child finds it by importing that module again.
#
# For a script, `__main__` is a file: the child re-imports it (as
# `__mp_main__`, which is why scripts need the `if __name__ == "__main__":`
# guard) and finds the function. A notebook's `__main__` is the kernel's
# in-memory namespace: there is no file to re-import, so the child's
# `__main__` is empty and the lookup fails with the `AttributeError` above.
# The parent only learns that a child exited with code 1.
#
# The *fork* start method would copy the notebook's memory instead and seem
# to work, but forking a process that has already started CUDA or other
# threads is unsafe, and PyTorch refuses to use CUDA in a forked child. Use a
# file.

# %% [markdown]
# ## 2. Works: the worker lives in a `.py` file
#
# `docs/notebooks/ddp_worker.py` sits next to this notebook. Its
# `run(rank, world_size, port, out)` joins a process group, trains a linear
# model with DDP for a few steps and writes each rank's losses and final
# weights to a JSON file: a child's `print` goes to the kernel's terminal,
# not to this notebook, so results come back through files.

# %%
import ddp_worker  # noqa: E402 - imported here, where the notebook explains it

out = Path(tempfile.mkdtemp(prefix="ddp-spawn-"))
port = free_port()
mp.spawn(ddp_worker.run, args=(WORLD_SIZE, port, str(out)), nprocs=WORLD_SIZE, join=True)

results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
for r in results:
    print(f"rank {r['rank']}: losses {r['losses']}")
    print(f"        weights {r['weights']}")
assert results[0]["weights"] == results[1]["weights"], "DDP ranks disagree"
print("\nBoth ranks saw different data but ended with identical weights.")

# %% [markdown]
# Each rank trained on its own data (the losses differ), yet the weights are
# identical: during `backward()` DDP averaged the gradients of both ranks, so
# every optimizer step applied the same update everywhere.

# %% [markdown]
# ## 3. Works: `torchrun` as a subprocess
#
# The launcher the course uses from lesson 04 on. It starts its own worker
# processes from the script, so nothing has to be pickled from this kernel at
# all, and it sets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and
# `MASTER_PORT` for each worker. `python -m torch.distributed.run` is the
# same program as `torchrun`, found through the kernel's own interpreter.

# %%
out = Path(tempfile.mkdtemp(prefix="ddp-torchrun-"))
command = [
    sys.executable, "-m", "torch.distributed.run",
    f"--nproc-per-node={WORLD_SIZE}",
    "--master-addr=127.0.0.1",
    f"--master-port={free_port()}",
    "ddp_worker.py", "--out", str(out),
]  # fmt: skip
print("$", " ".join(command[2:]))
done = subprocess.run(command, capture_output=True, text=True, timeout=180)
print(done.stdout.strip())
if done.returncode != 0:
    print(done.stderr.strip()[-3000:])
assert done.returncode == 0, f"torchrun exited with {done.returncode}"

results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
assert results[0]["weights"] == results[1]["weights"]
print("torchrun: both ranks agree on the weights.")

# %% [markdown]
# ## What changes on GPUs
#
# - backend `nccl` instead of `gloo`, and `torch.cuda.set_device(rank)`
#   before `init_process_group`, with the model on `cuda:<rank>` and
#   `DDP(model, device_ids=[rank])`;
# - `nprocs` / `--nproc-per-node` equal to the number of GPUs;
# - nothing else: the worker-in-a-file rule is the same, and so is the reason.
#
# For real training prefer a terminal (or `!torchrun ...` in a cell): a
# notebook kernel that dies takes its children's output with it.
