"""The rows of a rank's shard that one ring step reads (layout.py's ALL / FIRST / SECOND), as views
(BSHD batches: a slice of the sequence dim) or gathers (packed batches: every sequence's chunk), with
the sequence bounds fa3 needs for them.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from .layout import ALL, FIRST, SECOND

__all__ = ["Rows", "ShardRows"]


class Rows:
    """Some rows of a shard. BSHD tensors [b, s, ...] are sliced on dim 1 (LSE [b, h, s] on its
    last dim); packed tensors [total, ...] are gathered with ``index`` (LSE [h, total] on dim 1) and
    then form sequences bounded by ``cu_seqlens``."""

    def __init__(self, seq_slice: Optional[slice] = None, index: Optional[torch.Tensor] = None,
                 cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: int = 0):
        self.seq_slice, self.index = seq_slice, index
        self.cu_seqlens, self.max_seqlen = cu_seqlens, max_seqlen

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """These rows of a Q/K/V/O-shaped tensor (a view unless gathered)."""
        if self.index is not None:
            return x.index_select(0, self.index)
        return x if self.seq_slice is None else x[:, self.seq_slice]

    def take_lse(self, lse: torch.Tensor) -> torch.Tensor:
        if self.index is not None:
            return lse.index_select(1, self.index)
        return lse if self.seq_slice is None else lse[..., self.seq_slice]

    def add_(self, acc: torch.Tensor, value: torch.Tensor) -> None:
        """acc[these rows] += value."""
        if self.index is not None:
            acc.index_add_(0, self.index, value.to(acc.dtype))
        elif self.seq_slice is None:
            acc.add_(value)
        else:
            acc[:, self.seq_slice].add_(value)

    def put(self, acc: torch.Tensor, value: torch.Tensor, lse_acc: torch.Tensor, lse: torch.Tensor) -> None:
        """Writes gathered rows back (views were updated in place already)."""
        if self.index is not None:
            acc.index_copy_(0, self.index, value)
            lse_acc.index_copy_(1, self.index, lse)


class ShardRows:
    """The three row sets of one shard: its rows, and (zigzag) its first and second chunk.

    BSHD: ``seqlen`` is the shard's sequence length. Packed: ``cu_seqlens`` (int32, on the
    tensors' device) and ``max_seqlen`` bound the shard's ``total`` rows of sequences, each holding
    its two chunks (even lengths). Nothing here reads a device value on the host.
    """

    def __init__(self, seqlen: int = 0, cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: int = 0,
                 total: int = 0):
        self._sets: Dict[str, Rows] = {}
        if cu_seqlens is None:
            half = seqlen // 2
            self._sets[ALL] = Rows()
            self._sets[FIRST] = Rows(seq_slice=slice(0, half))
            self._sets[SECOND] = Rows(seq_slice=slice(half, seqlen))
            return
        self._sets[ALL] = Rows(cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        self._cu, self._max, self._total = cu_seqlens, max_seqlen, total

    def __getitem__(self, which: str) -> Rows:
        if which not in self._sets:  # packed chunks: built on first use (index tensors on the device)
            cu = self._cu.long()
            starts, lengths = cu[:-1], cu[1:] - cu[:-1]
            half = lengths // 2
            first = starts if which == FIRST else starts + half
            # Row j of the gathered chunk set belongs to sequence i = searchsorted(half_cu, j).
            half_cu = torch.zeros_like(cu)
            half_cu[1:] = torch.cumsum(half, 0)
            rows = torch.arange(self._total // 2, device=cu.device)
            seq = torch.searchsorted(half_cu[1:], rows, right=True)
            index = first[seq] + (rows - half_cu[seq])
            self._sets[which] = Rows(index=index, cu_seqlens=half_cu.to(torch.int32),
                                     max_seqlen=self._max // 2)
        return self._sets[which]
