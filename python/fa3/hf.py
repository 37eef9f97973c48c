"""fa3 as an attention implementation for Hugging Face transformers (written against 5.17).

    import fa3.hf
    fa3.hf.register()                     # once per process; name defaults to "fa3"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa3")
    model.set_attn_implementation("fa3")  # or switch an existing model

What transformers 5.17 does with an implementation name, and why the default is "fa3" (read from
modeling_utils.py, utils/generic.py, masking_utils.py, modeling_flash_attention_utils.py,
integrations/hub_kernels.py):

* `AttentionInterface.register` / `AttentionMaskInterface.register` write the class-wide mapping, so the
  entry is seen by `ALL_ATTENTION_FUNCTIONS`, `ALL_MASK_ATTENTION_FUNCTIONS` and model-local instances.
  `get_correct_attn_implementation` accepts any registered name; an unregistered one is a ValueError.
* "Is it flash attention?" is `is_flash_attention_requested`: the substring "flash" anywhere in the name.
  For a name with "flash" that is not exactly flash_attention_2/3/4, `_check_and_adjust_attn_implementation`
  (run by from_config / from_pretrained / set_attn_implementation) calls `lazy_import_flash_attention(name)`,
  which treats the name as a Hub kernel repository and fails ("Could not find the currently requested flash
  attention implementation"); and models that list `_compatible_flash_implementations` (gpt_oss,
  granite_swa, ...) silently replace any "flash" name by their own default. So the name must NOT contain
  "flash". Other substrings are taken too: "sdpa" and "flex_attention" run those backends' dispatch checks,
  "owner/repo" is a Hub kernel id, a "paged|" prefix selects the paged (continuous batching) path, and
  "eager" is the built-in fallback. `register` refuses such names.
* What a non-"flash" name gives up: code that branches on `is_flash_attention_requested` takes its generic
  path. For decoder LMs (Llama, Mistral, Qwen2/3, Gemma2, ...) that code does not exist: the only
  name-dependent step is the mask interface, and we register transformers' own `flash_attention_mask` for
  it. Vision towers (Qwen2/2.5/3-VL, GLM4V, Pixtral, ...) then loop over images with attention_mask=None
  instead of passing cu_seqlens (correct, slower) or build 4-D masks (rejected below with a clear error).
  Generation does not force fullgraph=False under compile, and `create_chunked_causal_mask`'s guard for
  flash kernels (chunked attention longer than the chunk cannot be expressed) does not fire; our mask
  function repeats that guard.
* Mask form: `flash_attention_mask` returns None when nothing is padded, else the boolean 2-D padding mask
  [batch, kv_len] (sliced to the last kv_len columns). It ignores the mask pattern (causal, sliding window,
  packed-sequence boundaries, image-block overlays): the kernel call must express them, as transformers'
  own flash path does.
* Packed (padding-free) batches are not decided by the name in 5.17: `_preprocess_mask_arguments` detects
  them from position_ids for every registered mask implementation, and `flash_attention_mask` drops that
  pattern. The attention function must find the sequences itself, from cu_seq_lens_q/k + max_length_q/k
  kwargs (DataCollatorWithFlattening(return_flash_attn_kwargs=True)) or from batch-1 position_ids that
  restart (transformers' flash path: `_is_packed_sequence` and `prepare_fa_kwargs_from_position_ids`).
* Sliding window: eager/sdpa masks keep keys with kv_idx > q_idx - sliding_window, i.e. the current token
  and sliding_window - 1 before it; transformers' flash path passes window_size=(w - 1, w - 1) when
  key_length > w and relies on causal to clip the right side. We pass (w - 1, 0) when causal.
* Tensors: the attention function gets query [b, h_q, s_q, d], key/value [b, h_kv, s_k, d] and returns
  ([b, s_q, h_q, d_v], None); `is_causal` may come as a keyword (vision towers pass False) and overrides
  module.is_causal.
"""

import os
import weakref

import torch
import torch.nn.functional as F

from fa3 import interface

DEFAULT_NAME = "fa3"

