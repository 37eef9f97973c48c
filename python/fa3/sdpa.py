"""fa3 as the flash backend of ``torch.nn.functional.scaled_dot_product_attention``.

    import fa3.sdpa
    fa3.sdpa.activate()      # torch.nn.attention.activate_flash_attention_impl("fa3")
    with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fa3.sdpa.deactivate()    # back to PyTorch's own flash kernels

Importing this module registers the implementation "fa3" with PyTorch's flash-attention registry
(``torch.nn.attention.list_flash_attention_impls()``); nothing is overridden and no GPU is touched
until :func:`activate`. Activation replaces the CUDA kernels of the aten operators behind the flash
backend of SDPA and behind ``torch.nn.attention.varlen.varlen_attn``:

- ``aten::_scaled_dot_product_flash_attention`` (+ ``.quantized``) and its ``_backward``: SDPA's
  BHSD tensors, handed to fa3 as BSHD views (transposes, no copies);
- ``aten::_flash_attention_forward`` (+ ``.quantized``) and ``aten::_flash_attention_backward``:
  BSHD, or packed ``[total, heads, dim]`` with ``cum_seq_q`` / ``cum_seq_k`` (fa3's cu_seqlens).

What runs on fa3 (``fa3._ops.fwd`` / ``fa3._ops.bwd``): CUDA tensors on a compute capability 9.0 GPU,
float16 / bfloat16 (float8_e4m3fn forward, with optional float32 ``[batch, heads_kv]`` descales),
head dims multiples of 16 bytes up to 256, GQA/MQA, causal (bottom-right aligned), sliding
windows, varlen with ``cum_seq_q`` / ``cum_seq_k`` / ``seqused_k``, any softmax scale but 0.

What falls back to the math below (plain PyTorch ops, fp32 softmax; the same outputs and layouts,
so callers cannot tell but for speed): ``dropout_p > 0``, ``return_debug_mask``, ``alibi_slopes``,
dtypes fa3 lacks (float32, float64, the fp8 backward), non-CUDA tensors or another GPU generation,
empty problems, head dims fa3 rejects, ``scale == 0`` (fa3 reads 0 as "default scale"), descales
with 16-bit inputs, and anything fa3 itself answers "not supported yet". The decision is the pure
function :func:`_fa3_can_run`. The fallback's backward recomputes its forward under autograd;
dropout masks come from a seed kept in the returned ``rng_state`` so that the backward regenerates
the same mask. It reads that seed (and varlen lengths) on the host: a synchronisation, so the
fallback is not CUDA-graph capturable, while the fa3 path is.

Limits shared with PyTorch's own flash kernels: the aten backward receives neither ``seqused_k`` nor
``alibi_slopes``, so gradients of forwards that used them ignore them.

Which backend SDPA picks stays PyTorch's decision. On Hopper with cuDNN newer than 9.15, PyTorch
2.11 ranks cuDNN attention before flash (unless TORCH_CUDNN_SDPA_DEPRIORITIZED=1), so fa3 runs
where the flash backend is selected: ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``, cuDNN disabled,
or inputs cuDNN declines. ``varlen_attn`` always calls the flash operators.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch
import torch.nn.attention as _attention
from torch.library import Library

from fa3 import _ops

__all__ = ["IMPL_NAME", "register", "activate", "deactivate"]

IMPL_NAME = "fa3"

logger = logging.getLogger(__name__)

_FP8 = torch.float8_e4m3fn
_HALF_TYPES = (torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 256


# ---- registration -------------------------------------------------------------------------------
@dataclass
class _Handle:
    """Keeps the aten overrides alive; remove() drops them and restores the SDPA fa3 flag."""

    library: Optional[Library]
    previous_fa3_flag: bool

    def remove(self) -> None:
        if self.library is None:
            return
        # _destroy() deregisters now; waiting for garbage collection would leave the overrides in
        # place for as long as anything still references the handle.
        self.library._destroy()
        self.library = None
        torch._C._set_sdp_use_fa3(self.previous_fa3_flag)


def _register(dispatch_key: str = "CUDA") -> _Handle:
    """register_fn of the registry: override the flash operators' kernels for ``dispatch_key``.

    PyTorch calls it with no argument (CUDA). The CPU tests pass "CPU" to drive the aten and
    autograd wiring without a GPU.
    """
    if not _ops.available():
        load_error = getattr(_ops, "load_error", lambda: None)()
        raise RuntimeError("fa3.sdpa.activate: fa3's compiled operators are not loaded"
                           + (f" ({load_error})" if load_error else ""))
    lib = Library("aten", "IMPL")  # noqa: TOR901 (an intentional override of aten kernels)
    impls = [
        ("_flash_attention_forward", _flash_attention_forward),
        ("_flash_attention_backward", _flash_attention_backward),
        ("_scaled_dot_product_flash_attention", _sdpa_flash_forward),
        ("_scaled_dot_product_flash_attention_backward", _sdpa_flash_backward),
    ]
    # The fp8 overloads (present in 2.11): fa3 serves their forward.
    if "quantized" in torch.ops.aten._flash_attention_forward.overloads():
        impls.append(("_flash_attention_forward.quantized", _flash_attention_forward_quantized))
    if "quantized" in torch.ops.aten._scaled_dot_product_flash_attention.overloads():
        impls.append(("_scaled_dot_product_flash_attention.quantized", _sdpa_flash_forward_quantized))
    with warnings.catch_warnings():
        # Replacing PyTorch's kernel is the point; its "Overriding a previously registered kernel"
        # warning would only alarm users.
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        for name, fn in impls:
            lib.impl(name, fn, dispatch_key)
    # Why set the flag: in PyTorch 2.11 its only effect is in the flash backend's dtype gate
    # (check_dtypes_flash_attention, sm >= 9): with it float8_e4m3fn inputs may select the flash
    # backend, without it only float16/bfloat16 can. fa3 serves the e4m3 forward, so setting it
    # lets F.scaled_dot_product_attention reach fa3 with fp8 tensors; fp16/bf16 routing, the
    # priority order and every other gate are unchanged.
    previous = torch._C._get_fa3_sdp_enabled()
    torch._C._set_sdp_use_fa3(True)
    return _Handle(lib, previous)


def register() -> None:
    """Make "fa3" known to torch.nn.attention's registry (cheap: overrides nothing yet)."""
    _attention.register_flash_attention_impl(IMPL_NAME, register_fn=_register)


