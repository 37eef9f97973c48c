"""Head-parallel context parallelism (DeepSpeed-Ulysses' scheme), beside the ring.

Each rank holds a contiguous shard of the sequence (layout "contiguous") with every head. One
all-to-all turns that into the whole sequence for 1/W of the heads; fa3 runs on it as on one GPU
(any mask: the rank sees every key of its heads); a second all-to-all turns the output back into
sequence shards. The backward mirrors it. Per rank and call, the all-to-alls move (W-1)/W of the
local Q, K, V and O (forward; dO, dQ, dK, dV backward) whatever W is, where a ring moves W-1 K/V
shards: fewer bytes for large W, but the heads (and the KV heads) must split W ways, and the
all-to-alls do not overlap the attention. docs/context-parallel.md compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from .blocks import BlockOptions
from .exchange import require_member
from .rows import Rows

__all__ = ["HeadExchange", "Packing", "UlyssesSpec", "ulysses_forward", "ulysses_backward", "LayerFunction",
           "UlyssesAttention"]


class HeadExchange:
    """all_to_all over a torch.distributed group: chunk i of dim 0 goes to rank i, chunk j of the
    result came from rank j (NCCL: on NCCL's stream, ordered after the current stream's work)."""

    def __init__(self, group=None):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        require_member(self.rank, dist.get_rank())

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return x
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=self.group)
        return out


class Packing:
    """Packed sequences, each split into W contiguous chunks (``shard_varlen`` with the
    "contiguous" layout: rank r holds chunk r of every sequence, in sequence order). The all-to-all
    brings rank r's rows of every sequence as block r; ``index[g]`` is the row of those W blocks
    (flattened) that row g of the whole packed batch comes from, and ``rows`` bounds that batch's
    sequences (the local cu_seqlens times W). Built on the tensors' device, nothing read on the host."""

    def __init__(self, cu_seqlens: torch.Tensor, max_seqlen: int, total: int, world: int):
        cu = cu_seqlens.long()
        whole_cu = cu * world
        g = torch.arange(total * world, device=cu.device)
        seq = torch.searchsorted(whole_cu[1:], g, right=True)  # (empty sequences own no row)
        pos, length = g - whole_cu[seq], (cu[1:] - cu[:-1])[seq]
        self.index = torch.div(pos, length, rounding_mode="floor") * total + cu[seq] + pos % length
        self.rows = Rows(cu_seqlens=whole_cu.to(torch.int32), max_seqlen=max_seqlen * world)


@dataclass(kw_only=True)
class UlyssesSpec(BlockOptions):
    exchange: Any   # .rank, .world, .all_to_all(x [W, ...]) -> [W, ...]
    packing: Optional[Packing] = None  # packed sequences ([total, h, d] tensors); None: BSHD