# Substrings / forms of an implementation name that transformers 5.17 gives a meaning of its own (see above).
_RESERVED_SUBSTRINGS = ("flash", "sdpa", "flex_attention", "/", ":", "|")


def register(name: str = DEFAULT_NAME) -> str:
    """Register fa3 with transformers under `name`; returns the name. Calling it again is harmless."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}")
    lowered = name.lower()
    clash = [s for s in _RESERVED_SUBSTRINGS if s in lowered]
    if clash or lowered == "eager":
        raise ValueError(
            f"name: {name!r} has a meaning of its own in transformers (contains {clash or ['eager']}: 'flash' "
            "makes it load a Hub kernel of that name, 'sdpa'/'flex_attention' run those backends' checks, "
            "'/' or ':' mark a Hub kernel id, '|' the paged prefix); expected a plain name such as 'fa3'"
        )

    # Imported here so that `import fa3.hf` does not require transformers.
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, _make_mask_function(flash_attention_mask))
    return name


def _make_mask_function(flash_attention_mask):
    """transformers' flash mask function plus the chunked-attention guard it only applies to 'flash' names."""

    def fa3_attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                           attention_mask=None, **kwargs):
        chunk_size = getattr(kwargs.get("config"), "attention_chunk_size", None)
        if chunk_size is not None and kv_length + kv_offset > chunk_size and _has_chunked_pattern(mask_function):
            raise ValueError(
                f"attention_chunk_size: chunked attention over {kv_length + kv_offset} keys with chunks of "
                f"{chunk_size} cannot be expressed through the fa3 transformers integration; "
                "use attn_implementation='sdpa' for this model"
            )
        if mask_function is not None:  # else keep transformers' default pattern
            kwargs["mask_function"] = mask_function
        return flash_attention_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
                                    attention_mask=attention_mask, **kwargs)

    return fa3_attention_mask


def _has_chunked_pattern(fn, depth: int = 0) -> bool:
    """Whether a masking_utils mask function contains the chunked overlay (mask functions are closures)."""
    if fn is None or depth > 8:
        return False
    if getattr(fn, "__qualname__", "").startswith("chunked_overlay"):
        return True
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # empty cell
            continue
        candidates = content if isinstance(content, (tuple, list)) else (content,)
        if any(callable(c) and _has_chunked_pattern(c, depth + 1) for c in candidates):
            return True
    return False


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, **kwargs):
    """transformers attention function: query [b, h_q, s_q, d], key/value [b, h_kv, s_k, d] ->
    ([b, s_q, h_q, d_v], None). Dense kernel without padding; varlen kernel for padded or packed batches."""
    if dropout:
        # fa3 has no dropout, and silently skipping it would change training. A math fallback would need
        # the 4-D mask that transformers did not build for this implementation, so we refuse instead.
        raise ValueError(
            f"dropout: fa3 has no attention dropout, got dropout={dropout}; set the config's attention_dropout "
            "to 0.0 or train this model with attn_implementation='sdpa'"
        )
    for arg_name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4 or any(n == 0 for n in t.shape):
            raise ValueError(f"{arg_name}: expected a non-empty 4-D tensor [batch, heads, seq, head_dim], "
                             f"got shape {tuple(t.shape)}")

    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", None)
    if is_causal is None:
        raise ValueError("is_causal: neither passed nor set on the attention module")

    # fa3 takes [b, s, h, d]; these transposes are views (the kernel accepts any strides, last dim contiguous).
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    q, k, v = _cast_for_kernel(q, k, v, module)

    flash_kwargs = dict(
        softmax_scale=scaling,
        causal=bool(is_causal),
        window_size=_window_size(sliding_window, bool(is_causal), k.shape[1]),
        softcap=float(softcap) if softcap else 0.0,
        deterministic=_deterministic(kwargs.get("deterministic")),
        # gpt-oss's learnable sinks (transformers passes them as s_aux: one logit per query head).
        learnable_sink=kwargs.get("s_aux"),
    )

    if attention_mask is not None:
        out = _padded_attention(q, k, v, attention_mask, flash_kwargs)
    else:
        packed = _packed_layout(q, k, kwargs)
        if packed is None:
            out = _first(interface.flash_attn_func(q, k, v, **flash_kwargs))
        else:
            cu_q, cu_k, max_q, max_k = packed
            out = _first(interface.flash_attn_varlen_func(
                q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]),
                cu_q, cu_k, max_q, max_k, **flash_kwargs))
            out = out.view(q.shape[0], q.shape[1], *out.shape[1:])
    return out, None


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _window_size(sliding_window, causal: bool, key_length: int):
    # A window at least as long as the keys changes nothing; leaving it off keeps the kernel's plain path.
    if sliding_window is None or key_length <= sliding_window:
        return (-1, -1)
    left = int(sliding_window) - 1
    return (left, 0 if causal else left)


