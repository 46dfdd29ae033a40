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
#   translated_from: 1a4d50190ea0
# ---

# %% [markdown]
# # 从 Notebook 启动 DDP
#
# Notebook 适合探索模型，却不适合从中启动分布式进程。这个 Notebook 先展示你首先会遇到的失败，解释它，
# 然后展示两种可行的办法：
#
# 1. 把 worker 函数放进一个 `.py` 文件，从这里用 `mp.spawn` 启动它；
# 2. 以子进程方式对一个脚本启动 `torchrun`。
#
# 一切都在 CPU 上用 `gloo` 后端和两个 rank 运行，所以笔记本电脑上也能跑。在 GPU 机器上只有后端
# （`nccl`）和每个 rank 的设备（`cuda:<rank>`）不同。

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
# ## 1. 显而易见的做法会失败
#
# 就在这里定义 worker，把它交给 `mp.spawn`，和脚本里的写法完全一样：

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
# ### 为什么
#
# `mp.spawn` 使用 *spawn* 启动方式：每个子进程都是一个**全新的 Python 解释器**，而不是当前进程的
# 副本。父进程把要运行的函数*按引用*发给子进程，pickle 成“模块 `__main__` 的属性 `hello`”，子进程
# 通过重新导入该模块来找到它。
#
# 对脚本来说，`__main__` 是一个文件：子进程重新导入它（作为 `__mp_main__`，这就是脚本需要
# `if __name__ == "__main__":` 保护的原因）并找到函数。Notebook 的 `__main__` 是内核的内存命名空间：
# 没有可以重新导入的文件，所以子进程的 `__main__` 是空的，查找以上面的 `AttributeError` 失败。
# 父进程只知道有一个子进程以代码 1 退出。
#
# *fork* 启动方式会复制 Notebook 的内存，看起来能行，但在已经启动了 CUDA 或其他线程的进程里 fork
# 是不安全的，PyTorch 也拒绝在 fork 出的子进程中使用 CUDA。请使用文件。

# %% [markdown]
# ## 2. 可行：worker 放在 `.py` 文件里
#
# `docs/notebooks/ddp_worker.py` 就在这个 Notebook 旁边。它的 `run(rank, world_size, port, out)` 加入进程组，
# 用 DDP 训练一个线性模型若干步，并把每个 rank 的损失和最终权重写进一个 JSON 文件：子进程的 `print`
# 输出到内核的终端，而不是这个 Notebook，所以结果通过文件传回来。

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
# 每个 rank 在自己的数据上训练（损失不同），权重却完全相同：在 `backward()` 期间 DDP 对两个 rank
# 的梯度取了平均，所以每次优化器更新在所有地方都施加了相同的更新。

# %% [markdown]
# ## 3. 可行：以子进程方式运行 `torchrun`
#
# 这是本课程从第 04 课起使用的启动器。它从脚本启动自己的 worker 进程，所以完全不需要从这个内核
# pickle 任何东西，并为每个 worker 设置 `RANK`、`LOCAL_RANK`、`WORLD_SIZE`、`MASTER_ADDR` 和
# `MASTER_PORT`。`python -m torch.distributed.run` 与 `torchrun` 是同一个程序，通过内核自己的解释器找到。

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
# ## 在 GPU 上有什么不同
#
# - 后端用 `nccl` 而不是 `gloo`，在 `init_process_group` 之前调用 `torch.cuda.set_device(rank)`，
#   模型放在 `cuda:<rank>` 上，并用 `DDP(model, device_ids=[rank])`；
# - `nprocs` / `--nproc-per-node` 等于 GPU 的数量；
# - 别的都不变：worker 放进文件的规则相同，原因也相同。
#
# 真正训练时更推荐终端（或在单元格里用 `!torchrun ...`）：Notebook 内核一旦崩溃，子进程的输出也随之
# 丢失。