def activate() -> None:
    """Route SDPA's flash backend and varlen_attn to fa3 (replaces any other active impl)."""
    _attention.activate_flash_attention_impl(IMPL_NAME)


def deactivate() -> None:
    """Restore PyTorch's own flash kernels, if fa3 is the active implementation."""
    if _attention.current_flash_attention_impl() == IMPL_NAME:
        _attention.restore_flash_attention_impl()


# ---- which path runs ----------------------------------------------------------------------------
def _fa3_can_run(query, key, value, *, varlen=False, dropout_p=0.0, return_debug_mask=False,
                 alibi_slopes=None, scale=None, descaled=False, grad_out=None, out=None,
                 logsumexp=None, library_loaded=True, capability=None) -> Optional[str]:
    """None when fa3 can compute this attention, else the reason it falls back.

    Pure: it reads tensor metadata only; the environment comes in as arguments (library_loaded:
    fa3._ops.available(); capability: (major, minor) of query's GPU, None off CUDA). Passing
    grad_out (with out and logsumexp) asks about the backward.
    """
    backward = grad_out is not None
    tensors = [t for t in (query, key, value, grad_out, out, logsumexp) if t is not None]
    if not library_loaded:
        return "fa3's compiled operators are not loaded"
    if not all(t.is_cuda for t in tensors):
        return "inputs are not CUDA tensors"
    if len({t.device for t in tensors}) != 1:
        return "inputs are on different devices"
    if capability is None or tuple(capability) != (9, 0):
        return f"fa3 needs compute capability 9.0, got {capability}"
    if dropout_p > 0.0:
        return "dropout_p > 0 (fa3 has no dropout)"
    if return_debug_mask:
        return "return_debug_mask (fa3 does not materialise attention probabilities)"
    if alibi_slopes is not None:
        return "alibi_slopes (fa3 has no ALiBi)"
    if scale is not None and (scale == 0.0 or not math.isfinite(scale)):
        return f"scale {scale} (fa3 reads 0 as the default scale and needs a finite one)"
    dtype = query.dtype
    if key.dtype != dtype or value.dtype != dtype:
        return f"mixed dtypes q {dtype}, k {key.dtype}, v {value.dtype}"
    if dtype == _FP8:
        if backward:
            return "float8_e4m3fn backward (fa3's fp8 path is forward only)"
    elif dtype not in _HALF_TYPES:
        return f"dtype {dtype} (fa3 takes float16, bfloat16, float8_e4m3fn)"
    elif descaled:
        return f"descales with {dtype} inputs (fa3 applies descales to float8_e4m3fn only)"
    if backward:
        if grad_out.dtype != dtype or out.dtype != dtype:
            return f"grad_out {grad_out.dtype} / out {out.dtype} differ from the inputs' {dtype}"
        if logsumexp.dtype != torch.float32:
            return f"logsumexp dtype {logsumexp.dtype} (expected float32)"
    want_dim = 3 if varlen else 4
    if query.dim() != want_dim or key.dim() != want_dim or value.dim() != want_dim:
        return f"expected {want_dim}-D q/k/v, got {query.dim()}/{key.dim()}/{value.dim()}"
    if query.numel() == 0 or key.numel() == 0 or value.numel() == 0:
        return "an empty batch, sequence or head dimension"
    multiple = _ops.TMA_BYTES // query.element_size()
    for name, d in (("head_dim_qk", query.size(-1)), ("head_dim_v", value.size(-1))):
        if d % multiple != 0 or d > _MAX_HEAD_DIM:
            return f"{name} {d} (fa3 takes multiples of {multiple} up to {_MAX_HEAD_DIM})"
    if key.size(-1) != query.size(-1):
        return f"q and k head dims differ ({query.size(-1)} vs {key.size(-1)})"
    h_q, h_kv = query.size(-2), key.size(-2)
    if value.size(-2) != h_kv or h_q % h_kv != 0:
        return f"heads q {h_q}, k {h_kv}, v {value.size(-2)} (needs h_q % h_kv == 0, k/v alike)"
    return None


