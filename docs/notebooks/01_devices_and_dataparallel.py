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
# # Devices and `nn.DataParallel`
#
# A hands-on look at what PyTorch sees on this machine and at what
# `nn.DataParallel` really does with a batch. Every cell runs on a laptop CPU;
# the notes say what changes when GPUs are present, and the last cells use
# them if they are there.

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
# ## Devices
#
# A device is where a tensor lives and where operations on it run. Tensors
# on different devices never mix silently: you move them with `.to(device)`.
# `cuda:0` is the first GPU *this process can see*; `CUDA_VISIBLE_DEVICES`
# decides which physical GPUs those are.

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
# ## Wrapping a model in `nn.DataParallel`
#
# `nn.DataParallel` is one line. On a machine without GPUs it has no devices
# to spread over, so it simply calls the model: the code still runs, which
# makes it handy for trying the API out.

# %%
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
dp = nn.DataParallel(model)
print("device_ids:", dp.device_ids, "(empty: no GPU, so no splitting)")
batch = torch.randn(6, 8)
print("output shape:", tuple(dp(batch).shape))
print("state_dict keys gain a prefix:", list(dp.state_dict())[:2])

# %% [markdown]
# The `module.` prefix is a classic trap: a checkpoint saved from the wrapper
# does not load into a bare model. Save `dp.module.state_dict()` instead, the
# bare model's weights.

# %%
bare = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
try:
    bare.load_state_dict(dp.state_dict())
except RuntimeError as exc:
    print("loading the wrapper's state_dict:", str(exc).splitlines()[0])
bare.load_state_dict(dp.module.state_dict())
print("loading dp.module.state_dict(): ok")

# %% [markdown]
# ## What DataParallel does with two GPUs, by hand
#
# On every forward pass with *N* GPUs, DataParallel
#
# 1. **scatters** the batch: splits it along dimension 0 into *N* chunks, one
#    per GPU;
# 2. **replicates** the model: copies every parameter from `cuda:0` to the
#    other GPUs, on every step;
# 3. runs the replicas in parallel threads, one per GPU;
# 4. **gathers** the outputs back onto `cuda:0`, where the loss is computed.
#
# In `backward()` the gradients flow back through the copies and are summed
# into the parameters on `cuda:0`. The cell below plays the same steps on the
# CPU with two "devices", and checks that the result equals one big batch.

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
# Same mathematics, so why is DataParallel discouraged? Look at where the
# work lands: the batch, the outputs, the loss, the gradients and the
# optimizer all live on `cuda:0`, which becomes both fuller and busier than
# the others. The model is copied to every GPU on *every step*, and one
# Python process drives all GPUs through threads that contend for the GIL.
# `DistributedDataParallel` (lesson 03 on) runs one process per GPU, copies
# the weights once, and only exchanges gradients.

# %% [markdown]
# ## With GPUs
#
# With two or more GPUs this cell runs the real thing and shows where the
# memory went; without them it says so. Expect `cuda:0` to hold more than
# the others. On two H200s it printed:
#
# ```text
# output gathered on cuda:0
# cuda:0 max memory 82 MiB
# cuda:1 max memory 58 MiB
# ```
#
# The extra memory on `cuda:0` is the gathered output and the master copy
# of the weights and their gradients; it grows with the batch and the model.

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
