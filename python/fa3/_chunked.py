"""Chunked attention (FlashAttention-3's ``attention_chunk``, Llama 4's local layers) as one varlen
call of fa3's kernels.

The keys are cut into chunks of ``chunk`` positions; a query at position p (counted in keys,
bottom-right aligned: p = i + len_k - len_q) sees only the keys of its own chunk, [floor(p / chunk)
* chunk, ... + chunk), intersected with the caller's causal mask or window. Every sequence is
therefore cut into groups, one per chunk — the queries whose positions fall in the chunk, and the
chunk's keys — plus a first group of the queries at negative positions (len_q > len_k), which see
no key. In a group the kernels' bottom-right alignment puts each query at its own position again
(a group's last query is the chunk's last key, or the sequence's: its key count minus its query
count is its first query's offset in the chunk), so causal masks and windows pass unchanged, and
so do softcap, sinks, GQA and the backward (FlashAttention-3's backward has no attention_chunk).

Groups are contiguous runs of the packed rows, so no tensor is copied: only cu_seqlens are made,
on the device from the lengths (no host sync, CUDA-graph safe). Groups without queries cost the
kernels nothing but their place in the walk.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch


def group_bounds(len_q: torch.Tensor, len_k: torch.Tensor, chunk: int, chunks: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per sequence (len_q, len_k int64 [batch]), the query and key offsets where its groups start,
    [batch, chunks + 2]: column 0 is 0, column g + 1 the end of group g (group 0: negative
    positions; group c + 1: chunk c), the last column len_q / len_k. ``chunks`` >= ceil(len_k /
    chunk) for every sequence (more give empty groups)."""
    starts = torch.arange(chunks + 1, device=len_q.device, dtype=torch.int64) * chunk  # chunk c's first key
    offset = (len_k - len_q)[:, None]  # query i sits at position i + offset
    q_ends = (starts[None, :] - offset).clamp(min=0).minimum(len_q[:, None])
    k_ends = starts[None, :].minimum(len_k[:, None])
    zero = torch.zeros_like(len_q)[:, None]
    return torch.cat([zero, q_ends], 1), torch.cat([zero, k_ends], 1)


def cu_seqlens(first_row: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Cumulative int32 lengths of every sequence's groups in packed rows: sequence b's rows start at
    first_row[b], its groups at first_row[b] + bounds[b, :-1]; the last entry is the total."""
    starts = (first_row[:, None] + bounds[:, :-1]).flatten()
    end = (first_row[-1] + bounds[-1, -1]).reshape(1)
    return torch.cat([starts, end]).to(torch.int32)


def _lengths(t: torch.Tensor, cu: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's length and first packed row (int64 [batch]) of [batch, seqlen, heads, d]
    (cu None) or of packed rows with their cu_seqlens."""
    if cu is None:
        b, s = t.shape[0], t.shape[1]
        return (torch.full((b,), s, device=t.device, dtype=torch.int64),
                torch.arange(b, device=t.device, dtype=torch.int64) * s)
    cu = cu.to(torch.int64)
    return cu[1:] - cu[:-1], cu[:-1]


def group_args(len_q: torch.Tensor, first_q: torch.Tensor, len_k: torch.Tensor, chunk: int, max_seqlen_k: int, *,
               first_k: Optional[torch.Tensor] = None, page_table: Optional[torch.Tensor] = None,
               page_size: int = 0, counts_q: bool = False, counts_k: bool = False) -> dict:
    """The grouped call's arguments: each sequence's queries packed rows from first_q (len_q of
    them, int64 [batch]), its keys len_k (<= max_seqlen_k) of either
     - packed rows from first_k: each group's first row (cu_seqlens_k), and with counts_k its key
       count (seqused_k: where the sequences' used rows are not back to back — seqused_k, a cache
       — the counts are not the differences of the starts);
     - a paged cache: a page-table row per group that starts at its chunk's first page (``chunk`` a
       multiple of ``page_size``, so chunks start on a page), and its key count (seqused_k).
    counts_q: each group's query count too (seqused_q: the caller's seqused_q shortened them).
    Returns cu_seqlens_q, max_seqlen_k, and cu_seqlens_k or page_table, seqused_q / seqused_k."""
    chunks = max(1, -(-max_seqlen_k // chunk))
    q_bounds, k_bounds = group_bounds(len_q, len_k, chunk, chunks)

    def counts(bounds):
        return (bounds[:, 1:] - bounds[:, :-1]).flatten().to(torch.int32)
    args = dict(cu_seqlens_q=cu_seqlens(first_q, q_bounds), max_seqlen_k=min(chunk, max_seqlen_k))
    if counts_q:
        args["seqused_q"] = counts(q_bounds)
    if page_table is None:
        args["cu_seqlens_k"] = cu_seqlens(first_k, k_bounds)
        if counts_k:
            args["seqused_k"] = counts(k_bounds)
        return args
    batch, groups, per_chunk = page_table.shape[0], chunks + 1, chunk // page_size
    first_page = torch.div(k_bounds[:, :-1], page_size, rounding_mode="floor")  # [batch, groups]
    steps = torch.arange(per_chunk, device=page_table.device, dtype=torch.int64)
    # (entries past a sequence's table are never read: the group's keys end inside it; clamped so
    # that the gather itself stays inside)
    cols = (first_page[:, :, None] + steps).clamp(max=page_table.shape[1] - 1).reshape(batch, groups * per_chunk)
    args["page_table"] = torch.gather(page_table, 1, cols).reshape(batch * groups, per_chunk)
    args["seqused_k"] = counts(k_bounds)
    return args


def chunked_varlen_args(q: torch.Tensor, k: torch.Tensor, chunk: int, *, cu_seqlens_q: Optional[torch.Tensor],
                        cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                        seqused_q: Optional[torch.Tensor] = None,
                        seqused_k: Optional[torch.Tensor] = None) -> dict:
    """The varlen arguments of the grouped call (cu_seqlens_q / _k, max_seqlen_q / _k, and per group
    seqused_q / seqused_k where the caller shortened the sequences). q / k are [batch, seqlen,
    heads, d] (fixed lengths) or [total, heads, d] with their cu_seqlens."""
    len_q, first_q = _lengths(q, cu_seqlens_q)
    len_k, first_k = _lengths(k, cu_seqlens_k)
    if seqused_q is not None:
        len_q = seqused_q.to(torch.int64)
    if seqused_k is not None:
        len_k = seqused_k.to(torch.int64)
    args = group_args(len_q, first_q, len_k, chunk, max_seqlen_k, first_k=first_k, counts_q=seqused_q is not None,
                      counts_k=seqused_k is not None)
    # (a group holds at most a chunk of queries, or the queries before the first key)
    args["max_seqlen_q"] = max_seqlen_q
    return args


def packed(t: torch.Tensor, is_packed: bool) -> torch.Tensor:
    """[batch, seqlen, heads, d] as [batch * seqlen, heads, d] (a view where strides allow)."""
    return t if is_packed else t.reshape(-1, *t.shape[2:])