def _deterministic(requested):
    if requested is not None:
        return bool(requested)
    # Same switch transformers' flash path reads, plus torch's global determinism flag.
    return os.getenv("FLASH_ATTENTION_DETERMINISTIC", "0") == "1" or torch.are_deterministic_algorithms_enabled()


def _cast_for_kernel(q, k, v, module):
    """fa3 computes in fp16/bf16. float32 activations reach attention when layer norms are upcast (PEFT) or
    under autocast; bring them to the dtype the model computes in, as transformers' flash path does."""
    if q.dtype != torch.float32:
        return q, k, v
    device_type = q.device.type
    target = None
    if torch.is_autocast_enabled(device_type):
        target = torch.get_autocast_dtype(device_type)
    else:
        linear = next((m for m in module.modules() if isinstance(m, torch.nn.Linear)), None)
        if linear is not None and linear.weight.dtype in (torch.float16, torch.bfloat16):
            target = linear.weight.dtype
    if target is None or target == torch.float32:
        return q, k, v  # left to the kernel, which names the dtype it cannot take
    return q.to(target), k.to(target), v.to(target)


def _padded_attention(q, k, v, attention_mask, flash_kwargs):
    """2-D padding mask: gather the valid tokens, run the varlen kernel, scatter back (padding rows get 0)."""
    if attention_mask.dim() != 2:
        raise ValueError(
            "attention_mask: the fa3 implementation takes a 2-D padding mask [batch, kv_len] or None, got shape "
            f"{tuple(attention_mask.shape)} (a custom 4-D mask needs attn_implementation='sdpa' or 'eager')"
        )
    batch, q_len = q.shape[:2]
    kv_len = attention_mask.shape[1]
    if attention_mask.shape[0] != batch:
        raise ValueError(f"attention_mask: batch {attention_mask.shape[0]} does not match query batch {batch}")
    if k.shape[1] > kv_len:
        # A static cache hands over all its slots; the mask says how many are filled.
        k, v = k[:, :kv_len], v[:, :kv_len]
    elif k.shape[1] < kv_len:
        raise ValueError(f"attention_mask: covers {kv_len} keys but key has {k.shape[1]}")
    k_rows, k_cols, cu_k, max_k = _unpad_indices(attention_mask, kv_len)
    if flash_kwargs["causal"]:
        # Causal: self-attention, the queries the newest q_len tokens (all of them without a cache), i.e. the
        # last q_len mask columns; dropping the padded ones keeps the bottom-right alignment between valid
        # queries and valid keys.
        if q_len > kv_len:
            raise ValueError(f"attention_mask: covers {kv_len} keys, fewer than the {q_len} causal queries")
        q_rows, q_cols, cu_q, max_q = _unpad_indices(attention_mask, q_len)
    else:
        # Not causal: the mask may describe other tokens than the queries (cross-attention: the encoder's, even
        # where both have the same length), and a query's result depends only on which keys are valid, so
        # every query is kept (padded ones get the attention of the valid keys, as with SDPA).
        q_rows, q_cols, cu_q, max_q = _all_positions(batch, q_len, q.device)

    # Advanced indexing on (batch, seq) gathers [nnz, h, d] straight from the strided views.
    out = _first(interface.flash_attn_varlen_func(
        q[q_rows, q_cols], k[k_rows, k_cols], v[k_rows, k_cols], cu_q, cu_k, max_q, max_k, **flash_kwargs))
    return out.new_zeros(batch, q_len, *out.shape[1:]).index_put((q_rows, q_cols), out)