@lru_cache(maxsize=None)
def _device_capability(index: int):
    return torch.cuda.get_device_capability(index)


def _fa3_reason(query, key, value, **kw) -> Optional[str]:
    """_fa3_can_run with this process's environment filled in."""
    capability = _device_capability(query.device.index if query.device.index is not None
                                    else torch.cuda.current_device()) if query.is_cuda else None
    return _fa3_can_run(query, key, value, library_loaded=_ops.available(), capability=capability,
                        **kw)


def _is_not_supported(err: RuntimeError) -> bool:
    # fa3 reports valid-but-unimplemented combinations as "not supported yet: ..."; everything else
    # (bad arguments, CUDA errors, out of memory) is a real error and propagates.
    return "not supported" in str(err)


# ---- small helpers ------------------------------------------------------------------------------
def _resolve_scale(scale: Optional[float], head_dim: int) -> float:
    return float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)


def _layout_like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """t in the layout of torch.empty_like(like): PyTorch's meta kernels of the flash operators
    promise it for the output and the gradients (torch.compile checks the strides), and its CUDA
    kernels follow it. t itself where the strides agree (BSHD memory, the usual case), else a copy
    (a query in BHSD memory, the math fallback's results)."""
    if t.stride() == like.stride() or t.shape != like.shape:
        return t
    target = torch.empty_like(like, dtype=t.dtype)
    if target.stride() == t.stride():
        return t
    return target.copy_(t)


