"""fa3's dispatcher operators: loading the compiled library, fake kernels and autograd.

The operators themselves (``torch.ops.fa3.fwd``, ``torch.ops.fa3.bwd``, ``torch.ops.fa3.fwd_kvcache``,
``torch.ops.fa3.combine``, ``torch.ops.fa3.quantize_fp8``) are C++ (src/torch/
torch_ops.cpp) built against PyTorch's stable ABI. What PyTorch needs besides the CUDA kernel is
registered here: a fake (meta) kernel per operator, so that torch.compile, torch.export and
FakeTensor tracing know the output shapes without running anything, and the autograd formula of
``fa3::fwd``, whose backward is ``fa3::bwd``.

``fwd`` and ``bwd`` below are the Python entry points every other module calls (as ``_ops.fwd``,
looked up at call time, so tests can replace them).
"""

from __future__ import annotations

import glob
import os
from typing import Optional

import torch

__all__ = ["available", "library_path", "fwd", "bwd", "fwd_kvcache", "combine", "load_error"]

_LIB_PATH: Optional[str] = None
_LOAD_ERROR: Optional[str] = None


def _find_library() -> Optional[str]:
    # FA3_TORCH_LIB points at a build-tree library (tests run from the source tree); an installed
    # package carries _C*.so next to this file.
    env = os.environ.get("FA3_TORCH_LIB")
    if env:
        return env
    found = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "_C*.so")))
    return found[0] if found else None


def _load() -> None:
    global _LIB_PATH, _LOAD_ERROR
    path = _find_library()
    if path is None:
        _LOAD_ERROR = ("fa3's compiled operators (_C.so) were not found next to the package and "
                       "FA3_TORCH_LIB is not set: build them (pip install --no-build-isolation . "
                       "or the CMake build with torch present)")
        return
    try:
        torch.ops.load_library(path)
    except OSError as e:  # a library built for another torch, or a missing CUDA runtime
        _LOAD_ERROR = f"fa3: could not load {path}: {e}"
        return
    _LIB_PATH = path


def available() -> bool:
    """True when the compiled operators are loaded (``import fa3`` works without them)."""
    return _LIB_PATH is not None


def library_path() -> Optional[str]:
    return _LIB_PATH


def load_error() -> Optional[str]:
    return _LOAD_ERROR


def _require() -> None:
    if _LIB_PATH is None:
        raise RuntimeError(_LOAD_ERROR or "fa3's compiled operators are not loaded")


_load()


TMA_BYTES = 16  # fa3 moves head-dim rows and strides in 16-byte units (TMA)


def start_offset(t: torch.Tensor) -> int:
    """Where t starts, for alignment checks: its address, or, for a tensor traced by torch.compile
    (FakeTensor, FunctionalTensor: no data pointer) or another subclass, its storage offset in bytes
    (PyTorch's allocator hands out 512-byte aligned storage)."""
    return t.data_ptr() if type(t) is torch.Tensor else t.storage_offset() * t.element_size()


def tma_layout(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """t itself when fa3 can read it in place, else a contiguous copy.

    fa3 needs a unit head-dim stride, the other strides in 16-byte multiples and a 16-byte aligned
    start; the usual layouts (BHSD/BSHD, contiguous or transposed, packed) pass untouched. Slices
    such as autograd's gradient of one part of a concatenation do not.
    """
    if t is None:
        return None
    multiple = TMA_BYTES // t.element_size()
    if ((t.size(-1) <= 1 or t.stride(-1) == 1) and all(s % multiple == 0 for s in t.stride()[:-1])
            and start_offset(t) % TMA_BYTES == 0):
        return t
    c = t.contiguous()
    # A contiguous tensor at an unaligned address comes back as itself: copy it.
    return c if start_offset(c) % TMA_BYTES == 0 else c.clone()


def window(left, right, causal):
    """(window_left, window_right) as fa3 takes them, from FlashAttention's conventions: None or any
    negative size is unbounded (-1), sizes past int32 are clamped (fa3 reads a window that reaches
    every key as none), and causal sets the right edge to the diagonal, whatever was asked
    (FlashAttention-3's rule; transformers passes causal=True with window_size=(w - 1, w - 1))."""
    def size(x):
        return -1 if x is None or x < 0 else min(int(x), 2**31 - 1)
    return size(left), 0 if causal else size(right)


# ---- Python entry points ------------------------------------------------------------------------
def fwd(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
        max_seqlen_q=0, max_seqlen_k=0, page_table=None, q_descale=None, k_descale=None,
        v_descale=None, softmax_scale=0.0, causal=False, window_left=-1, window_right=-1,
        softcap=0.0, num_splits=1, deterministic=False, q_block_descale=None, k_block_descale=None,
        v_block_descale=None, q_block_size=0, kv_block_size=0, sinks=None, sm_margin=0):
    """(out, softmax_lse) = fa3::fwd(...); differentiable in q, k, v and sinks (float32 [heads_q]
    attention-sink logits), through out and softmax_lse. sm_margin: SMs the forward's persistent
    grid leaves free (fa3_c.h; the backward's grid is not persistent and takes none)."""
    _require()
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
            page_table, q_descale, k_descale, v_descale, softmax_scale, causal, window_left,
            window_right, softcap, num_splits, deterministic, q_block_descale, k_block_descale,
            v_block_descale, q_block_size, kv_block_size, sinks, sm_margin)
    if torch.compiler.is_compiling():
        # Traced: the dispatcher's autograd kernel is what AOTAutograd records.
        return torch.ops.fa3.fwd.default(*args)
    # Eager: go straight to the autograd node, or below autograd when nothing needs a gradient;
    # the dispatcher's round trip through the Python autograd kernel costs ~10 us per call.
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                    or (sinks is not None and sinks.requires_grad)):
        return _FwdFunction.apply(None, q, k, v, sinks, args[3:])
    return _fwd_below_autograd(args)


