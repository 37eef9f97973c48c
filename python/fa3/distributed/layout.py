"""How a sequence is split across the ranks of a ring, and which rows of a shard a step reads.

Two layouts of a sequence of length L over W ranks:

- ``"zigzag"`` (causal load balancing): the sequence is cut into 2W chunks and rank r holds chunks
  r and 2W-1-r, in that order, so every rank gets the same number of visible (query, key) pairs
  under a causal mask; L must be a multiple of 2W.
- ``"contiguous"``: rank r holds chunk r of W; L must be a multiple of W. Under a causal mask rank
  W-1 then does W times the work of rank 0.

Packed (varlen) batches split every sequence the same way and pack the shards in sequence order,
so a rank's cu_seqlens are the global ones divided by W.

:func:`step_plan` says what one ring step computes: the rows of the local queries and of the
visiting K/V shard it reads, and whether the causal diagonal falls inside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["LAYOUTS", "ALL", "FIRST", "SECOND", "StepPlan", "step_plan", "shard", "unshard",
           "shard_varlen", "unshard_varlen", "local_cu_seqlens"]

LAYOUTS = ("zigzag", "contiguous")

# Rows of a shard a step reads: all of them, or (zigzag) the shard's first or second chunk.
ALL, FIRST, SECOND = "all", "first", "second"


@dataclass(frozen=True)
class StepPlan:
    q_rows: str       # ALL or SECOND
    kv_rows: str      # ALL or FIRST
    causal: bool      # the causal diagonal runs through this block (square: the shard's own K/V)


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"fa3.distributed: layout: expected one of {LAYOUTS}, got {layout!r}")


def step_plan(rank: int, source: int, world: int, causal: bool, layout: str) -> Optional[StepPlan]:
    """What rank ``rank`` computes with the K/V shard of rank ``source``; None: nothing is visible.

    Zigzag, causal (chunks in global order: c_src < c_rank < c_(2W-1-rank) < c_(2W-1-src) when
    source < rank): the own shard is the causal diagonal; an earlier rank's first chunk is seen
    whole by both local chunks and its second chunk by neither; a later rank's two chunks are
    seen whole by the local second chunk only. Each step off the diagonal is half a shard x shard.
    """
    _check_layout(layout)
    if not causal:
        return StepPlan(ALL, ALL, False)
    if source == rank:
        return StepPlan(ALL, ALL, True)
    if layout == "contiguous":
        return StepPlan(ALL, ALL, False) if source < rank else None
    return StepPlan(ALL, FIRST, False) if source < rank else StepPlan(SECOND, ALL, False)


def _chunk_ids(rank: int, world: int, layout: str):
    _check_layout(layout)
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)


def _chunks_per_sequence(world: int, layout: str) -> int:
    return 2 * world if layout == "zigzag" else world


def shard(x: torch.Tensor, world: int, rank: int, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim`` (the sequence dim of BSHD tensors by default)."""
    parts = _chunks_per_sequence(world, layout)
    if x.shape[dim] % parts:
        raise ValueError(f"fa3.distributed: the sequence length {x.shape[dim]} must be a multiple of "
                         f"{parts} for the {layout!r} layout over {world} ranks")
    chunks = x.chunk(parts, dim=dim)
    return torch.cat([chunks[c] for c in _chunk_ids(rank, world, layout)], dim=dim)


def unshard(shards, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's shard (``shards[r]`` from rank r)."""
    world = len(shards)
    parts = _chunks_per_sequence(world, layout)
    chunks = [None] * parts
    for rank, s in enumerate(shards):
        ids = _chunk_ids(rank, world, layout)
        for c, piece in zip(ids, s.chunk(len(ids), dim=dim)):
            chunks[c] = piece
    return torch.cat(chunks, dim=dim)


def local_cu_seqlens(cu_seqlens: torch.Tensor, world: int, layout: str = "zigzag") -> torch.Tensor:
    """A rank's cu_seqlens for a packed batch whose sequences are each sharded (the global ones / W)."""
    parts = _chunks_per_sequence(world, layout)
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    if bool((lengths % parts != 0).any()):
        raise ValueError(f"fa3.distributed: every sequence length must be a multiple of {parts} for the "
                         f"{layout!r} layout over {world} ranks (cu_seqlens {cu_seqlens.tolist()})")
    return torch.div(cu_seqlens, world, rounding_mode="floor").to(torch.int32)


def shard_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor, world: int, rank: int,
                 layout: str = "zigzag") -> torch.Tensor:
    """Rank ``rank``'s rows of a packed [total, ...] tensor: each sequence sharded, in order."""
    local_cu_seqlens(cu_seqlens, world, layout)  # (checks the lengths)
    bounds = cu_seqlens.tolist()
    return torch.cat([shard(x[a:b], world, rank, layout, dim=0) for a, b in zip(bounds[:-1], bounds[1:])],
                     dim=0)


def unshard_varlen(shards, cu_seqlens: torch.Tensor, layout: str = "zigzag") -> torch.Tensor:
    """The packed [total, ...] tensor from every rank's packed shard."""
    world = len(shards)
    local = local_cu_seqlens(cu_seqlens, world, layout).tolist()
    seqs = []
    for i in range(len(local) - 1):
        seqs.append(unshard([s[local[i]:local[i + 1]] for s in shards], layout, dim=0))
    return torch.cat(seqs, dim=0)