def to_heads(x: torch.Tensor, ex) -> torch.Tensor:
    """[b, s_local, h, d] sequence shard -> [b, W s_local, h / W, d]: the whole sequence, this rank's
    heads (head group r on rank r)."""
    b, s, h, d = x.shape
    w = ex.world
    y = x.reshape(b, s, w, h // w, d).permute(2, 0, 1, 3, 4).contiguous()  # [to rank, b, s, h/W, d]
    y = ex.all_to_all(y)                                                    # [from rank, b, s, h/W, d]
    return y.permute(1, 0, 2, 3, 4).reshape(b, w * s, h // w, d)


def to_sequence(x: torch.Tensor, ex) -> torch.Tensor:
    """to_heads' inverse: [b, W s_local, h / W, d] -> [b, s_local, h, d]."""
    b, S, hh, d = x.shape
    w = ex.world
    y = x.reshape(b, w, S // w, hh, d).permute(1, 0, 2, 3, 4).contiguous()  # [to rank, b, s, h/W, d]
    y = ex.all_to_all(y)                                                     # [head group, b, s, h/W, d]
    return y.permute(1, 2, 0, 3, 4).reshape(b, S // w, w * hh, d)


def lse_to_sequence(lse: torch.Tensor, ex) -> torch.Tensor:
    """fa3's LSE of the rank's heads [b, h / W, W s_local] -> [b, h, s_local]."""
    b, hh, S = lse.shape
    w = ex.world
    y = lse.reshape(b, hh, w, S // w).permute(2, 0, 1, 3).contiguous()  # [to rank, b, h/W, s]
    y = ex.all_to_all(y)                                                # [head group, b, h/W, s]
    return y.permute(1, 0, 2, 3).reshape(b, w * hh, S // w)


def packed_to_heads(x: torch.Tensor, ex, packing: Packing) -> torch.Tensor:
    """to_heads for packed shards: [total_local, h, d] -> the whole packed batch [W total_local, h / W, d]."""
    t, h, d = x.shape
    w = ex.world
    y = ex.all_to_all(x.reshape(t, w, h // w, d).transpose(0, 1).contiguous())  # [from rank, t, h/W, d]
    return y.reshape(w * t, h // w, d).index_select(0, packing.index)


def packed_to_sequence(x: torch.Tensor, ex, packing: Packing) -> torch.Tensor:
    """packed_to_heads' inverse: [W total_local, h / W, d] -> [total_local, h, d]."""
    n, hh, d = x.shape
    w = ex.world
    y = torch.empty_like(x).index_copy_(0, packing.index, x).reshape(w, n // w, hh, d)  # [to rank, t, h/W, d]
    return ex.all_to_all(y).transpose(0, 1).reshape(n // w, w * hh, d)  # (from head group g: heads g h/W..)


def packed_lse_to_sequence(lse: torch.Tensor, ex, packing: Packing) -> torch.Tensor:
    """fa3's packed LSE of the rank's heads [h / W, W total_local] -> [h, total_local]."""
    hh, n = lse.shape
    w = ex.world
    y = torch.empty_like(lse).index_copy_(1, packing.index, lse).reshape(hh, w, n // w)
    return ex.all_to_all(y.transpose(0, 1).contiguous()).reshape(w * hh, n // w)


def exchanges(ex, packing: Optional[Packing]):
    """(to heads, to sequence, LSE to sequence, the whole batch's rows) over exchange ``ex``, for
    BSHD shards (packing None) or packed ones (the grid in hybrid.py uses them too)."""
    if packing is None:
        return (lambda x: to_heads(x, ex)), (lambda x: to_sequence(x, ex)), (lambda l: lse_to_sequence(l, ex)), Rows()
    return ((lambda x: packed_to_heads(x, ex, packing)), (lambda x: packed_to_sequence(x, ex, packing)),
            (lambda l: packed_lse_to_sequence(l, ex, packing)), packing.rows)


def ulysses_forward(q, k, v, spec: UlyssesSpec):
    """(out, lse, saved) of the local shards: BSHD out [b, s_local, h, d_v] and lse [b, h, s_local],
    packed [total_local, h, d_v] and [h, total_local]; saved holds what the backward reads."""
    heads, seq, lse_seq, rows = exchanges(spec.exchange, spec.packing)
    qh, kh, vh = (heads(x) for x in (q, k, v))
    o, l = spec.blocks.forward(qh, kh, vh, rows, rows, causal=spec.causal, scale=spec.scale, softcap=spec.softcap)
    return seq(o), lse_seq(l), (qh, kh, vh, o, l)


def ulysses_backward(dout, saved, spec: UlyssesSpec):
    """(dq, dk, dv) of the local sequence shards."""
    heads, seq, _, rows = exchanges(spec.exchange, spec.packing)
    qh, kh, vh, o, l = saved
    grads = spec.blocks.backward(heads(dout), qh, kh, vh, o, l, rows, rows, causal=spec.causal,
                                 scale=spec.scale, softcap=spec.softcap, deterministic=spec.deterministic)
    return tuple(seq(g) for g in grads)


class LayerFunction(torch.autograd.Function):
    """Autograd of a context-parallel layer given as fwd(q, k, v, spec) -> (out, lse, saved) and
    bwd(dout, saved, spec) -> (dq, dk, dv): the head-parallel layer and the grid (hybrid.py)."""

    @staticmethod
    def forward(ctx, q, k, v, spec, fwd, bwd):
        out, lse, saved = fwd(q, k, v, spec)
        ctx.save_for_backward(*saved)
        ctx.spec, ctx.bwd = spec, bwd
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        dq, dk, dv = ctx.bwd(dout.contiguous(), ctx.saved_tensors, ctx.spec)
        return dq, dk, dv, None, None, None


class UlyssesAttention:
    """(out, lse) of the local sequence shards; differentiable in q, k and v."""

    @staticmethod
    def apply(q, k, v, spec: UlyssesSpec):
        return LayerFunction.apply(q, k, v, spec, ulysses_forward, ulysses_backward)
