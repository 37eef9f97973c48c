"""The ring and the head-parallel layer together: 2-D context parallelism.

The ranks form a grid of W_r rings x W_h head groups (:func:`grid_groups`: head groups of consecutive
ranks, i.e. inside a node, or rings of consecutive ranks). The sequence is
sharded over the rings first (:func:`shard_2d`: the ring layout, zigzag by default, over W_r) and
each ring shard into W_h contiguous parts over its head group. Forward: one all_to_all inside the
head group turns the members' parts into their ring shard for h / W_h heads (ulysses.py's
to_heads); the ring runs over the W_r ranks that hold the same heads (ring.py); a second all_to_all
returns the output and the LSE. The backward mirrors it. The all-to-alls move (W_h - 1) / W_h of the
local shards over the fast links; the ring's hops carry K/V shards W_h times longer for h / W_h of
the heads (the bytes of a flat ring's hop over all W = W_r W_h ranks) while each of its W_r steps
computes W_h times a flat ring's step, so the hops hide at W_h-fold shorter sequences per GPU
(docs/context-parallel.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from .layout import local_cu_seqlens, shard, shard_varlen, unshard, unshard_varlen
from .ring import RingSpec, ring_backward, ring_forward
from .rows import ShardRows
from .ulysses import LayerFunction, Packing, exchanges

__all__ = ["HybridSpec", "hybrid_forward", "hybrid_backward", "grid_spec", "HybridAttention", "shard_2d",
           "unshard_2d", "local_cu_seqlens_2d", "grid_groups"]


@dataclass(kw_only=True)
class HybridSpec:
    ring: RingSpec        # the ring over the ranks holding this rank's heads; rows of the gathered ring shard
    head_exchange: Any    # .rank, .world, .all_to_all(x [W_h, ...]) (ulysses.HeadExchange)
    packing: Optional[Packing] = None  # packed batches: each sequence's ring shard in W_h contiguous parts


def hybrid_forward(q, k, v, spec: HybridSpec):
    """(out, lse, saved) of the local parts: BSHD out [b, s_local, h, d_v] and lse [b, h, s_local],
    packed [total_local, h, d_v] and [h, total_local]."""
    heads, seq, lse_seq, _ = exchanges(spec.head_exchange, spec.packing)
    qh, kh, vh = (heads(x) for x in (q, k, v))
    o, l = ring_forward(qh, kh, vh, spec.ring)
    return seq(o), lse_seq(l), (qh, kh, vh, o, l)


def hybrid_backward(dout, saved, spec: HybridSpec):
    """(dq, dk, dv) of the local parts."""
    heads, seq, _, _ = exchanges(spec.head_exchange, spec.packing)
    qh, kh, vh, o, l = saved
    grads = ring_backward(heads(dout), qh, kh, vh, o, l, spec.ring)
    return tuple(seq(g) for g in grads)


def grid_spec(ring_exchange, head_exchange, q: torch.Tensor, *, layout: str, cu_seqlens: Optional[torch.Tensor] = None,
              max_seqlen: int = 0, **options) -> HybridSpec:
    """The spec of a grid rank's part ``q``: BSHD, or packed with this rank's ``cu_seqlens`` and
    ``max_seqlen`` (:func:`local_cu_seqlens_2d`). The ring's rows are those of the gathered ring
    shard (W_h times the part); ``options`` are BlockOptions' fields."""
    w = head_exchange.world
    if cu_seqlens is None:
        packing, rows = None, ShardRows(seqlen=q.shape[1] * w)
    else:
        packing = Packing(cu_seqlens, max_seqlen, q.shape[0], w)
        rows = ShardRows(cu_seqlens=(cu_seqlens * w).to(torch.int32), max_seqlen=max_seqlen * w, total=q.shape[0] * w)
    ring = RingSpec(exchange=ring_exchange, rows=rows, layout=layout, **options)
    return HybridSpec(ring=ring, head_exchange=head_exchange, packing=packing)


class HybridAttention:
    """(out, lse) of the local parts; differentiable in q, k and v."""

    @staticmethod
    def apply(q, k, v, spec: HybridSpec):
        return LayerFunction.apply(q, k, v, spec, hybrid_forward, hybrid_backward)


def shard_2d(x: torch.Tensor, ring_world: int, ring_rank: int, head_world: int, head_rank: int,
             layout: str = "zigzag", dim: int = 1, cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The part of ``x`` that grid rank (ring_rank, head_rank) holds: BSHD (the sequence on ``dim``),
    or packed [total, ...] with ``cu_seqlens`` (every sequence sharded so)."""
    if cu_seqlens is None:
        return shard(shard(x, ring_world, ring_rank, layout, dim), head_world, head_rank, "contiguous", dim)
    ring_part = shard_varlen(x, cu_seqlens, ring_world, ring_rank, layout)
    return shard_varlen(ring_part, local_cu_seqlens(cu_seqlens, ring_world, layout), head_world, head_rank,
                        "contiguous")


def unshard_2d(parts, layout: str = "zigzag", dim: int = 1, cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The whole sequence (or packed batch, with ``cu_seqlens``) from ``parts[ring_rank][head_rank]``."""
    if cu_seqlens is None:
        return unshard([unshard(row, "contiguous", dim) for row in parts], layout, dim)
    ring_cu = local_cu_seqlens(cu_seqlens, len(parts), layout)
    return unshard_varlen([unshard_varlen(row, ring_cu, "contiguous") for row in parts], cu_seqlens, layout)


def local_cu_seqlens_2d(cu_seqlens: torch.Tensor, ring_world: int, head_world: int,
                        layout: str = "zigzag") -> torch.Tensor:
    """A grid rank's cu_seqlens for a packed batch sharded by :func:`shard_2d`."""
    return local_cu_seqlens(local_cu_seqlens(cu_seqlens, ring_world, layout), head_world, "contiguous")


def grid_groups(head_world: int, heads_inner: bool = True):
    """(head_group, ring_group, ring_rank, head_rank) of this rank in a W_r x W_h grid of the default
    group. heads_inner: head groups of consecutive ranks (the all-to-alls over a node's NVLink, the
    ring's overlapped hops across nodes); False: rings of consecutive ranks (the ring inside a node,
    the all-to-alls across nodes). Every rank must call it (groups are created collectively)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if head_world < 1 or world % head_world:
        raise ValueError(f"fa3.distributed: head_world ({head_world}) must divide the world size ({world})")
    ring_world = world // head_world

    def grid_rank(r, h):
        return r * head_world + h if heads_inner else h * ring_world + r

    head_group = ring_group = None
    for r in range(ring_world):
        g = dist.new_group([grid_rank(r, h) for h in range(head_world)])
        if any(grid_rank(r, h) == rank for h in range(head_world)):
            head_group, ring_rank = g, r
    for h in range(head_world):
        g = dist.new_group([grid_rank(r, h) for r in range(ring_world)])
        if any(grid_rank(r, h) == rank for r in range(ring_world)):
            ring_group, head_rank = g, h
    return head_group, ring_group, ring_rank, head_rank