def _int32(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    # fa3 takes int32 lengths; PyTorch's callers may hold int64 ones (a copy of b + 1 numbers).
    return t if t is None or t.dtype == torch.int32 else t.to(torch.int32)


def _check_descale(name: str, t: Optional[torch.Tensor], batch: int, heads_kv: int) -> None:
    if t is None:
        return
    if t.dtype != torch.float32 or tuple(t.shape) != (batch, heads_kv):
        raise ValueError(f"{name}: expected float32 [batch, heads_kv] = [{batch}, {heads_kv}], "
                         f"got {t.dtype} {list(t.shape)}")


def _rng_outputs(device: torch.device, seed: int):
    """(rng_state, unused) as PyTorch's flash kernels return them: uint64 [2] and uint64 []."""
    # The first entry holds the fallback's dropout seed (its "offset", the second, stays 0: each
    # seed seeds a fresh generator). fa3 itself has no dropout and leaves both zero.
    # fa3's path (seed 0) fills on the device: a host-to-device copy could not be graph-captured.
    rng_state = (torch.zeros(2, dtype=torch.uint64, device=device) if seed == 0 else
                 torch.tensor([seed, 0], dtype=torch.uint64, device=device))
    unused = torch.zeros((), dtype=torch.uint64, device=device)
    return rng_state, unused


def _draw_seed(device: torch.device) -> int:
    # From the device's default generator, so torch.manual_seed / torch.cuda.manual_seed make the
    # dropout pattern reproducible as with PyTorch's kernels. 2**62 keeps it a valid int64 seed.
    return int(torch.randint(0, 2**62, (1,), device=device).item())


def _seed_from(rng_state: Optional[torch.Tensor]) -> int:
    if rng_state is None or rng_state.numel() < 1:
        raise ValueError("rng_state: expected the uint64 [2] tensor of the forward that used dropout")
    return int(rng_state.reshape(-1)[0].cpu().item())


def _generator(device: torch.device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


# ---- the math fallback --------------------------------------------------------------------------
def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # float32 softmax for every low-precision input; float64 stays float64 (reference checks).
    return torch.float64 if dtype == torch.float64 else torch.float32


def _out_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if dtype == _FP8 else dtype


def _attend(q, k, v, *, scale, wl, wr, dropout_p=0.0, generator=None, alibi=None, q_descale=None,
            k_descale=None, v_descale=None, want_probs=False):
    """Attention of one BHSD batch in the compute dtype: (out, lse, probs or None).

    q [b, h_q, s_q, d], k [b, h_kv, s_k, d], v [b, h_kv, s_k, d_v]; masks bottom-right aligned as
    FlashAttention (query i sits at key position i + s_k - s_q); rows that see no key give out 0
    and lse +inf, as fa3. Differentiable in q, k, v (the fallback's backward relies on it).
    """
    ct = _compute_dtype(q.dtype)
    b, h_q, s_q, _ = q.shape
    h_kv, s_k = k.size(1), k.size(2)
    group = h_q // h_kv
    q, k, v = q.to(ct), k.to(ct), v.to(ct)
    # fp8 descales are per (batch, kv head); a q head uses the descale of its kv head.
    if q_descale is not None:
        q = q * q_descale.to(ct).repeat_interleave(group, dim=1)[:, :, None, None]
    if k_descale is not None:
        k = k * k_descale.to(ct)[:, :, None, None]
    if v_descale is not None:
        v = v * v_descale.to(ct)[:, :, None, None]
    if group > 1:  # GQA / MQA
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    if s_k == 0:  # no keys: every row sees nothing (and amax below needs a non-empty dim)
        out = torch.zeros(b, h_q, s_q, v.size(-1), dtype=ct, device=q.device)
        lse = torch.full((b, h_q, s_q), float("inf"), dtype=ct, device=q.device)
        return out, lse, (torch.zeros(b, h_q, s_q, 0, dtype=ct, device=q.device)
                          if want_probs else None)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale

    i = torch.arange(s_q, device=q.device)[:, None]
    j = torch.arange(s_k, device=q.device)[None, :]
    diag = i + (s_k - s_q)
    allowed = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device)
    if wl >= 0:
        allowed &= j >= diag - wl
    if wr >= 0:
        allowed &= j <= diag + wr
    if alibi is not None:
        # FlashAttention's ALiBi: -slope * |i + s_k - s_q - j|; slopes [h_q] or [b, h_q].
        slopes = alibi.to(ct).reshape(-1, h_q)
        scores = scores - slopes[:, :, None, None] * (diag - j).abs().to(ct)
    scores = scores.masked_fill(~allowed, float("-inf"))

    # Softmax by hand, so that fully masked rows give 0 (and no NaN gradients) instead of NaN.
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    denom = e.sum(dim=-1, keepdim=True)
    probs = e / torch.where(denom > 0, denom, torch.ones_like(denom))
    lse = torch.where(denom > 0, row_max + torch.log(denom),
                      torch.full_like(denom, float("inf"))).squeeze(-1)

    keep = None
    if dropout_p > 0.0:
        # float32 uniforms whatever the compute dtype: the mask is a function of the seed alone.
        u = torch.rand(probs.shape, generator=generator, device=q.device, dtype=torch.float32)
        keep = u >= dropout_p
        if dropout_p >= 1.0:
            weights = probs * 0.0
        else:
            weights = probs * keep.to(ct) / (1.0 - dropout_p)
    else:
        weights = probs
    out = torch.matmul(weights, v)
    shown = None
    if want_probs:
        # PyTorch's flash debug mask convention: probabilities, negated where dropout dropped them.
        shown = probs.detach() if keep is None else torch.where(keep, probs, -probs).detach()
    return out, lse, shown


def _math_attention(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, *, scale, wl, wr,
                    dropout_p=0.0, seed=0, seqused_k=None, alibi_slopes=None, q_descale=None,
                    k_descale=None, v_descale=None, want_probs=False):
    """The fallback on the aten operators' layouts: BSHD, or packed [total, h, d] with cum_seq.

    Returns (out in the compute dtype, lse float32, probs or None) where out/lse have the layouts
    of PyTorch's flash kernels: out like query with v's head dim; lse [b, h_q, s_q] dense or
    [h_q, total_q] with cum_seq_q. Differentiable in query, key, value.
    """
    device = query.device
    generator = _generator(device, seed) if dropout_p > 0.0 else None
    kw = dict(scale=scale, wl=wl, wr=wr, dropout_p=dropout_p, generator=generator,
              want_probs=want_probs)
    if cum_seq_q is None and cum_seq_k is None and seqused_k is None:
        # Fixed lengths: one batched computation (no host synchronisation).
        out, lse, probs = _attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                  alibi=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
                                  v_descale=v_descale, **kw)
        return out.transpose(1, 2), lse.float(), probs

    # Variable lengths: one sequence at a time, in batch order (the dropout generator is consumed
    # in that order, so the backward's recomputation draws the same masks).
    cu_q = cum_seq_q.tolist() if cum_seq_q is not None else None
    cu_k = cum_seq_k.tolist() if cum_seq_k is not None else None
    used = seqused_k.tolist() if seqused_k is not None else None
    batch = len(cu_q) - 1 if cu_q is not None else (len(cu_k) - 1 if cu_k is not None else
                                                     query.size(0))
    outs, lses, probs_list = [], [], []
    for b in range(batch):
        qb = query[cu_q[b]:cu_q[b + 1]] if cu_q is not None else query[b]
        kb = key[cu_k[b]:cu_k[b + 1]] if cu_k is not None else key[b]
        vb = value[cu_k[b]:cu_k[b + 1]] if cu_k is not None else value[b]
        if used is not None:
            kb, vb = kb[:used[b]], vb[:used[b]]
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes
        q_ds, k_ds, v_ds = (None if t is None else t[b:b + 1]
                            for t in (q_descale, k_descale, v_descale))
        ob, lb, pb = _attend(qb.transpose(0, 1)[None], kb.transpose(0, 1)[None],
                             vb.transpose(0, 1)[None], alibi=slopes, q_descale=q_ds,
                             k_descale=k_ds, v_descale=v_ds, **kw)
        outs.append(ob[0].transpose(0, 1))  # [s_q_b, h, d_v]
        lses.append(lb[0])                  # [h, s_q_b]
        probs_list.append(pb)
    ct = _compute_dtype(query.dtype)
    if cu_q is not None:
        # Rows past the last sequence (padding of the packed tensor) belong to no sequence.
        tail = query.size(0) - cu_q[-1]
        h_q, d_v = query.size(1), value.size(-1)
        outs.append(torch.zeros(tail, h_q, d_v, dtype=ct, device=device))
        lses.append(torch.full((h_q, tail), float("inf"), dtype=ct, device=device))
        out, lse = torch.cat(outs, dim=0), torch.cat(lses, dim=1)
    else:
        out, lse = torch.stack(outs, dim=0), torch.stack(lses, dim=0)
    probs = None
    if want_probs:
        # [b, h, max_q, max_k], zero-padded: each sequence's probabilities in its corner.
        mq = max(p.size(2) for p in probs_list) if probs_list else 0
        mk = max(p.size(3) for p in probs_list) if probs_list else 0
        probs = torch.zeros(batch, query.size(-2), max(mq, max_q), max(mk, max_k), dtype=ct,
                            device=device)
        for b, p in enumerate(probs_list):
            probs[b, :, :p.size(2), :p.size(3)] = p[0]
    return out, lse.float(), probs


