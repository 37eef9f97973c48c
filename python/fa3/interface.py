"""FlashAttention-3's ``flash_attn_interface`` functions, on fa3.

Same names, arguments, defaults and return conventions, so that ``import fa3 as
flash_attn_interface`` works for code written against FlashAttention-3: BSHD tensors, ``out`` or
``(out, softmax_lse)``, softmax_lse in natural log, [batch, heads, seqlen] (varlen: [heads, total_q]).

What fa3 does not implement raises NotImplementedError naming the argument (``qv``, and a
few combinations each function names); a backward through an FP8 or paged forward raises
RuntimeError saying so. Tuning hints
that fa3 does not need are accepted and have no effect: ``pack_gqa``, ``scheduler_metadata``.
``sm_margin`` (SMs left free for kernels on other streams, e.g. communication) limits the
forward's persistent grid; the backward's grid is not persistent (its CTAs free SMs as they retire)
and takes no margin.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from . import _chunked, _kvcache, _ops

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "get_scheduler_metadata",
    "quantize_fp8",
]


def _not_supported(name: str, what: str = "not supported by fa3 yet") -> NotImplementedError:
    return NotImplementedError(f"fa3: {name}: {what}")


def _check_common(qv) -> None:
    if qv is not None:
        raise _not_supported("qv")


def _chunk(attention_chunk) -> int:
    """attention_chunk as an int: 0 (or None) is no chunking."""
    if attention_chunk in (0, None):
        return 0
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int) or attention_chunk < 0:
        raise ValueError(f"fa3: attention_chunk: expected an int >= 0 (0: none), got {attention_chunk!r}")
    return attention_chunk


def _chunked_attention(q, k, v, chunk, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       descales, kwargs, seqused_q=None, seqused_k=None):
    """attention_chunk: one varlen call over the sequences cut into their chunks (_chunked.py).
    Returns (out, lse) in the caller's layouts."""
    packed_k = cu_seqlens_k is not None
    args = _chunked.chunked_varlen_args(q, k, chunk, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                        seqused_q=seqused_q, seqused_k=seqused_k)
    return _grouped_call(q, cu_seqlens_q, _chunked.packed(k, packed_k), _chunked.packed(v, packed_k), args,
                         descales, kwargs)


def _grouped_call(q, cu_seqlens_q, k, v, args, descales, kwargs):
    """The one varlen call of chunked attention over its groups (args: _chunked's, every sequence's
    groups in a row): FlashAttention-3's per-(batch, kv head) descales repeated per group, q as
    packed rows; returns (out, lse) in the caller's layouts (packed, or [b, s_q, h, d] and
    [b, h, s_q])."""
    packed_q = cu_seqlens_q is not None
    batch = cu_seqlens_q.shape[0] - 1 if packed_q else q.shape[0]
    per_sequence = (args["cu_seqlens_q"].shape[0] - 1) // batch  # groups of each sequence
    descales = [None if t is None else t.repeat_interleave(per_sequence, dim=0) for t in descales]
    out, lse = _ops.fwd(_chunked.packed(q, packed_q), k, v, q_descale=descales[0], k_descale=descales[1],
                        v_descale=descales[2], **args, **kwargs)
    if packed_q:
        return out, lse
    b, s_q, h = q.shape[0], q.shape[1], q.shape[2]
    return out.reshape(b, s_q, h, out.shape[-1]), lse.reshape(h, b, s_q).permute(1, 0, 2).contiguous()


def _window(window_size, causal) -> Tuple[int, int]:
    left, right = (None, None) if window_size is None else window_size
    return _ops.window(left, right, causal)


def _scale(softmax_scale: Optional[float]) -> float:
    # 0.0 asks fa3 for its default, 1/sqrt(head_dim_qk), as FlashAttention's None does; so an
    # explicit 0 (uniform attention) cannot be passed on.
    if softmax_scale is None:
        return 0.0
    if softmax_scale == 0:
        raise ValueError("fa3: softmax_scale: 0 is not supported (fa3 reads 0 as the default "
                         "1/sqrt(head_dim)); pass None for the default")
    return float(softmax_scale)


