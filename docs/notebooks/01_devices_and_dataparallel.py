# %% [markdown]
# # Devices
# %%
import torch
print(torch.__version__)
