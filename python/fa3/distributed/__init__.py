"""Context parallelism: attention over sequences split across the ranks of a torch.distributed group.

    import fa3.distributed as cp
    q_local = cp.shard(q, world, rank)       # likewise k, v: this rank's chunks (zigzag by default)
    out_local = cp.ring_attn_func(q_local, k_local, v_local, causal=True)   # group: default group
    out = cp.unshard(gathered_outputs)        # (all ranks' shards, in rank order)

Ring attention (ring.py): every rank keeps its query shard; K/V shards go round the ring by NCCL
point-to-point transfers that overlap the current shard's attention; partial outputs merge through
their LSE (merge.py); the backward sends dK/dV accumulators round behind the K/V shards. Causal
attention uses the zigzag layout (layout.py) so that every rank does the same work. Packed (varlen)
batches shard each sequence: :func:`ring_attn_varlen_func` with :func:`local_cu_seqlens`.

:func:`ulysses_attn_func` is the head-parallel alternative (ulysses.py): two all-to-alls around one
fa3 call on the whole sequence for 1/W of the heads; contiguous shards, heads divisible by W;
:func:`ulysses_attn_varlen_func` for packed batches (each sequence in W contiguous chunks).
:func:`hybrid_attn_func` runs both on a grid of rings x head groups (hybrid.py, :func:`grid_groups`,
:func:`shard_2d`): heads over the fast links, the ring over the slow ones.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .exchange import RingExchange
from .hybrid import HybridAttention, grid_groups, grid_spec, local_cu_seqlens_2d, shard_2d, unshard_2d
from .layout import LAYOUTS, local_cu_seqlens, shard, shard_varlen, unshard, unshard_varlen
from .ring import RingAttention, RingSpec
from .rows import ShardRows
from .ulysses import HeadExchange, Packing, UlyssesAttention, UlyssesSpec

__all__ = ["ring_attn_func", "ring_attn_varlen_func", "ulysses_attn_func", "ulysses_attn_varlen_func",
           "hybrid_attn_func", "hybrid_attn_varlen_func", "shard", "unshard", "shard_varlen", "unshard_varlen",
           "shard_2d", "unshard_2d", "grid_groups", "local_cu_seqlens", "local_cu_seqlens_2d", "LAYOUTS"]


def _scale(softmax_scale: Optional[float], head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not softmax_scale > 0:
        raise ValueError(f"fa3.distributed: softmax_scale: expected a positive number or None, got {softmax_scale}")
    return float(softmax_scale)


def _check_shards(q, k, v, seq_dim: int, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"fa3.distributed: layout: expected one of {LAYOUTS}, got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"fa3.distributed: {name}: expected float16 or bfloat16, got {t.dtype}")
    if not (q.shape[seq_dim] == k.shape[seq_dim] == v.shape[seq_dim]):
        raise ValueError("fa3.distributed: q, k and v must be shards of one sequence (the same length along "
                         f"dim {seq_dim}), got {q.shape[seq_dim]}, {k.shape[seq_dim]}, {v.shape[seq_dim]}")


def _check_cu_seqlens(cu_seqlens, q) -> None:
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.device != q.device:
        raise ValueError("fa3.distributed: cu_seqlens: expected a 1-D int32 tensor on q's device, got "
                         f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)} on {cu_seqlens.device}")


def _sm_margin(sm_margin) -> int:
    if int(sm_margin) < 0:
        raise ValueError(f"fa3.distributed: sm_margin: expected SMs to leave free (>= 0), got {sm_margin}")
    return int(sm_margin)


def _run(q, k, v, rows, *, softmax_scale, causal, softcap, group, layout, deterministic, sm_margin):
    scale, margin = _scale(softmax_scale, q.shape[-1]), _sm_margin(sm_margin)
    spec = RingSpec(exchange=RingExchange(group), rows=rows, causal=causal, layout=layout, scale=scale,
                    softcap=float(softcap), deterministic=deterministic, sm_margin=margin)
    return RingAttention.apply(q, k, v, spec)


def ring_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float] = None,
                   causal: bool = False, softcap: float = 0.0, group=None, layout: str = "zigzag",
                   deterministic: bool = False, return_lse: bool = False, sm_margin: int = 0):
    """Attention of this rank's shards q, k, v [batch, seqlen_local, heads, head_dim] (each rank's
    from :func:`shard` with the same ``layout``) over the whole sequence held by ``group``.

    Returns this rank's output shard [batch, seqlen_local, heads, head_dim_v] (and its LSE, float32
    [batch, heads, seqlen_local], natural log, with ``return_lse``; not differentiable, unlike flash_attn_func's). Differentiable in q, k, v; the
    backward is a ring of its own. GQA/MQA, softcap and fa3's head dims and dtypes (fp16/bf16) as
    in :func:`fa3.flash_attn_func`; sliding windows are not offered (a window spans shards).
    ``sm_margin``: SMs each step's forward leaves free (as flash_attn_func's), so that the transfer of
    the next K/V shard (NCCL's kernels) runs beside the attention: a persistent forward grid holds every
    SM until its last tile otherwise. Leave at least the SMs the transfers' kernels take (NCCL's
    channels between the two peers); the backward's grid frees SMs as its CTAs retire.
    """
    _check_shards(q, k, v, 1, layout)
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"fa3.distributed: the zigzag layout holds two equal chunks per rank: seqlen_local "
                         f"{q.shape[1]} must be even")
    out, lse = _run(q, k, v, ShardRows(seqlen=q.shape[1]), softmax_scale=softmax_scale, causal=causal,
                    softcap=softcap, group=group, layout=layout, deterministic=deterministic, sm_margin=sm_margin)
    return (out, lse) if return_lse else out


def ring_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                          max_seqlen: int, softmax_scale: Optional[float] = None, causal: bool = False,
                          softcap: float = 0.0, group=None, layout: str = "zigzag", deterministic: bool = False,
                          return_lse: bool = False, sm_margin: int = 0):
    """:func:`ring_attn_func` for packed sequences: q, k, v [total_local, heads, head_dim] from
    :func:`shard_varlen`, ``cu_seqlens`` this rank's (int32, :func:`local_cu_seqlens` of the
    global ones) and ``max_seqlen`` its longest shard of a sequence. LSE: [heads, total_local]."""
    _check_shards(q, k, v, 0, layout)
    _check_cu_seqlens(cu_seqlens, q)
    if layout == "zigzag" and max_seqlen % 2:
        raise ValueError("fa3.distributed: the zigzag layout holds two equal chunks of each sequence per "
                         f"rank: max_seqlen {max_seqlen} must be even (every local length is)")
    rows = ShardRows(cu_seqlens=cu_seqlens, max_seqlen=int(max_seqlen), total=q.shape[0])
    out, lse = _run(q, k, v, rows, softmax_scale=softmax_scale, causal=causal, softcap=softcap, group=group,
                    layout=layout, deterministic=deterministic, sm_margin=sm_margin)
    return (out, lse) if return_lse else out


def _head_exchange(group, q, k, name: str) -> HeadExchange:
    """The group's all-to-all exchange; heads_q and heads_kv (q, k's second-to-last dim) must split over it."""
    exchange = HeadExchange(group)
    w, axis = exchange.world, q.dim() - 2
    if q.shape[axis] % w or k.shape[axis] % w:
        raise ValueError(f"fa3.distributed: {name} splits the heads over the group's {w} ranks: heads_q "
                         f"({q.shape[axis]}) and heads_kv ({k.shape[axis]}) must be multiples of {w}")
    return exchange


def _ulysses(q, k, v, group, *, cu_seqlens, max_seqlen, softmax_scale, causal, softcap, deterministic, name):
    exchange = _head_exchange(group, q, k, name)
    packing = None if cu_seqlens is None else Packing(cu_seqlens, max_seqlen, q.shape[0], exchange.world)
    spec = UlyssesSpec(exchange=exchange, packing=packing, causal=causal, scale=_scale(softmax_scale, q.shape[-1]),
                       softcap=float(softcap), deterministic=deterministic)
    return UlyssesAttention.apply(q, k, v, spec)


def ulysses_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float] = None,
                      causal: bool = False, softcap: float = 0.0, group=None, deterministic: bool = False,
                      return_lse: bool = False):
    """Head-parallel attention of this rank's contiguous shards q, k, v [batch, seqlen_local, heads,
    head_dim] (:func:`shard` with ``layout="contiguous"``) over the whole sequence held by ``group``:
    heads_q and heads_kv must be multiples of the group's size. Returns the output shard (and its LSE
    [batch, heads, seqlen_local] with ``return_lse``); differentiable in q, k, v."""
    _check_shards(q, k, v, 1, "contiguous")
    out, lse = _ulysses(q, k, v, group, cu_seqlens=None, max_seqlen=0, softmax_scale=softmax_scale, causal=causal,
                        softcap=softcap, deterministic=deterministic, name="ulysses_attn_func")
    return (out, lse) if return_lse else out


def ulysses_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                             max_seqlen: int, softmax_scale: Optional[float] = None, causal: bool = False,
                             softcap: float = 0.0, group=None, deterministic: bool = False,
                             return_lse: bool = False):
    """:func:`ulysses_attn_func` for packed sequences: q, k, v [total_local, heads, head_dim] from
    :func:`shard_varlen` with ``layout="contiguous"`` (every sequence split into the group's size of
    contiguous chunks), ``cu_seqlens`` this rank's (int32, :func:`local_cu_seqlens` of the global ones
    with that layout) and ``max_seqlen`` its longest chunk. LSE: [heads, total_local]."""
    _check_shards(q, k, v, 0, "contiguous")
    _check_cu_seqlens(cu_seqlens, q)
    out, lse = _ulysses(q, k, v, group, cu_seqlens=cu_seqlens, max_seqlen=int(max_seqlen),
                        softmax_scale=softmax_scale, causal=causal, softcap=softcap, deterministic=deterministic,
                        name="ulysses_attn_varlen_func")
    return (out, lse) if return_lse else out


def _hybrid(q, k, v, head_group, ring_group, *, cu_seqlens, max_seqlen, softmax_scale, causal, softcap, layout,
            deterministic, name, sm_margin):
    """The grid's call on BSHD parts (cu_seqlens None) or packed ones."""
    margin = _sm_margin(sm_margin)
    heads = _head_exchange(head_group, q, k, name)
    w = heads.world
    ring_len = (q.shape[1] if cu_seqlens is None else max_seqlen) * w  # (packed: the longest ring shard)
    if layout == "zigzag" and ring_len % 2:
        raise ValueError(f"fa3.distributed: the zigzag layout holds two equal chunks per ring rank: the ring shard "
                         f"({ring_len // w} x the head group's {w} ranks) must be even")
    spec = grid_spec(RingExchange(ring_group), heads, q, layout=layout, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                     causal=causal, scale=_scale(softmax_scale, q.shape[-1]), softcap=float(softcap),
                     deterministic=deterministic, sm_margin=margin)
    return HybridAttention.apply(q, k, v, spec)