def _sinks(learnable_sink):
    """Attention-sink logits as the kernels take them: float32 [heads_q], contiguous (the cast is
    differentiable, so a bf16 parameter gets its gradient)."""
    if learnable_sink is None:
        return None
    if learnable_sink.dim() != 1:
        raise ValueError("fa3: learnable_sink: expected a 1-D tensor [heads_q], got shape "
                         f"{tuple(learnable_sink.shape)}")
    return learnable_sink.to(torch.float32).contiguous()


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                    return_attn_probs=False, q_block_descale=None, k_block_descale=None,
                    v_block_descale=None, q_block_size=128, kv_block_size=128,
                    learnable_sink=None):
    """Attention over [batch, seqlen, heads, head_dim] tensors; differentiable in q, k, v.

    GQA/MQA: k and v may have fewer heads than q (a divisor). causal is bottom-right aligned;
    window_size = (left, right), -1 unbounded (causal sets right to 0, as FlashAttention-3). Returns out, or (out, softmax_lse) when
    return_attn_probs (softmax_lse float32 [batch, heads, seqlen_q], differentiable: a loss that
    uses it gets its gradient in q, k, v, as FlashAttention's does not).
    float8_e4m3fn q/k/v: q/k/v_descale as FlashAttention-3's (float32 [batch, heads_kv]), and
    (fa3) block descales float32 [batch, heads, blocks] per q_block_size / kv_block_size tokens,
    as quantize_fp8 returns them. learnable_sink: [heads_q] attention-sink logits (gpt-oss: one
    per head joining every row's softmax denominator, in the units of the scaled scores),
    differentiable. attention_chunk > 0 (Llama 4's local layers, FlashAttention-3's semantics): a
    query at position p sees only the keys j with j // chunk == p // chunk, within its causal mask
    or window; run as one varlen call (fa3._chunked), forward and backward.
    """
    _check_common(qv)
    wl, wr = _window(window_size, causal)
    chunk = _chunk(attention_chunk)
    # A chunk that holds every key changes nothing where no query sits before the first key (or
    # a causal mask hides every key from those that do).
    if chunk and not (chunk >= k.shape[1] and (causal or q.shape[1] <= k.shape[1])):
        if q_block_descale is not None or k_block_descale is not None or v_block_descale is not None:
            raise _not_supported("attention_chunk", "chunked attention with block descales")
        out, lse = _chunked_attention(
            q, k, v, chunk, None, None, q.shape[1], k.shape[1], (q_descale, k_descale, v_descale),
            dict(softmax_scale=_scale(softmax_scale), causal=bool(causal), window_left=wl, window_right=wr,
                 softcap=float(softcap), num_splits=int(num_splits), deterministic=bool(deterministic),
                 sinks=_sinks(learnable_sink), sm_margin=int(sm_margin)))
        return (out, lse) if return_attn_probs else out
    if (q_block_descale is not None or k_block_descale is not None or v_block_descale is not None
            or learnable_sink is not None or sm_margin):
        out, lse = _ops.fwd(
            q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
            softmax_scale=_scale(softmax_scale), causal=bool(causal), window_left=wl, window_right=wr,
            softcap=float(softcap), num_splits=int(num_splits), deterministic=bool(deterministic),
            q_block_descale=q_block_descale, k_block_descale=k_block_descale,
            v_block_descale=v_block_descale, q_block_size=int(q_block_size),
            kv_block_size=int(kv_block_size), sinks=_sinks(learnable_sink), sm_margin=int(sm_margin))
        return (out, lse) if return_attn_probs else out
    # Positional: the call every training step makes, kept lean (keywords cost ~1 us here).
    # (The operator copies a q/k/v whose head dim is not contiguous; scale 0 is fa3's default.)
    out, lse = _ops.fwd(
        q, k, v, None, None, None, None, 0, 0, None, q_descale, k_descale, v_descale,
        _scale(softmax_scale), bool(causal), wl, wr, float(softcap), int(num_splits),
        bool(deterministic))
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False, learnable_sink=None):
    """Attention over packed sequences: q [total_q, heads, d], k/v [total_k, heads_kv, d].

    cu_seqlens_q / cu_seqlens_k: int32 [batch + 1] cumulative lengths (either may be None: then
    that side is [batch, seqlen, heads, d]); seqused_q / seqused_k shorten each sequence.
    max_seqlen_q / max_seqlen_k are host ints (no device sync). softmax_lse: [heads, total_q].
    learnable_sink: [heads_q] attention-sink logits, as flash_attn_func's; attention_chunk as
    flash_attn_func's, each sequence (its seqused_q / seqused_k rows where given) chunked on its own.
    """
    _check_common(qv)
    if cu_seqlens_q is None and cu_seqlens_k is None:
        raise ValueError("fa3: cu_seqlens_q / cu_seqlens_k: at least one is needed for the varlen "
                         "function (use flash_attn_func for fixed-length batches)")
    wl, wr = _window(window_size, causal)
    chunk = _chunk(attention_chunk)
    # One chunk holding every key changes nothing only under a causal mask here: whether a query
    # sits before its sequence's first key is device data.
    if chunk and not (chunk >= int(max_seqlen_k or 0) and causal):
        out, lse = _chunked_attention(
            q, k, v, chunk, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q or 0), int(max_seqlen_k or 0),
            (q_descale, k_descale, v_descale),
            dict(softmax_scale=_scale(softmax_scale), causal=bool(causal), window_left=wl, window_right=wr,
                 softcap=float(softcap), num_splits=int(num_splits), deterministic=bool(deterministic),
                 sinks=_sinks(learnable_sink), sm_margin=int(sm_margin)), seqused_q=seqused_q, seqused_k=seqused_k)
        return (out, lse) if return_attn_probs else out
    out, lse = _ops.fwd(
        q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_q=seqused_q,
        seqused_k=seqused_k, max_seqlen_q=int(max_seqlen_q or 0),
        max_seqlen_k=int(max_seqlen_k or 0), q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, softmax_scale=_scale(softmax_scale), causal=bool(causal),
        window_left=wl, window_right=wr, softcap=float(softcap), num_splits=int(num_splits),
        deterministic=bool(deterministic), sinks=_sinks(learnable_sink), sm_margin=int(sm_margin))
    return (out, lse) if return_attn_probs else out