def _all_positions(batch, length, device):
    rows = torch.arange(batch, device=device).repeat_interleave(length)
    cols = torch.arange(length, device=device).repeat(batch)
    cu_seqlens = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)
    return rows, cols, cu_seqlens, length


# Every layer of one forward gets the same mask / position_ids tensor. Deriving the varlen layout from it needs
# host syncs (nonzero, max), so the layout is kept per tensor: one derivation per forward instead of one per
# layer. Entries hold a weak reference (a freed tensor never matches) and its version counter (an in-place
# edit never matches).
_LAYOUT_CACHE: dict = {}
_LAYOUT_CACHE_SIZE = 8


def _cached(tensor, tag, compute):
    if torch.compiler.is_compiling():
        return compute()
    key = (id(tensor), tag)
    entry = _LAYOUT_CACHE.get(key)
    if entry is not None and entry[0]() is tensor and entry[1] == tensor._version:
        return entry[2]
    value = compute()
    if len(_LAYOUT_CACHE) >= _LAYOUT_CACHE_SIZE:
        _LAYOUT_CACHE.pop(next(iter(_LAYOUT_CACHE)), None)
    _LAYOUT_CACHE[key] = (weakref.ref(tensor), tensor._version, value)
    return value


def _unpad_indices(attention_mask, length):
    """(row, column, cu_seqlens int32, max_seqlen) of the valid tokens in the last `length` mask columns."""

    def compute():
        valid = attention_mask[:, attention_mask.shape[1] - length:].bool()
        seqlens = valid.sum(dim=1, dtype=torch.int32)
        cu_seqlens = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
        flat = valid.flatten().nonzero().flatten()
        return flat // length, flat % length, cu_seqlens, int(seqlens.max())

    return _cached(attention_mask, ("unpad", length), compute)


def _packed_layout(q, k, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) when the batch packs several sequences, else None."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None or cu_k is not None:
        # Either boundary tensor alone describes self-attention over the packed row.
        cu_q = cu_q if cu_q is not None else cu_k
        cu_k = cu_k if cu_k is not None else cu_q
        same = cu_k is cu_q
        cu_q = cu_q.reshape(-1).to(device=q.device, dtype=torch.int32)
        cu_k = cu_q if same else cu_k.reshape(-1).to(device=q.device, dtype=torch.int32)
        max_q = _max_length(kwargs.get("max_length_q"), cu_q)
        max_k_given = kwargs.get("max_length_k")
        max_k = max_q if same and max_k_given is None else _max_length(max_k_given, cu_k)
        return cu_q, cu_k, max_q, max_k

    # Padding-free batches without those kwargs: one row whose position_ids restart. Only a batch of one with
    # as many keys as queries qualifies (with a cache the position ids describe the new tokens only).
    position_ids = kwargs.get("position_ids")
    batch, q_len = q.shape[:2]
    if position_ids is None or batch != 1 or k.shape[1] != q_len or position_ids.numel() != q_len:
        return None
    layout = _cached(position_ids, "packed", lambda: _layout_from_position_ids(position_ids))
    if layout is None:
        return None
    cu, max_len = layout
    return cu, cu, max_len, max_len


def _layout_from_position_ids(position_ids):
    # A sequence starts wherever the position equals the row minimum (packed sequences all restart at the same
    # first id, 0 for most models, padding_idx + 1 for RoBERTa-like ones), as transformers' flash path reads
    # them; token 0 always starts one, so a row that begins mid-sequence is still covered.
    pos = position_ids.reshape(-1)
    is_start = pos == pos.min()
    is_start[0] = True
    starts = is_start.nonzero().flatten().to(torch.int32)
    if starts.numel() == 1:
        return None  # a single sequence: the dense kernel is the same computation
    cu = torch.cat([starts, starts.new_tensor([pos.numel()])])
    return cu, int(cu.diff().max())


def _max_length(given, cu_seqlens):
    if given is None:
        return int(cu_seqlens.diff().max())
    return int(given)  # DataCollatorWithFlattening gives Python ints; a 0-d tensor costs one sync here