def _math_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, *, scale, wl,
                  wr, return_debug_mask, seqused_k, alibi_slopes, q_descale, k_descale, v_descale):
    seed = _draw_seed(query.device) if dropout_p > 0.0 else 0
    with torch.no_grad():
        out, lse, probs = _math_attention(
            query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, scale=scale, wl=wl, wr=wr,
            dropout_p=dropout_p, seed=seed, seqused_k=seqused_k, alibi_slopes=alibi_slopes,
            q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
            want_probs=return_debug_mask)
    out_dtype = _out_dtype(query.dtype)
    rng_state, unused = _rng_outputs(query.device, seed)
    debug = (probs.to(out_dtype) if probs is not None
             else torch.empty(0, dtype=query.dtype, device=query.device))
    return out.to(out_dtype), lse, rng_state, unused, debug


@contextlib.contextmanager
def _autograd_enabled():
    """Autograd back on inside an aten kernel.

    The dispatcher runs backend kernels with the autograd dispatch keys excluded (and the engine
    runs backward formulas without grad mode), so tensors made here would record no graph. The
    fallback's backward differentiates its recomputed forward, so it restores both for its
    duration.
    """
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality)
    for key in (torch._C.DispatchKey.AutogradOther, torch._C.DispatchKey.AutogradNestedTensor,
                torch._C.DispatchKey.ADInplaceOrView):
        keys = keys.add(key)
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set()
    with torch._C._ForceDispatchKeyGuard(include, exclude - keys), torch.enable_grad():
        yield


