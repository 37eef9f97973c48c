"""flash_attn_with_kvcache's steps that run as PyTorch operations where fa3's fused call does not
take the problem (e4m3 caches, descales, chunked attention, tensors off the GPU): the append of new
keys and values with their rotary embedding and that of the queries, and a contiguous cache read
in place as packed key rows. No device sync in any of them."""
from __future__ import annotations

from typing import Optional

import torch


def packed_rows(cu_seqlens: torch.Tensor, total: int):
    """(sequence, index within it) of each of `total` packed rows, int64, from int32 [batch + 1]
    cumulative counts (on their device: no sync). Rows past cu_seqlens[batch] belong to the last
    sequence, at indices past its count (they are not its rows: callers compare with the count)."""
    rows = torch.arange(total, device=cu_seqlens.device)
    cu = cu_seqlens.long()
    seq = torch.searchsorted(cu[1:], rows, right=True).clamp(max=cu.shape[0] - 2)
    return seq, rows - cu[seq]


def dense_rows(batch: int, n: int, device):
    """packed_rows' answer for [batch, n] rows read as batch * n rows, with each sequence's count and
    first row: (sequence, index, counts, first), int64."""
    seq = torch.arange(batch, device=device).repeat_interleave(n)
    index = torch.arange(n, device=device).repeat(batch)
    counts = torch.full((batch,), n, dtype=torch.long, device=device)
    return seq, index, counts, torch.arange(batch, device=device) * n