def quantize_fp8(x, block_size=128, hadamard=False, seed=0):
    """fa3's FP8 quantization of a float16/bfloat16 [batch, seqlen, heads, head_dim] tensor:
    (float8_e4m3fn tensor, float32 descales [batch, heads, ceil(seqlen / block_size)]), one descale
    per block of block_size tokens (16, 32, 64 or a multiple of 128). hadamard=True rotates x by a
    random-sign Walsh-Hadamard matrix first (incoherent processing): quantize q and k with the
    same seed (the scores are unchanged), v without. One kernel; feed the results to
    flash_attn_func's q/k/v_block_descale."""
    return _ops.quantize_fp8(x, int(block_size), bool(hadamard), int(seed))


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False):
    """qkv [batch, seqlen, 3, heads, d], or [batch, seqlen, heads_q + 2 * heads_kv, d] with
    num_heads_q (GQA). Q, K and V are read in place through strides (no copy); autograd gathers
    their gradients into qkv's."""
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"fa3: qkv: expected [batch, seqlen, 3, heads, d], got {tuple(qkv.shape)}")
        q, k, v = qkv.unbind(dim=2)
    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError("fa3: num_heads_q: required for a 4-D qkv [batch, seqlen, heads_q + "
                             "2 * heads_kv, d]")
        heads_kv = (qkv.shape[2] - num_heads_q) // 2
        if heads_kv <= 0 or num_heads_q + 2 * heads_kv != qkv.shape[2]:
            raise ValueError(f"fa3: num_heads_q: {num_heads_q} does not split {qkv.shape[2]} heads "
                             "into heads_q + 2 * heads_kv")
        q, k, v = qkv.split([num_heads_q, heads_kv, heads_kv], dim=2)
    else:
        raise ValueError(f"fa3: qkv: expected 4 or 5 dims, got {qkv.dim()}")
    return flash_attn_func(q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale,
                           window_size, attention_chunk, softcap, 1, None, deterministic,
                           sm_margin, return_attn_probs)