def _math_backward(grad_out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                   rng_state, *, scale, wl, wr):
    """Gradients by recomputing the fallback's forward (same seed, same mask) under autograd."""
    seed = _seed_from(rng_state) if dropout_p > 0.0 else 0
    ct = _compute_dtype(query.dtype)
    with _autograd_enabled():
        # Leaves in the compute dtype: fp8 tensors cannot carry gradients through matmuls, and the
        # gradients keep fp32 precision until the final cast.
        q, k, v = (t.detach().to(ct).requires_grad_(True) for t in (query, key, value))
        out, _, _ = _math_attention(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, scale=scale,
                                    wl=wl, wr=wr, dropout_p=dropout_p, seed=seed)
        if out.requires_grad:
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out.to(ct), allow_unused=True)
        else:  # no key anywhere (empty sequences): the output is constant zero
            dq = dk = dv = None
    grads = []
    for g, t in zip((dq, dk, dv), (query, key, value)):
        grads.append(torch.zeros_like(t) if g is None else g.to(t.dtype))
    return tuple(grads)


# ---- the aten overrides: PyTorch's flash operators on BSHD / packed tensors ----------------------
def _flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                   return_debug_mask, q_descale=None, k_descale=None, v_descale=None, *, scale=None,
                   window_size_left=None, window_size_right=None, seqused_k=None,
                   alibi_slopes=None):
    varlen = cum_seq_q is not None
    scale_f = _resolve_scale(scale, query.size(-1))
    wl, wr = _ops.window(window_size_left, window_size_right, is_causal)
    batch = (cum_seq_q.numel() - 1) if varlen else query.size(0)
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        _check_descale(name, t, batch, key.size(-2))
    descaled = any(t is not None for t in (q_descale, k_descale, v_descale))
    reason = _fa3_reason(query, key, value, varlen=varlen, dropout_p=dropout_p,
                         return_debug_mask=return_debug_mask, alibi_slopes=alibi_slopes,
                         scale=scale, descaled=descaled)
    if reason is None:
        try:
            out, lse = _ops.fwd(
                query, key, value,  # (the operator copies what TMA cannot read in place)
                cu_seqlens_q=_int32(cum_seq_q), cu_seqlens_k=_int32(cum_seq_k),
                seqused_k=_int32(seqused_k),
                max_seqlen_q=int(max_q) if varlen else 0,
                max_seqlen_k=int(max_k) if cum_seq_k is not None else 0,
                q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                softmax_scale=scale_f, causal=bool(is_causal), window_left=wl, window_right=wr)
        except RuntimeError as err:
            if not _is_not_supported(err):
                raise
            reason = str(err)
        else:
            rng_state, unused = _rng_outputs(query.device, 0)
            debug = torch.empty(0, dtype=query.dtype, device=query.device)
            return _layout_like(out, query), lse, rng_state, unused, debug
    logger.debug("fa3.sdpa: flash forward falls back to math: %s", reason)
    out, lse, rng_state, unused, debug = _math_forward(
        query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, scale=scale_f, wl=wl,
        wr=wr, return_debug_mask=return_debug_mask, seqused_k=seqused_k,
        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    return _layout_like(out, query), lse, rng_state, unused, debug


def _flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                    dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                    window_size_right=None):
    varlen = cum_seq_q is not None
    scale_f = _resolve_scale(scale, query.size(-1))
    wl, wr = _ops.window(window_size_left, window_size_right, is_causal)
    reason = _fa3_reason(query, key, value, varlen=varlen, dropout_p=dropout_p, scale=scale,
                         grad_out=grad_out, out=out, logsumexp=logsumexp)
    grads = None
    if reason is None:
        try:
            grads = _ops.bwd(
                *(_ops.tma_layout(t) for t in (grad_out, query, key, value, out)),
                logsumexp.contiguous(),
                cu_seqlens_q=_int32(cum_seq_q), cu_seqlens_k=_int32(cum_seq_k),
                max_seqlen_q=int(max_q) if varlen else 0,
                max_seqlen_k=int(max_k) if cum_seq_k is not None else 0,
                softmax_scale=scale_f, causal=bool(is_causal), window_left=wl, window_right=wr,
                deterministic=torch.are_deterministic_algorithms_enabled())[:3]
        except RuntimeError as err:
            if not _is_not_supported(err):
                raise
            reason = str(err)
    if grads is None:
        logger.debug("fa3.sdpa: flash backward falls back to math: %s", reason)
        grads = _math_backward(grad_out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                               dropout_p, rng_state, scale=scale_f, wl=wl, wr=wr)
    return tuple(_layout_like(g, t) for g, t in zip(grads, (query, key, value)))