def write_rows(cache: torch.Tensor, page_table: Optional[torch.Tensor], seq: torch.Tensor, index: torch.Tensor,
               base: torch.Tensor, counts: torch.Tensor, first: torch.Tensor, new: torch.Tensor) -> None:
    """Rows new [n, h, d] into cache (contiguous [b, len, h, d] or paged [pages, page_size, h, d]
    behind page_table): row r is row index[r] of sequence seq[r] (int64 [n]), whose counts[s] new
    rows (rows first[s] ..  of new) go to positions base[s] + 0 .. counts[s] - 1, as fa3's append
    kernel writes them. A position outside the cache (cache_seqlens past its length, or negative: a
    broken contract that cannot be checked without a sync) writes nothing, where indexing with it
    would raise a device-side assert that poisons the CUDA context; and a row past its sequence's
    count is not one of its rows. One scatter: every row writes at its position clamped into the
    cache the value that position ends with — the new row whose position it is, or what it held —
    so rows that meet at a clamped position all write the same value. Page-table entries are the
    caller's contract, as for every fa3 call (clamped here only so that indexing cannot fault)."""
    base, counts, first = base.long()[seq], counts.long()[seq], first.long()[seq]
    if page_table is not None:
        page_size, width = cache.shape[1], page_table.shape[1]
        at = (base + index).clamp(0, width * page_size - 1)
        pages = page_table.long()[seq, at.div(page_size, rounding_mode="floor")].clamp(0, cache.shape[0] - 1)
        where = (pages, at.remainder(page_size))
    else:
        at = (base + index).clamp(0, cache.shape[1] - 1)
        where = (seq, at)
    own = at - base  # the index, within the sequence, of the row whose position `at` is
    has_row = (own >= 0) & (own < counts)
    source = (first + own).clamp(0, new.shape[0] - 1)
    # (bytes for one-byte caches: torch.where on float8 is not every backend's)
    raw = cache.view(torch.uint8) if cache.element_size() == 1 else cache
    new = new.to(cache.dtype)
    new = new.view(torch.uint8) if cache.element_size() == 1 else new
    raw[where] = torch.where(has_row[:, None, None], new[source], raw[where])


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotary embedding of the first 2 * cos.shape[-1] dims of x [..., s, h, d]; cos/sin [..., s, r/2]."""
    rot = 2 * cos.shape[-1]
    xr = x[..., :rot].float()
    c = cos.unsqueeze(-2).float()
    s = sin.unsqueeze(-2).float()
    if interleaved:  # pairs (0, 1), (2, 3), ...
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:            # GPT-NeoX halves (0, r/2), (1, r/2 + 1), ...
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
        out = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((out.to(x.dtype), x[..., rot:]), dim=-1)


def append_and_rotate(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                      v: Optional[torch.Tensor], page_table: Optional[torch.Tensor], seqused_k: Optional[torch.Tensor],
                      rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
                      rotary_seqlens: Optional[torch.Tensor], interleaved: bool, local_queries: bool,
                      cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k_new: Optional[torch.Tensor] = None):
    """q [b, s_q, h, d] (packed [total_q, h, d] with cu_seqlens_q) and new keys k, v [b, s_new, h_kv,
    d] (packed [total_new, h_kv, d] with cu_seqlens_k_new; or None): k rotated and k, v written into
    the caches at each sequence's seqused_k (None: 0); q rotated, at those positions + i where
    local_queries (causal, windows, chunks: FlashAttention-3's rule), else all at them. Rotary
    positions start at rotary_seqlens where given (the write positions do not move); positions past
    the tables read their last row, as fa3's append kernel. Returns (q, seqused_k after the append)."""
    batch = cu_seqlens_q.shape[0] - 1 if cu_seqlens_q is not None else q.shape[0]
    dev = q.device
    base = seqused_k if seqused_k is not None else torch.zeros(batch, dtype=torch.int32, device=dev)
    rotary_base = (rotary_seqlens if rotary_seqlens is not None else base).long()

    def table_rows(seq, index):  # rotary table rows of (sequence, index) pairs
        return (rotary_base[seq] + index).clamp(0, rotary_cos.shape[0] - 1)

    if k is not None:
        if cu_seqlens_k_new is not None:
            seq, index = packed_rows(cu_seqlens_k_new, k.shape[0])
            counts = (cu_seqlens_k_new[1:] - cu_seqlens_k_new[:-1]).long()
            first = cu_seqlens_k_new[:-1].long()
            rows_k = k
        else:
            seq, index, counts, first = dense_rows(batch, k.shape[1], dev)
            rows_k, v = k.flatten(0, 1), v.flatten(0, 1)
        if rotary_cos is not None:
            row = table_rows(seq, index)
            rows_k = rotary(rows_k, rotary_cos[row], rotary_sin[row], interleaved)
        write_rows(k_cache, page_table, seq, index, base, counts, first, rows_k)
        write_rows(v_cache, page_table, seq, index, base, counts, first, v)
        seqused_k = (base.long() + counts).to(torch.int32)
    if rotary_cos is not None:
        # Dense queries as batch * s_q rows, rotated as packed ones.
        seq, index = packed_rows(cu_seqlens_q, q.shape[0]) if cu_seqlens_q is not None else \
            dense_rows(batch, q.shape[1], dev)[:2]
        row = table_rows(seq, index if local_queries else torch.zeros_like(index))
        q = rotary(q.flatten(0, -3), rotary_cos[row], rotary_sin[row], interleaved).reshape(q.shape)
    return q, seqused_k


def cache_rows(k_cache: torch.Tensor, v_cache: torch.Tensor, batch: int, leftpad: Optional[torch.Tensor],
                seqused_k: Optional[torch.Tensor], entries: Optional[torch.Tensor] = None):
    """A contiguous cache [entries, seqlen_cache, heads_kv, d] as packed key rows: the caches viewed
    as [rows, heads_kv, d] in place (no copy); sequence b's keys start at row e x (the batch stride
    in rows) + its padding (e = entries[b], cache_batch_idx, else b), as many as it has past the
    padding. That is what fa3's call does for left-padded 16-bit caches (fa3's kernels take packed
    keys in any dtype); used here for left padding outside it (e4m3 caches, descales) and for
    chunked attention (attention_chunk). Clamped as fa3's call clamps them, on the device (no
    sync): a sequence's end (seqused_k, else seqlen_cache) to [0, seqlen_cache], its padding
    (leftpad, None: 0) to [0, end]. As in any fa3 call, the up to 127 rows after a sequence's keys
    (here: its entry's unused rows, or the next entry's) are read with weight 0, so they must hold
    finite values. Returns (k_rows, v_rows, first_row, key_count): int32 [batch]."""
    num, length = k_cache.shape[0], k_cache.shape[1]
    if entries is None and num != batch:
        raise ValueError(f"fa3: k_cache: expected one entry per sequence ({batch}), got {num}")
    if leftpad is not None and tuple(leftpad.shape) != (batch,):
        raise ValueError(f"fa3: cache_leftpad: expected shape ({batch},) (the batch), got {tuple(leftpad.shape)}")
    if v_cache.shape[:2] != k_cache.shape[:2]:
        raise ValueError(f"fa3: v_cache: expected the batch and length of k_cache {tuple(k_cache.shape[:2])}, "
                         f"got {tuple(v_cache.shape[:2])}")
    rows = []
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if num == 1:  # (one entry: its batch stride is never used)
            rows.append(length)
            continue
        if t.stride(1) <= 0 or t.stride(0) % t.stride(1) != 0 or t.stride(0) // t.stride(1) < length:
            raise ValueError(f"fa3: {name}: its batch stride must be a whole number of its rows (>= seqlen_cache) "
                             f"to read it as packed rows; got strides {tuple(t.stride())}")
        rows.append(t.stride(0) // t.stride(1))
    if rows[0] != rows[1]:
        raise ValueError(f"fa3: k_cache and v_cache must hold the same rows per batch entry to read them as "
                         f"packed rows; got {rows[0]} and {rows[1]}")
    total = (num - 1) * rows[0] + length
    if total >= 2**31:
        raise ValueError(f"fa3: k_cache: {total} rows read as packed rows exceed what int32 row indices reach")

    def packed(t):
        return t.as_strided((total,) + tuple(t.shape[2:]), (t.stride(1),) + tuple(t.stride()[2:]), t.storage_offset())
    dev = k_cache.device
    end = seqused_k.to(torch.int32) if seqused_k is not None else torch.full((batch,), length, dtype=torch.int32,
                                                                             device=dev)
    end = end.clamp(0, length)
    pad = torch.zeros_like(end) if leftpad is None else torch.minimum(leftpad.to(torch.int32).clamp(min=0), end)
    entry = torch.arange(batch, dtype=torch.int32, device=dev) if entries is None else entries.to(torch.int32)
    return packed(k_cache), packed(v_cache), entry * rows[0] + pad, (end - pad).to(torch.int32)