def hybrid_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_group, ring_group,
                     softmax_scale: Optional[float] = None, causal: bool = False, softcap: float = 0.0,
                     layout: str = "zigzag", deterministic: bool = False, return_lse: bool = False,
                     sm_margin: int = 0):
    """Attention over a sequence split across a grid of rings x head groups (:func:`grid_groups`):
    q, k, v [batch, seqlen_local, heads, head_dim] are this rank's part (:func:`shard_2d`), heads_q and
    heads_kv multiples of the head group's size. The head group exchanges heads (two all-to-alls), the
    ring the K/V shards of the gathered ring shard. Returns the output part (and its LSE [batch, heads,
    seqlen_local] with ``return_lse``); differentiable in q, k, v. ``sm_margin`` as
    :func:`ring_attn_func`'s (the ring's steps)."""
    _check_shards(q, k, v, 1, layout)
    out, lse = _hybrid(q, k, v, head_group, ring_group, cu_seqlens=None, max_seqlen=0, softmax_scale=softmax_scale,
                       causal=causal, softcap=softcap, layout=layout, deterministic=deterministic,
                       name="hybrid_attn_func", sm_margin=sm_margin)
    return (out, lse) if return_lse else out


def hybrid_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                            max_seqlen: int, head_group, ring_group, softmax_scale: Optional[float] = None,
                            causal: bool = False, softcap: float = 0.0, layout: str = "zigzag",
                            deterministic: bool = False, return_lse: bool = False, sm_margin: int = 0):
    """:func:`hybrid_attn_func` for packed sequences: q, k, v [total_local, heads, head_dim] from
    :func:`shard_2d` with ``cu_seqlens``, this rank's ``cu_seqlens`` (int32, :func:`local_cu_seqlens_2d`)
    and ``max_seqlen`` its longest part of a sequence. LSE: [heads, total_local]."""
    _check_shards(q, k, v, 0, layout)
    _check_cu_seqlens(cu_seqlens, q)
    out, lse = _hybrid(q, k, v, head_group, ring_group, cu_seqlens=cu_seqlens, max_seqlen=int(max_seqlen),
                       softmax_scale=softmax_scale, causal=causal, softcap=softcap, layout=layout,
                       deterministic=deterministic, name="hybrid_attn_varlen_func", sm_margin=sm_margin)
    return (out, lse) if return_lse else out
