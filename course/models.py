"""The models the lessons train: `build_model(name, num_classes, in_channels)`.

    cnn       a small CNN with BatchNorm (~30k parameters) for small images: it
              learns the 8x8 digits to ~95% in seconds on a CPU. The default.
              norm="none" drops the BatchNorm layers (the convolutions get a
              bias instead): every sample's gradient is then independent of
              the other samples in its batch, which is what makes "2 ranks x
              batch B" exactly equivalent to "1 process x batch 2B" (lesson 03).
    resnet18  torchvision's ResNet-18 with a small-image stem (3x3 conv, stride 1,
              no max-pool), the usual adaptation for 32x32 CIFAR-10 images.
    resnet50  torchvision's ResNet-50 unchanged (ImageNet stem, for 224x224
              images): the standard model for throughput benchmarks.
    TinyLM    lesson 10's language-model shape (embedding, MLP blocks, a tied
              head), built directly: TinyLM(vocab, dim, depth).

Weights are random (no downloads). BatchNorm matters for the multi-GPU
lessons: its statistics are per device unless synchronised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NAMES = ("cnn", "resnet18", "resnet50")


NORMS = ("batch", "none")


def _conv_bn_relu(cin: int, cout: int, norm: str = "batch") -> nn.Sequential:
    if norm == "none":
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True))
    # bias=False: the BatchNorm that follows has its own shift.
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


class SmallCNN(nn.Sequential):
    """conv-conv-pool-conv, global average pool, linear: any image size works."""

    def __init__(
        self, num_classes: int = 10, in_channels: int = 1, width: int = 32, norm: str = "batch"
    ):
        super().__init__(
            _conv_bn_relu(in_channels, width, norm),
            _conv_bn_relu(width, width, norm),
            nn.MaxPool2d(2),
            _conv_bn_relu(width, 2 * width, norm),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, num_classes),
        )


def build_model(
    name: str, num_classes: int, in_channels: int = 3, norm: str = "batch"
) -> nn.Module:
    """A fresh model; norm="none" (cnn only) builds it without BatchNorm."""
    if norm not in NORMS:
        raise ValueError(f"--norm {norm}: unknown; use one of {', '.join(NORMS)}")
    if norm != "batch" and name != "cnn":
        raise ValueError(f"--norm {norm} applies to --model cnn only, not {name}")
    if name == "cnn":
        return SmallCNN(num_classes, in_channels, norm=norm)
    if name in ("resnet18", "resnet50"):
        from torchvision import models

        model = getattr(models, name)(weights=None, num_classes=num_classes)
        if name == "resnet18":
            # Small images: a 7x7 stride-2 conv and a max-pool would shrink 32x32 to 8x8.
            model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
            model.maxpool = nn.Identity()
        elif in_channels != 3:
            model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        return model
    raise ValueError(f"--model {name}: unknown; use one of {', '.join(NAMES)}")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Block(nn.Module):
    """A residual MLP block, a transformer block without its attention: x + W2 gelu(W1 norm(x))."""

    def __init__(self, dim: int, hidden: int = 0):
        super().__init__()
        hidden = hidden or 4 * dim  # the MLP's width
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """A language model's shape, for lesson 10: a token embedding, `depth` blocks, a final
    norm and an output head that shares the embedding's weight (tied). Its big tensors are
    2-D weights (embedding, linears), its small ones 1-D (norms, biases): the split that
    FSDP shards and replicates."""

    def __init__(self, vocab: int = 64, dim: int = 64, depth: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one tensor, two uses
        nn.init.normal_(self.embed.weight, std=0.02)  # small logits: a first loss near ln(vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class CausalBlock(nn.Module):
    """A transformer block (lesson 12): causal self-attention, then an MLP, each pre-norm,
    residual and followed by dropout. Its attention is written out, not fused, so backward
    keeps the (heads, T, T) attention weights: the activations that grow with the square of
    the sequence, where the rest grow with the sequence."""

    def __init__(self, dim: int = 64, heads: int = 4, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = self.drop(scores.masked_fill(future, float("-inf")).softmax(-1))
        x = x + self.drop(self.proj((weights @ v).transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.down(F.gelu(self.up(self.norm2(x)))))


class StagedLM(nn.Module):
    """TinyLM's shape for lesson 14, made to be cut into pipeline stages: its head is not
    tied to the embedding (they land on different stages), and its blocks sit in a
    ModuleDict keyed by their index. A stage deletes what it does not run (blocks, the
    embedding or the norm and head, set to None) and every parameter it keeps has the name
    it has in the whole model ("blocks.3.up.weight"): the names a checkpoint is keyed by,
    so that one saved by stages loads into any other cut, or into one process."""

    def __init__(self, vocab: int = 64, dim: int = 64, depth: int = 4, hidden: int = 0):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleDict({str(i): Block(dim, hidden) for i in range(depth)})
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, x):
        """Tokens in (if this stage has the embedding) or activations; logits out (if it
        has the head) or activations."""
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x