def _kvcache_chunked(q, k_cache, v_cache, chunk, cu_seqlens_q, max_seqlen_q, seqused_k, seqlen_k, page_table,
                     leftpad, entries, descales, kwargs):
    """flash_attn_with_kvcache's attention_chunk: one grouped varlen call (_chunked.py) over the
    cache, read in place — a contiguous one as packed rows (_kvcache.cache_rows), a paged one through a
    page-table row per group (chunks a multiple of the page size). Returns (out, lse) in the
    caller's layouts."""
    packed_q = cu_seqlens_q is not None
    batch = cu_seqlens_q.shape[0] - 1 if packed_q else q.shape[0]
    len_q, first_q = _chunked._lengths(q, cu_seqlens_q)
    if page_table is None or entries is not None:
        k_rows, v_rows, first_k, len_k = _kvcache.cache_rows(k_cache, v_cache, batch, leftpad, seqused_k, entries)
        args = _chunked.group_args(len_q, first_q, len_k.long(), chunk, seqlen_k, first_k=first_k.long(), counts_k=True)
    else:
        page_size = k_cache.shape[1]
        if chunk % page_size != 0:
            raise _not_supported("attention_chunk", f"chunks of {chunk} keys on pages of {page_size} rows (a "
                                                    "paged cache is chunked where chunks are whole pages)")
        len_k = (seqused_k.long() if seqused_k is not None else
                 torch.full((batch,), seqlen_k, dtype=torch.int64, device=q.device)).clamp(0, seqlen_k)
        k_rows, v_rows = k_cache, v_cache
        args = _chunked.group_args(len_q, first_q, len_k, chunk, seqlen_k, page_table=page_table,
                                   page_size=page_size)
    args["max_seqlen_q"] = int(max_seqlen_q or 0) if packed_q else q.shape[1]
    with torch.no_grad():
        return _grouped_call(q, cu_seqlens_q, k_rows, v_rows, args, descales, kwargs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
                            cache_batch_idx: Optional[torch.Tensor] = None,
                            cache_leftpad: Optional[torch.Tensor] = None,
                            page_table: Optional[torch.Tensor] = None,
                            cu_seqlens_q: Optional[torch.Tensor] = None,
                            cu_seqlens_k_new: Optional[torch.Tensor] = None,
                            max_seqlen_q: Optional[int] = None,
                            rotary_seqlens: Optional[torch.Tensor] = None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False,
                            learnable_sink=None):
    """Attention of q against a KV cache (contiguous [batch_cache, seqlen_cache, heads_kv, d] or
    paged [num_pages, page_size, heads_kv, d] with page_table), optionally appending k/v first.

    The append (k, v written into the cache at cache_seqlens, in place) and the rotary embedding of
    q and k run in fa3's call, one kernel before the attention (fa3::fwd_kvcache), for fp16/bf16,
    also with packed queries (cu_seqlens_q) and packed new keys (cu_seqlens_k_new: k, v
    [total_new, heads_kv, d]); with e4m3 they are PyTorch operations before it (dense or packed
    alike; no device sync either way). cache_batch_idx maps each batch entry to a cache row.
    cache_leftpad (int32 [batch], a contiguous cache): sequence b's keys are cache rows
    cache_leftpad[b] .. cache_seqlens[b] + new keys - 1 (FlashAttention-3's; the new keys and their
    rotary positions still count from row 0). rotary_seqlens (int32 [batch]): the rotary position of
    each sequence's first new key (and of its queries), in place of cache_seqlens.
    learnable_sink: [heads_q] attention-sink logits (split decodes add them once, in the combine).
    attention_chunk > 0 (FlashAttention-3's semantics, as flash_attn_func's): one grouped call over
    the cache in place (contiguous caches as packed rows, paged ones where a chunk is whole pages),
    the append and rotary then by PyTorch operations.
    Not differentiable (as FlashAttention-3's).
    """
    _check_common(qv)
    chunk = _chunk(attention_chunk)
    if cu_seqlens_k_new is not None and k is None:
        raise ValueError("fa3: cu_seqlens_k_new: given without new keys k, v")
    if (k is None) != (v is None):
        raise ValueError("fa3: k, v: give both new keys and new values, or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("fa3: rotary_cos, rotary_sin: give both or neither")
    if rotary_seqlens is not None and rotary_cos is None:
        raise ValueError("fa3: rotary_seqlens: given without rotary_cos / rotary_sin (they are its positions)")
    varlen_q = cu_seqlens_q is not None
    batch = cu_seqlens_q.shape[0] - 1 if varlen_q else q.shape[0]
    dev = q.device
    if cache_seqlens is None:
        seqused_k = None
    elif isinstance(cache_seqlens, int):
        seqused_k = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=dev)
    else:
        seqused_k = cache_seqlens.to(torch.int32)
    if cache_leftpad is not None:
        if page_table is not None or cache_batch_idx is not None:
            raise ValueError("fa3: cache_leftpad: cannot be combined with page_table or cache_batch_idx "
                             "(a left-padded cache is a contiguous [batch, seqlen_cache, heads_kv, d] one)")
        cache_leftpad = cache_leftpad.to(torch.int32)
    entries = cache_batch_idx  # (chunked attention reads the contiguous cache as packed rows)
    if cache_batch_idx is not None:
        if page_table is not None:
            raise ValueError("fa3: cache_batch_idx: cannot be combined with page_table")
        # A contiguous cache indexed by cache_batch_idx is a paged cache whose pages are whole
        # cache rows: fa3 reads it in place through a one-column page table.
        page_table = cache_batch_idx.to(torch.int32).reshape(batch, 1)
    wl, wr = _window(window_size, causal)
    if page_table is None:
        seqlen_k = k_cache.shape[1]
    else:
        seqlen_k = page_table.shape[1] * k_cache.shape[1]
    if rotary_seqlens is not None:
        rotary_seqlens = rotary_seqlens.to(torch.int32)
    # A chunk that holds every key of a causal call changes nothing (as in flash_attn_func).
    chunked = chunk > 0 and not (chunk >= seqlen_k and causal)
    fused = (k is not None or rotary_cos is not None or cache_leftpad is not None) \
        and q.dtype in (torch.float16, torch.bfloat16) and q_descale is None and k_descale is None \
        and v_descale is None and not chunked and _ops.available() and q.is_cuda
    if fused:  # the append, rotary and left padding in fa3's call (fa3::fwd_kvcache)
        if k is not None:  # the kernel takes q's dtype and a contiguous head dim
            k, v = (t.to(q.dtype) for t in (k, v))
            k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
            if seqused_k is None:  # appending to empty caches
                seqused_k = torch.zeros(batch, dtype=torch.int32, device=dev)
        if rotary_cos is not None:  # tables in q's dtype (FlashAttention-3 asks for that dtype too)
            rotary_cos, rotary_sin = (t.to(q.dtype) for t in (rotary_cos, rotary_sin))
        with torch.no_grad():
            out, lse = _ops.fwd_kvcache(
                q, k_cache, v_cache, k, v, seqused_k, rotary_cos, rotary_sin, bool(rotary_interleaved),
                page_table, int(seqlen_k) if page_table is not None else 0, _scale(softmax_scale), bool(causal),
                wl, wr, float(softcap), int(num_splits), _sinks(learnable_sink), cu_seqlens_q,
                int(max_seqlen_q or 0), cu_seqlens_k_new, cache_leftpad, rotary_seqlens, int(sm_margin))
        return (out, lse) if return_softmax_lse else out
    if k is not None or rotary_cos is not None:  # (a plain decode call allocates nothing here)
        # As FlashAttention-3: causal / local queries sit at cache_seqlens + i, the others all at
        # cache_seqlens; a window that reaches every key is none (the kernels' rule too); chunked
        # attention is local. Packed queries and new keys as in fa3's call (cu_seqlens_q,
        # cu_seqlens_k_new).
        s_q = int(max_seqlen_q or 0) if varlen_q else q.shape[1]
        local = causal or chunk > 0 or 0 <= wl < seqlen_k - 1 or 0 <= wr < s_q - 1
        q, seqused_k = _kvcache.append_and_rotate(q, k_cache, v_cache, k, v, page_table, seqused_k, rotary_cos,
                                                  rotary_sin, rotary_seqlens, bool(rotary_interleaved), local,
                                                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new)

    kwargs = dict(softmax_scale=_scale(softmax_scale), causal=bool(causal), window_left=wl, window_right=wr,
                  softcap=float(softcap), num_splits=int(num_splits), sinks=_sinks(learnable_sink),
                  sm_margin=int(sm_margin))
    if chunked:  # (after the append, which writes at cache_seqlens from row 0)
        out, lse = _kvcache_chunked(q, k_cache, v_cache, chunk, cu_seqlens_q, max_seqlen_q, seqused_k, int(seqlen_k),
                                    page_table, cache_leftpad, entries, (q_descale, k_descale, v_descale), kwargs)
        return (out, lse) if return_softmax_lse else out
    cu_seqlens_k = None
    if cache_leftpad is not None:  # the cache as packed rows from each sequence's padding on
        k_cache, v_cache, first, seqused_k = _kvcache.cache_rows(k_cache, v_cache, batch, cache_leftpad, seqused_k)
        cu_seqlens_k = torch.cat([first, torch.full((1,), k_cache.shape[0], dtype=torch.int32, device=dev)])
    with torch.no_grad():
        out, lse = _ops.fwd(
            q, k_cache, v_cache, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            seqused_k=seqused_k, max_seqlen_q=int(max_seqlen_q or 0), max_seqlen_k=int(seqlen_k),
            page_table=page_table, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, **kwargs)
    return (out, lse) if return_softmax_lse else out