def _fwd_below_autograd(args):
    """fa3::fwd's kernel with no autograd recorded: plain CUDA tensors go straight to the CUDA kernel
    (cheaper than entering a below-autograd guard, ~1.6 us); others (meta, fake, subclasses such as
    DTensor) and any call under a TorchDispatchMode (selective activation checkpointing, FLOP
    counters, make_fx) through the dispatcher, which shows them the operator."""
    q = args[0]
    if q.is_cuda and type(q) is torch.Tensor and torch._C._len_torch_dispatch_stack() == 0:
        return _FWD_CUDA(_CUDA_KEYS, *args)
    with torch._C._AutoDispatchBelowAutograd():
        return _FWD_OP(*args)


def bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None,
        seqused_k=None, max_seqlen_q=0, max_seqlen_k=0, softmax_scale=0.0, causal=False,
        window_left=-1, window_right=-1, softcap=0.0, deterministic=False, sinks=None, dlse=None):
    """(dq, dk, dv, dsinks) = fa3::bwd(...); dsinks float32 [heads_q] with sinks, else empty. dlse
    (float32, softmax_lse's shape, contiguous): the loss's gradient w.r.t. softmax_lse, whose
    gradient then joins dq / dk / dv (and dsinks)."""
    _require()
    return torch.ops.fa3.bwd.default(
        dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
        max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
        deterministic, sinks, dlse)


def fwd_kvcache(q, k_cache, v_cache, k_new=None, v_new=None, cache_seqlens=None, rotary_cos=None,
                rotary_sin=None, rotary_interleaved=True, page_table=None, max_seqlen_k=0, softmax_scale=0.0,
                causal=False, window_left=-1, window_right=-1, softcap=0.0, num_splits=0, sinks=None,
                cu_seqlens_q=None, max_seqlen_q=0, cu_seqlens_k_new=None, cache_leftpad=None,
                rotary_seqlens=None, sm_margin=0):
    """(out, softmax_lse) = fa3::fwd_kvcache(...): k_new / v_new appended to the caches (in place) at
    cache_seqlens and rotated with q in the same fa3 call, then the attention. Packed queries
    (cu_seqlens_q, q [total_q, h, d]) and packed new keys (cu_seqlens_k_new, k_new [total_new, h_kv, d])
    are taken; cache_leftpad (int32 [b]: where each sequence's keys start in a contiguous cache) and
    rotary_seqlens (int32 [b]: the rotary position of each sequence's first new key). Not
    differentiable."""
    _require()
    return torch.ops.fa3.fwd_kvcache.default(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens, rotary_cos, rotary_sin, rotary_interleaved,
        page_table, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, num_splits,
        sinks, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new, cache_leftpad, rotary_seqlens, sm_margin)


# fa3_dtype codes of the combine's output dtype (fa3_c.h).
COMBINE_DTYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 3}


