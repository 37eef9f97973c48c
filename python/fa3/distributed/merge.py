"""Merging attention over disjoint key sets through their log-sum-exps.

With O_i = softmax over key set i of the scores times V and L_i = log sum_keys-in-i exp(score),
attention over the union is O = sum_i exp(L_i - L) O_i with L = log sum_i exp(L_i): fa3's combine
kernel does this for the splits of one call; a ring merges one visiting shard at a time, so it keeps
a running (O, L) in float32 and folds each block in as it comes (memory independent of the ring's size).
"""

from __future__ import annotations

import torch

__all__ = ["merge_"]


def merge_(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Folds (block_out, block_lse) into the running (out, lse), in place.

    out, block_out: [..., s, h, d] (out float32); lse, block_lse: [..., h, s] float32 (fa3's LSE
    layouts: BSHD [b, h, s], packed [h, total]). Rows that no block has reached yet hold lse = -inf
    and out = 0; a row with lse = -inf on both sides stays so (no NaN).
    """
    new = torch.logaddexp(lse, block_lse)
    finite = torch.where(torch.isneginf(new), torch.zeros_like(new), new)
    keep = torch.exp(lse - finite).transpose(-1, -2).unsqueeze(-1)
    take = torch.exp(block_lse - finite).transpose(-1, -2).unsqueeze(-1)
    out.mul_(keep).add_(block_out.to(out.dtype) * take)
    lse.copy_(new)
