"""One ring step's attention on fa3's operators: local queries against one visiting K/V shard.

The forward returns the block's (O, LSE); the backward takes the final O and LSE of the rows (not
the block's), which makes fa3's backward give exactly the block's share of dQ, dK and dV: with
P = exp(S - LSE_final) and D = rowsum(dO * O_final), dS = P (dP - D) sums over blocks to the full
gradient. Anything with the same two static methods can stand in (the tests' float64 reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .. import _ops
from .rows import Rows

__all__ = ["Fa3Blocks", "BlockOptions"]


def _seq_args(q_rows: Rows, kv_rows: Rows) -> dict:
    if not q_rows.packed:
        return {}
    return dict(cu_seqlens_q=q_rows.cu_seqlens, cu_seqlens_k=kv_rows.cu_seqlens,
                max_seqlen_q=q_rows.max_seqlen, max_seqlen_k=kv_rows.max_seqlen)


class Fa3Blocks:
    @staticmethod
    def forward(q, k, v, q_rows: Rows, kv_rows: Rows, *, causal: bool, scale: float, softcap: float,
                sm_margin: int = 0):
        out, lse = _ops.fwd(q, k, v, softmax_scale=scale, causal=causal, softcap=softcap, sm_margin=sm_margin,
                            **_seq_args(q_rows, kv_rows))
        return out, lse

    @staticmethod
    def backward(dout, q, k, v, out, lse, q_rows: Rows, kv_rows: Rows, *, causal: bool, scale: float,
                 softcap: float, deterministic: bool):
        # As fa3's own autograd: tensors its backward cannot read in place copied (the forward's
        # operator copies them itself), and torch's global determinism flag honoured.
        dout, q, k, v = (_ops.tma_layout(t) for t in (dout, q, k, v))
        deterministic = deterministic or torch.are_deterministic_algorithms_enabled()
        dq, dk, dv, _ = _ops.bwd(dout, q, k, v, out, lse, softmax_scale=scale, causal=causal,
                                 softcap=softcap, deterministic=deterministic, **_seq_args(q_rows, kv_rows))
        return dq, dk, dv


@dataclass(kw_only=True)
class BlockOptions:
    """What every block call of a context-parallel layer takes besides its tensors (ring.RingSpec
    and ulysses.UlyssesSpec add their exchange and layout)."""
    causal: bool
    scale: float
    softcap: float = 0.0
    deterministic: bool = False
    # SMs each block's forward leaves free (fa3_c.h's sm_margin): the ring's transfer kernels run
    # beside the attention only on SMs that its persistent grid does not hold.
    sm_margin: int = 0
    blocks: Any = Fa3Blocks  # forward/backward of one block (the tests pass a float64 stand-in)
