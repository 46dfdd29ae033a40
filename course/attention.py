"""Attention one block at a time (lesson 12): what a rank computes of the whole attention
when it holds only some of the keys and values.

A block's queries attend to a block of keys; `attend` returns the output and each row's
log-sum-exp of the scores, which is what lets two blocks' outputs be merged afterwards as
if computed at once (the online softmax). `attend_backward` is one block's share of the
gradients, given the whole output's gradient and final log-sum-exp: FlashAttention's
backward (Dao et al., 2022), written out, without the fused kernel.
"""

from __future__ import annotations

import torch


def _scores(q, k, causal: bool):
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -torch.inf)
    return scores


# --8<-- [start:attend]
def attend(q, k, v, causal: bool):
    """One block: q's rows attend to k's and v's (causal: the same chunk, each query sees
    the keys up to its own). Returns the output and each row's log-sum-exp of scores."""
    scores = _scores(q, k, causal)
    lse = scores.logsumexp(-1, keepdim=True)
    return (scores - lse).exp() @ v, lse


def attend_backward(q, k, v, causal: bool, dout, lse, delta):
    """One block's share of the gradients of q, k and v, from the whole output's gradient,
    its final log-sum-exp and delta = rowsum(dout * out) (FlashAttention's backward)."""
    scale = q.shape[-1] ** -0.5
    p = (
        _scores(q, k, causal) - lse
    ).exp()  # the softmax's weights, with the whole row's normaliser
    ds = p * (dout @ v.transpose(-2, -1) - delta) * scale
    return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ dout


# --8<-- [end:attend]
