"""Ring attention: each rank keeps its queries while the K/V shards travel around the ring.

Forward, on rank r of W: at step t the shard of rank (r - t) mod W is here; the transfer of it to
rank r+1 (and of the next one from rank r-1) starts before the step's attention and is waited for
after it, so the exchange hides under the compute; the step's (O, LSE) folds into a running
float32 (O, LSE) (merge.py).

Backward: the K/V shards travel the same way, followed by float32 dK/dV accumulators: the one for
shard s gathers every rank's share of dK_s/dV_s on its way round and, after W hops, is back on
rank s. dQ accumulates locally in float32. Each step's attention backward reads the final O and
LSE (blocks.py), and each accumulator's hop overlaps the next step's attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .blocks import BlockOptions
from .layout import step_plan
from .merge import merge_
from .rows import ShardRows

__all__ = ["RingSpec", "ring_forward", "ring_backward", "RingAttention"]


@dataclass(kw_only=True)
class RingSpec(BlockOptions):
    """Everything a ring call needs besides its tensors."""
    exchange: Any          # .rank, .world, .start(tensors) -> handle with .wait() (exchange.py)
    rows: ShardRows        # the shard's row sets (BSHD or packed)
    layout: str


def ring_forward(q, k, v, spec: RingSpec):
    """(out in q's dtype, lse float32) of the local queries against every rank's keys."""
    ex, W, r = spec.exchange, spec.exchange.world, spec.exchange.rank
    out = lse = None
    k_cur, v_cur = k.contiguous(), v.contiguous()
    for t in range(W):
        pending = ex.start([k_cur, v_cur]) if t < W - 1 else None
        plan = step_plan(r, (r - t) % W, W, spec.causal, spec.layout)
        if plan is not None:
            qr, kr = spec.rows[plan.q_rows], spec.rows[plan.kv_rows]
            o, l = spec.blocks.forward(qr.take(q), kr.take(k_cur), kr.take(v_cur), qr, kr, causal=plan.causal,
                                       scale=spec.scale, softcap=spec.softcap, sm_margin=spec.sm_margin)
            if t == 0:  # the own shard, every row (step_plan): the running result starts as it
                if W == 1:
                    return o, l
                out, lse = o.float(), l.float()
            else:
                o_acc, l_acc = qr.take(out), qr.take_lse(lse)
                merge_(o_acc, l_acc, o, l)
                qr.put(out, o_acc, lse, l_acc)
        if pending is not None:
            k_cur, v_cur = pending.wait()
    return out.to(q.dtype), lse


def ring_backward(dout, q, k, v, out, lse, spec: RingSpec):
    """(dq, dk, dv) of the local shards, in their dtypes."""
    ex, W, r = spec.exchange, spec.exchange.world, spec.exchange.rank
    dq = None
    k_cur, v_cur = k.contiguous(), v.contiguous()
    dk_acc = dv_acc = None
    acc_pending = None
    for t in range(W):
        kv_pending = ex.start([k_cur, v_cur]) if t < W - 1 else None
        plan = step_plan(r, (r - t) % W, W, spec.causal, spec.layout)
        grads = None
        if plan is not None:
            qr, kr = spec.rows[plan.q_rows], spec.rows[plan.kv_rows]
            grads = spec.blocks.backward(qr.take(dout), qr.take(q), kr.take(k_cur), kr.take(v_cur), qr.take(out),
                                         qr.take_lse(lse).contiguous(), qr, kr, causal=plan.causal,
                                         scale=spec.scale, softcap=spec.softcap,
                                         deterministic=spec.deterministic)
        # Step 0 is the own shard with every row (step_plan): the float32 sums start as its gradients;
        # later the shard's accumulators arrive from the previous rank.
        if t == 0:
            if W == 1:
                return grads
            dq, dk_acc, dv_acc = (g.float() for g in grads)
        else:
            if grads is not None:
                qr.add_(dq, grads[0])
            dk_acc, dv_acc = acc_pending.wait()
            if grads is not None:
                kr.add_(dk_acc, grads[1])
                kr.add_(dv_acc, grads[2])
        acc_pending = ex.start([dk_acc, dv_acc])
        if kv_pending is not None:
            k_cur, v_cur = kv_pending.wait()
    dk_acc, dv_acc = acc_pending.wait()  # (the own shard's, home after W hops)
    return dq.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype)


class RingAttention(torch.autograd.Function):
    """(out, lse) = ring attention of the local shards; differentiable in q, k and v."""

    @staticmethod
    def forward(ctx, q, k, v, spec: RingSpec):
        out, lse = ring_forward(q, k, v, spec)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec = spec
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(dout.contiguous(), q, k, v, out, lse, ctx.spec)
        return dq, dk, dv, None
