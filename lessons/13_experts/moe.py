"""Lesson 13 - mixture of experts, part 1: a router, top-2, capacity and the balancing loss.

Run it:
    python lessons/13_experts/moe.py                         # 8 experts, top-2, balancing loss
    python lessons/13_experts/moe.py --aux-weight 0          # no balancing loss: watch the load
    python lessons/13_experts/moe.py --capacity-factor 2     # room for twice the average
    python -m course grade 13                                # grade your version
"""

import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from course import data, options, runtime
from course.runtime import exit_with_one_line

VOCAB = 64


def parse_args(argv=None):
    p = options.ArgumentParser(prog="moe.py", description=__doc__.splitlines()[0])
    p.add_argument("--experts", type=options.positive_int, default=8)
    p.add_argument("--top-k", type=options.positive_int, default=2, help="experts a token")
    p.add_argument("--capacity-factor", type=options.positive_float, default=1.25)
    p.add_argument("--aux-weight", type=options.non_negative_float, default=0.01,
                   help="the balancing loss's weight (0: none)")  # fmt: skip
    p.add_argument("--dim", type=options.positive_int, default=32, help="model width")
    p.add_argument("--batch-size", type=options.positive_int, default=32, help="sequences")
    p.add_argument("--steps", type=options.positive_int, default=300)
    p.add_argument("--seed", type=int, default=0, help="the initial weights' seed")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--time", action="store_true",
                   help="no training: time one layer against a dense MLP")  # fmt: skip
    args = p.parse_args(argv)
    if args.top_k > args.experts:
        p.error(f"--top-k {args.top_k} is more than the {args.experts} experts")
    return args


# --8<-- [start:route]
def route(logits, k: int):
    """Each token's k experts: the softmax over experts (every probability, for the
    balancing loss), and the k largest, their gates renormalised to sum to 1."""
    # TODO: return (probs, gates, experts): probs (tokens, E); gates and experts (tokens, k).
    raise NotImplementedError("TODO at 13_experts/moe.py:50 is not done yet")


def capacity(tokens: int, experts: int, k: int, factor: float) -> int:
    """How many tokens an expert takes at most: the average share, times the factor."""
    return math.ceil(factor * tokens * k / experts)


def kept(experts, n_experts: int, cap: int):
    """Which of each token's k choices its expert still has room for, (tokens, k) bool. An
    expert takes tokens in order, every token's first choice before any second choice
    (GShard's priority): a token keeps its first choice whenever it can."""
    # TODO: number the choices slot by slot (every token's first, then every token's
    # second...); a choice is kept if fewer than `cap` earlier choices went to its expert.
    raise NotImplementedError("TODO at 13_experts/moe.py:64 is not done yet")


def balance_loss(probs, experts, n_experts: int):
    """Switch Transformer's auxiliary loss: n_experts x sum over experts of (the share of
    choices it gets) x (its mean probability). 1 when both are uniform, up to n_experts."""
    # TODO: the shares count every choice, kept or dropped; the probabilities are every
    # token's softmax, averaged over the tokens.
    raise NotImplementedError("TODO at 13_experts/moe.py:72 is not done yet")


# --8<-- [end:route]


class Expert(nn.Sequential):
    def __init__(self, dim: int):
        super().__init__(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))


# --8<-- [start:layer]
class MoE(nn.Module):
    """A mixture-of-experts MLP: each token goes to its k experts (those with room), and
    their outputs come back weighted by the gates."""

    def __init__(self, dim: int, n_experts: int, k: int = 2, factor: float = 1.25):
        super().__init__()
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim) for _ in range(n_experts))
        self.k, self.factor = k, factor

    def forward(self, x):
        """x: (tokens, dim). Returns the output, the balancing loss, and what routing did."""
        n = len(self.experts)
        probs, gates, experts = route(self.router(x), self.k)
        keep = kept(experts, n, capacity(len(x), n, self.k, self.factor))
        out = torch.zeros_like(x)
        # TODO: for each expert, run it on the tokens that chose it and were kept, and add
        # its output times their gate into those tokens' rows of `out`.
        raise NotImplementedError("TODO at 13_experts/moe.py:102 is not done yet")
        load = torch.bincount(experts.flatten(), minlength=n)
        return out, balance_loss(probs, experts, n), {"load": load, "dropped": (~keep).sum()}


# --8<-- [end:layer]


class Model(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, args.dim)
        self.norm = nn.LayerNorm(args.dim)
        self.moe = MoE(args.dim, args.experts, args.top_k, args.capacity_factor)
        self.head = nn.Linear(args.dim, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens).flatten(0, 1)  # every token of the batch, one row each
        y, aux, stats = self.moe(self.norm(x))
        return self.head(x + y), aux, stats


def timed(args, device) -> None:
    """The MoE layer against a dense MLP with the parameters one token uses (k experts'
    hidden units): forward and backward on batch-size x 16 tokens, median of 20."""
    d, k = args.dim, args.top_k
    moe = MoE(d, args.experts, k, args.capacity_factor).to(device)
    dense = nn.Sequential(nn.Linear(d, 2 * d * k), nn.GELU(), nn.Linear(2 * d * k, d)).to(device)
    x = torch.randn(args.batch_size * 16, d, device=device)
    for name, layer in (("MoE", lambda: moe(x)[0]), ("dense", lambda: dense(x))):
        times = []
        for _ in range(25):  # the first 5 warm up
            start = time.perf_counter()
            layer().sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        ms = 1000 * statistics.median(times[5:])
        held = sum(p.numel() for p in (moe if name == "MoE" else dense).parameters())
        print(f"{name:>6}: {ms:7.2f} ms forward and backward, {len(x)} tokens, {held:,} parameters")


def main(argv=None) -> None:
    args = parse_args(argv)
    device = runtime.pick_device(args.device)
    runtime.seed_everything(args.seed)
    if args.time:
        return timed(args, device)
    model = Model(args).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    print(f"{args.experts} experts, top-{args.top_k}, capacity factor "
          f"{args.capacity_factor:g}, balancing loss x {args.aux_weight:g}")  # fmt: skip
    after = []  # (busiest expert over the mean, dropped share), each step after the first quarter
    for step in range(1, args.steps + 1):
        tokens, targets = (
            t.to(device) for t in data.lookup_tokens(step, 0, args.batch_size, VOCAB)
        )
        logits, aux, stats = model(tokens)
        loss = F.cross_entropy(logits, targets.flatten())
        (loss + args.aux_weight * aux).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        load, dropped = stats["load"].float(), stats["dropped"].item() / (len(logits) * args.top_k)
        busiest = (load.max() / load.mean()).item()
        if step > args.steps // 4:  # after the first quarter: the router has settled
            after.append((busiest, dropped))
        if step % 50 == 0 or step == 1:
            print(f"step {step}/{args.steps}: loss {loss.item():.4f}, busiest expert "
                  f"{busiest:.2f} x the mean, dropped {dropped:.1%}", flush=True)  # fmt: skip
    mean = [sum(column) / len(column) for column in zip(*after, strict=True)]
    print(f"steps {args.steps // 4 + 1}-{args.steps}: busiest expert {mean[0]:.3f} x the mean "
          f"on average, {mean[1]:.2%} of the choices dropped")  # fmt: skip


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