def _flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                             is_causal, return_debug_mask, *, scale=None, window_size_left=None,
                             window_size_right=None, seqused_k=None, alibi_slopes=None):
    """aten::_flash_attention_forward -> (output, softmax_logsumexp, rng_state, unused, debug)."""
    return _flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                          is_causal, return_debug_mask, scale=scale,
                          window_size_left=window_size_left, window_size_right=window_size_right,
                          seqused_k=seqused_k, alibi_slopes=alibi_slopes)


def _flash_attention_forward_quantized(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                                       dropout_p, is_causal, return_debug_mask, q_descale,
                                       k_descale, v_descale, *, scale=None, window_size_left=None,
                                       window_size_right=None, seqused_k=None, alibi_slopes=None):
    """aten::_flash_attention_forward.quantized: the same with fp8 descales."""
    return _flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                          is_causal, return_debug_mask, q_descale, k_descale, v_descale,
                          scale=scale, window_size_left=window_size_left,
                          window_size_right=window_size_right, seqused_k=seqused_k,
                          alibi_slopes=alibi_slopes)


def _flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                              max_q, max_k, dropout_p, is_causal, rng_state, unused, *, scale=None,
                              window_size_left=None, window_size_right=None):
    """aten::_flash_attention_backward -> (grad_query, grad_key, grad_value)."""
    return _flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                           max_q, max_k, dropout_p, is_causal, rng_state, unused, scale=scale,
                           window_size_left=window_size_left, window_size_right=window_size_right)