def combine(out_partial, lse_partial, out_dtype):
    """(out, lse) = fa3::combine(out_partial [splits, b, s, h, d] fp32, lse_partial [splits, b, s, h]
    fp32) in out_dtype (float16, bfloat16 or float32)."""
    _require()
    return torch.ops.fa3.combine.default(out_partial, lse_partial, COMBINE_DTYPES[out_dtype])


# ---- fake kernels (shapes only; the same allocation rules as torch_ops.cpp) ---------------------
def quantize_fp8(x, block_size=128, hadamard=False, seed=0):
    """(out e4m3 [b, s, h, d], descale float32 [b, h, blocks]) = fa3::quantize_fp8(x [b, s, h, d])."""
    _require()
    return torch.ops.fa3.quantize_fp8.default(x, block_size, hadamard, seed)


def _quantize_fake(x, block_size=128, hadamard=False, seed=0):
    b, s, h, _ = x.shape
    return (x.new_empty(x.shape, dtype=torch.float8_e4m3fn),
            x.new_empty((b, h, (s + block_size - 1) // block_size), dtype=torch.float32))


def _combine_fake(out_partial, lse_partial, out_dtype):
    dtype = {code: dt for dt, code in COMBINE_DTYPES.items()}[out_dtype]
    _, b, s, h, d = out_partial.shape
    return (out_partial.new_empty((b, s, h, d), dtype=dtype),
            out_partial.new_empty((b, s, h), dtype=torch.float32))


def _fwd_fake(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
              max_seqlen_q=0, max_seqlen_k=0, page_table=None, q_descale=None, k_descale=None,
              v_descale=None, softmax_scale=0.0, causal=False, window_left=-1, window_right=-1,
              softcap=0.0, num_splits=1, deterministic=False, q_block_descale=None,
              k_block_descale=None, v_block_descale=None, q_block_size=0, kv_block_size=0,
              sinks=None, sm_margin=0):
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    out = q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=out_dtype)
    if cu_seqlens_q is not None:  # packed rows: LSE [heads, total_q]
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:                         # [batch, heads, seqlen_q]
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse


def _fwd_kvcache_fake(q, k_cache, v_cache, k_new=None, v_new=None, cache_seqlens=None, rotary_cos=None,
                      rotary_sin=None, rotary_interleaved=True, page_table=None, max_seqlen_k=0,
                      softmax_scale=0.0, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                      num_splits=0, sinks=None, cu_seqlens_q=None, max_seqlen_q=0, cu_seqlens_k_new=None,
                      cache_leftpad=None, rotary_seqlens=None, sm_margin=0):
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    out = q.new_empty((*q.shape[:-1], v_cache.shape[-1]), dtype=out_dtype)
    if cu_seqlens_q is not None:  # packed rows: LSE [heads, total_q]
        return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _bwd_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None,
              seqused_q=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0, softmax_scale=0.0,
              causal=False, window_left=-1, window_right=-1, softcap=0.0, deterministic=False,
              sinks=None, dlse=None):
    heads_q = q.shape[-2] if sinks is not None else 0
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty((heads_q,), dtype=torch.float32))


# ---- autograd of fa3::fwd -----------------------------------------------------------------------
def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, su_q, su_k, max_q, max_k, page_table, q_descale, k_descale, v_descale,
     scale, causal, wl, wr, softcap, num_splits, deterministic) = inputs[:20]  # (then block descales)
    out, lse = output
    # LSE is differentiable (beyond FlashAttention, whose LSE is not): a loss that uses it (merging
    # partial attentions by their LSEs, a z-loss) gets its gradient through fa3::bwd's dlse. An
    # output nobody used arrives as None, not as zeros to read.
    ctx.set_materialize_grads(False)
    ctx.paged = page_table is not None
    ctx.fp8 = q.dtype == torch.float8_e4m3fn
    sinks = inputs[25] if len(inputs) > 25 else None
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, su_q, su_k, sinks)
    ctx.scalars = (max_q, max_k, scale, causal, wl, wr, softcap)
    ctx.deterministic = bool(deterministic) or torch.are_deterministic_algorithms_enabled()


