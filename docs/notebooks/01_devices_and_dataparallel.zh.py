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
#   translated_from: 41a619cbf2fe
# ---

# %% [markdown]
# # 设备与 `nn.DataParallel`
#
# 动手看看 PyTorch 在这台机器上看到了什么，以及 `nn.DataParallel` 对一个批次实际做了什么。
# 每个单元格都能在笔记本电脑的 CPU 上运行；说明文字会讲有 GPU 时有什么不同，最后几个单元格在有
# GPU 时会用上它们。

# %%
import copy
import os

import torch
from torch import nn

torch.manual_seed(0)
print("PyTorch", torch.__version__)
print("built for CUDA:", torch.version.cuda or "no (CPU-only build)")
print("CUDA usable:", torch.cuda.is_available())
print("visible GPUs:", torch.cuda.device_count())
print("CPU cores:", os.cpu_count(), "| torch threads:", torch.get_num_threads())

# %% [markdown]
# ## 设备
#
# 设备是张量所在、对它的运算执行的地方。不同设备上的张量从不悄悄混用：用 `.to(device)` 移动它们。
# `cuda:0` 是*这个进程能看到的*第一块 GPU；哪些物理 GPU 可见由 `CUDA_VISIBLE_DEVICES` 决定。

# %%
devices = [torch.device("cpu")]
devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
for device in devices:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        print(f"{device}: {props.name}, {props.total_memory / 2**30:.0f} GiB")
    else:
        print(f"{device}: the host CPU")

x = torch.ones(3)
print("a new tensor lives on", x.device)
try:
    x + torch.ones(3, device="meta")  # the meta device stands in for a GPU here
except Exception as exc:
    print("mixing devices fails:", type(exc).__name__, "-", str(exc).splitlines()[0][:90])

# %% [markdown]
# ## 用 `nn.DataParallel` 包装模型
#
# `nn.DataParallel` 只需一行。在没有 GPU 的机器上它没有可以分摊的设备，于是直接调用模型：代码照样
# 能运行，正好用来试用这个 API。

# %%
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
dp = nn.DataParallel(model)
print("device_ids:", dp.device_ids, "(empty: no GPU, so no splitting)")
batch = torch.randn(6, 8)
print("output shape:", tuple(dp(batch).shape))
print("state_dict keys gain a prefix:", list(dp.state_dict())[:2])

# %% [markdown]
# `module.` 前缀是一个经典陷阱：从包装器保存的检查点加载不进裸模型。应当保存
# `dp.module.state_dict()`，即裸模型的权重。

# %%
bare = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
try:
    bare.load_state_dict(dp.state_dict())
except RuntimeError as exc:
    print("loading the wrapper's state_dict:", str(exc).splitlines()[0])
bare.load_state_dict(dp.module.state_dict())
print("loading dp.module.state_dict(): ok")

# %% [markdown]
# ## 用手模拟 DataParallel 在两块 GPU 上做的事
#
# 有 *N* 块 GPU 时，DataParallel 在每次前向中：
#
# 1. **分发**批次：沿第 0 维切成 *N* 块，每块 GPU 一块；
# 2. **复制**模型：每一步都把每个参数从 `cuda:0` 复制到其他 GPU；
# 3. 在并行的线程中运行各个副本，每块 GPU 一个线程；
# 4. 把输出**收集**回 `cuda:0`，在那里计算损失。
#
# 在 `backward()` 中，梯度沿副本流回，并累加到 `cuda:0` 上的参数里。下面的单元格在 CPU 上用两个
# “设备”走一遍同样的步骤，并检查结果等于一个大批次。

# %%
full = nn.Linear(8, 1)
batch, target = torch.randn(6, 8), torch.randn(6, 1)

# One device, the whole batch.
loss = nn.functional.mse_loss(full(batch), target)
loss.backward()
reference = full.weight.grad.clone()

# Two "devices": scatter, replicate, forward, gather, then sum the gradients.
chunks = batch.chunk(2)  # scatter
replicas = [copy.deepcopy(full) for _ in chunks]  # replicate
for replica in replicas:
    replica.zero_grad()
outputs = torch.cat([r(c) for r, c in zip(replicas, chunks, strict=True)])  # gather
nn.functional.mse_loss(outputs, target).backward()
summed = sum(r.weight.grad for r in replicas)

print("same gradient as one big batch:", torch.allclose(summed, reference, atol=1e-6))

# %% [markdown]
# 数学相同，那为什么不推荐 DataParallel？看看工作落在哪里：批次、输出、损失、梯度和优化器都在
# `cuda:0` 上，它比其他 GPU 更满也更忙。模型在*每一步*都被复制到每块 GPU，而且一个 Python 进程通过
# 线程驱动所有 GPU，这些线程争用 GIL。`DistributedDataParallel`（从第 03 课起）每块 GPU 一个进程，
# 权重只复制一次，之后只交换梯度。

# %% [markdown]
# ## 有 GPU 时
#
# 有两块或更多 GPU 时，这个单元格运行真正的 DataParallel 并显示内存去了哪里；没有时它会说明。
# 预期 `cuda:0` 占用的比其他的多。在两块 H200 上它打印了：
#
# ```text
# output gathered on cuda:0
# cuda:0 max memory 82 MiB
# cuda:1 max memory 58 MiB
# ```
#
# `cuda:0` 上多出的内存是收集来的输出，以及权重和梯度的主副本；它随批次和模型增大。

# %%
if torch.cuda.device_count() >= 2:
    big = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).cuda()
    dp = nn.DataParallel(big)
    out = dp(torch.randn(512, 1024, device="cuda:0"))
    out.float().pow(2).mean().backward()
    print("output gathered on", out.device)
    for i in range(torch.cuda.device_count()):
        print(f"cuda:{i} max memory {torch.cuda.max_memory_allocated(i) / 2**20:.0f} MiB")
else:
    print(f"{torch.cuda.device_count()} GPU(s) here: the real DataParallel run needs 2.")