# ---- the aten overrides: SDPA's flash operators on BHSD tensors ----------------------------------
def _sdpa_flash_forward_quantized(query, key, value, q_descale=None, k_descale=None,
                                  v_descale=None, dropout_p=0.0, is_causal=False,
                                  return_debug_mask=False, *, scale=None):
    """aten::_scaled_dot_product_flash_attention(.quantized) on BHSD tensors.

    Returns (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug) as
    PyTorch's kernel: output BHSD-shaped over BSHD memory, logsumexp [b, h_q, s_q], no cum_seq.
    """
    # BHSD -> BSHD are views: fa3 reads any strides with a contiguous head dim.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    out, lse, rng_state, unused, debug = _flash_forward(
        q, k, v, None, None, q.size(1), k.size(1), dropout_p, is_causal, return_debug_mask,
        q_descale, k_descale, v_descale, scale=scale)
    return (out.transpose(1, 2), lse, None, None, query.size(2), key.size(2), rng_state, unused,
            debug)


def _sdpa_flash_forward(query, key, value, dropout_p=0.0, is_causal=False,
                        return_debug_mask=False, *, scale=None):
    return _sdpa_flash_forward_quantized(query, key, value, None, None, None, dropout_p, is_causal,
                                         return_debug_mask, scale=scale)


def _sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                         max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    """aten::_scaled_dot_product_flash_attention_backward on BHSD tensors -> BHSD gradients."""
    t = lambda x: x.transpose(1, 2)  # noqa: E731  (BHSD <-> BSHD views)
    dq, dk, dv = _flash_backward(t(grad_out), t(query), t(key), t(value), t(out), logsumexp, None,
                                 None, max_q, max_k, dropout_p, is_causal, philox_seed,
                                 philox_offset, scale=scale)
    return t(dq), t(dk), t(dv)


register()