def _fwd_backward(ctx, dout, dlse):
    if ctx.paged:
        raise RuntimeError("fa3: the backward of a paged-KV forward (page_table) is not supported")
    if ctx.fp8:
        raise RuntimeError("fa3: the backward of the float8_e4m3fn forward is not supported")
    q, k, v, out, lse, cu_q, cu_k, su_q, su_k, sinks = ctx.saved_tensors
    max_q, max_k, scale, causal, wl, wr, softcap = ctx.scalars
    # fa3 reads dO through strides in 16-byte units with a contiguous head dim: a broadcast gradient
    # (from out.sum().backward()) has stride 0 there, a slice of a larger gradient (the backward of
    # torch.cat) odd strides and start; and q/k/v may be views the forward copied.
    if dout is None:  # a loss through softmax_lse alone
        dout = torch.zeros_like(out)
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    dout, q, k, v = (tma_layout(t) for t in (dout, q, k, v))
    dq, dk, dv, dsinks = bwd(dout, q, k, v, out, lse, cu_q, cu_k, su_q, su_k, max_q, max_k, scale,
                             causal, wl, wr, softcap, ctx.deterministic, sinks, dlse)
    return dq, dk, dv, (dsinks if sinks is not None else None)


class _FwdFunction(torch.autograd.Function):
    """fa3::fwd's autograd node: the forward below autograd, its backward fa3::bwd.

    Inputs (keyset, q, k, v, sinks, rest): the other arguments travel as one tuple, so that apply()
    inspects five inputs instead of twenty-one or more (~5 us per call); sinks (also in rest, at
    its place in the schema) is an input of its own so that autograd gives it a gradient.
    """

    @staticmethod
    def forward(ctx, keyset, q, k, v, sinks, rest):
        # keyset: the dispatcher's, when called from the autograd kernel; None from fwd() above.
        args = (q, k, v) + rest
        if keyset is None:
            output = _fwd_below_autograd(args)
        else:
            with torch._C._AutoDispatchBelowAutograd():
                output = torch.ops.fa3.fwd.default.redispatch(keyset & torch._C._after_autograd_keyset, *args)
        _fwd_setup_context(ctx, args, output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        dq, dk, dv, dsinks = _fwd_backward(ctx, dout, dlse)
        return None, dq, dk, dv, dsinks, None


def _register_autograd():
    # What torch.library.register_autograd does, without its per-call fill_defaults (measured
    # ~270 us per call on a 20-argument schema, torch 2.11): the dispatcher drops trailing
    # arguments equal to their defaults, so they are appended back from a tuple made once.
    defaults = tuple(a.default_value for a in torch.ops.fa3.fwd.default._schema.arguments)

    def autograd_kernel(keyset, *args):
        if len(args) < len(defaults):
            args = args + defaults[len(args):]
        sinks = args[25]
        if torch.is_grad_enabled() and (args[0].requires_grad or args[1].requires_grad
                                        or args[2].requires_grad
                                        or (sinks is not None and sinks.requires_grad)):
            return _FwdFunction.apply(keyset, args[0], args[1], args[2], sinks, tuple(args[3:]))
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.fa3.fwd.default.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    _LIB.impl("fwd", autograd_kernel, "Autograd", with_keyset=True)


def _cpu_kernel(op):
    def kernel(*args, **kwargs):
        raise ValueError(f"fa3: {op}: expected CUDA tensors on a Hopper GPU (sm_90), got CPU "
                         "tensors")
    return kernel


if _LIB_PATH is not None:
    _FWD_OP = torch.ops.fa3.fwd.default._op  # the bound C++ operator: one Python frame less per call
    _FWD_CUDA = torch.ops.fa3.fwd.default._handle.redispatch_boxed
    _CUDA_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    _LIB = torch.library.Library("fa3", "IMPL")  # noqa: TOR901 (kept alive: it owns the kernels)
    # Without a CPU kernel a CPU call would fail with the dispatcher's generic "could not run"
    # message; this one says what is expected.
    torch.library.register_kernel("fa3::fwd", "cpu")(_cpu_kernel("fwd"))
    torch.library.register_kernel("fa3::bwd", "cpu")(_cpu_kernel("bwd"))
    torch.library.register_kernel("fa3::combine", "cpu")(_cpu_kernel("combine"))
    torch.library.register_kernel("fa3::fwd_kvcache", "cpu")(_cpu_kernel("fwd_kvcache"))
    torch.library.register_fake("fa3::fwd_kvcache")(_fwd_kvcache_fake)
    torch.library.register_kernel("fa3::quantize_fp8", "cpu")(_cpu_kernel("quantize_fp8"))
    torch.library.register_fake("fa3::quantize_fp8")(_quantize_fake)
    torch.library.register_fake("fa3::fwd")(_fwd_fake)
    torch.library.register_fake("fa3::bwd")(_bwd_fake)
    torch.library.register_fake("fa3::combine")(_combine_fake)
    _register_autograd()