def flash_attn_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out=None,
                       out_dtype=None):
    """Merges split results through their LSEs: out_partial [splits, ..., heads, d] float32,
    lse_partial [splits, ..., heads] (FlashAttention-3's [splits, batch, seqlen, heads]) ->
    (out [..., heads, d], lse [..., heads]). Splits with lse = -inf contribute nothing (their
    partial rows are not read). CUDA tensors of up to 128 splits and head dims that are multiples of
    4 up to 256 run fa3's combine kernel (the one split-KV uses); others PyTorch operations."""
    if out_partial.dim() != lse_partial.dim() + 1 or out_partial.shape[:-1] != lse_partial.shape:
        raise ValueError(f"fa3: lse_partial: expected shape {tuple(out_partial.shape[:-1])} "
                         f"(out_partial's without head_dim), got {tuple(lse_partial.shape)}")
    dtype = out_dtype or (out.dtype if out is not None else out_partial.dtype)
    splits, d = out_partial.shape[0], out_partial.shape[-1]
    if (out_partial.is_cuda and _ops.available() and out_partial.dim() >= 3 and 1 <= splits <= 128
            and d % 4 == 0 and d <= 256 and dtype in _ops.COMBINE_DTYPES):
        lead = out_partial.shape[1:-2]  # [..., heads] -> [batch = prod(...), 1, heads]
        op = out_partial.float().reshape(splits, -1, 1, out_partial.shape[-2], d)
        if op.stride(-1) != 1 or any(st % 4 for st in op.stride()[:-1]) or _ops.start_offset(op) % 16:
            op = op.contiguous()
        lp = lse_partial.float().reshape(splits, op.shape[1], 1, op.shape[3])
        merged, lse = _ops.combine(op, lp, dtype)
        merged = merged.reshape(*lead, out_partial.shape[-2], d)
        lse = lse.reshape(*lead, out_partial.shape[-2])
        if out is not None:
            out.copy_(merged)
            merged = out
        return merged, lse
    lse_partial = lse_partial.float()
    lse = torch.logsumexp(lse_partial, dim=0)
    # A row whose splits are all empty has lse = -inf: give it weight 0, not NaN.
    w = torch.exp(lse_partial - lse.masked_fill(torch.isinf(lse), 0.0).unsqueeze(0))
    merged = (w.unsqueeze(-1) * out_partial.float()).sum(0)
    merged = merged.to(out_dtype or out_partial.dtype)
    if out is not None:
        out.copy_(merged)
        merged = out
    return merged, lse


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv,
                           headdim, cache_seqlens: torch.Tensor, qkv_dtype=torch.bfloat16,
                           headdim_v=None, cu_seqlens_q=None, cu_seqlens_k_new=None,
                           cache_leftpad=None, page_size=None, max_seqlen_k_new=0, causal=False,
                           window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                           num_splits=0, pack_gqa=None, sm_margin=0):
    """fa3 schedules on the device and needs no precomputed metadata: an empty int32 tensor, which
    flash_attn_with_kvcache accepts as scheduler_metadata and ignores."""
    return torch.empty(0, dtype=torch.int32, device=cache_seqlens.device)
