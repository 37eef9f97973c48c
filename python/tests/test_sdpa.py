"""fa3.sdpa without a GPU: registration with torch.nn.attention, the fa3-or-fallback decision, the
math fallback against float64 references, dropout's regenerated masks, and the BHSD <-> BSHD /
varlen glue of the aten overrides with fa3's operators replaced by a float64 stand-in.

The overrides are plain Python functions, so most tests call them directly on CPU tensors. The
end-to-end tests register them for the CPU dispatch key (sdpa._register("CPU")) so that the aten
operators, their autograd formulas and torch.nn.attention.varlen run them as on a GPU.
"""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.attention as attention
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from fa3 import _ops, sdpa

F64 = torch.float64


# ---- float64 references (written from the definitions, independent of fa3.sdpa) ---------------
def allowed_keys(s_q, s_k, causal, wl, wr, k_len=None):
    """Bool [s_q, s_k]: FlashAttention's masks, bottom-right aligned (query i at key i+s_k-s_q)."""
    k_len = s_k if k_len is None else k_len
    if causal:
        wr = 0
    m = torch.zeros(s_q, s_k, dtype=torch.bool)
    for i in range(s_q):
        pos = i + k_len - s_q
        for j in range(k_len):
            m[i, j] = (wl < 0 or j >= pos - wl) and (wr < 0 or j <= pos + wr)
    return m


def ref_probs(q, k, scale, mask):
    """q [b, h_q, s_q, d], k [b, h_kv, s_k, d] float64 -> (P, lse); rows with no key: P 0, +inf."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p, torch.where(torch.isinf(lse), torch.full_like(lse, float("inf")), lse)


def ref_attention(q, k, v, scale, mask, keep=None, dropout_p=0.0):
    p, lse = ref_probs(q, k, scale, mask)
    if keep is not None:
        p = p * keep / (1.0 - dropout_p)
    return p @ v.repeat_interleave(q.size(1) // v.size(1), dim=1), lse


def ref_attention_grads(q, k, v, do, scale, mask):
    """Analytic dq, dk, dv of softmax attention (float64; GQA sums over each group)."""
    g = q.size(1) // k.size(1)
    kr, vr = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    p, _ = ref_probs(q, k, scale, mask)
    o = p @ vr
    dvr = p.transpose(-1, -2) @ do
    dp = do @ vr.transpose(-1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdim=True))
    dq = scale * ds @ kr
    dkr = scale * ds.transpose(-1, -2) @ q
    b, _, s_k, _ = k.shape
    fold = lambda t: t.reshape(b, k.size(1), g, s_k, t.size(-1)).sum(2)  # noqa: E731
    return dq, fold(dkr), fold(dvr)


class Fa3StandIn:
    """fa3._ops.fwd / bwd in float64 on CPU, following fa3's contract; records every call."""

    def __init__(self):
        self.fwd_calls, self.bwd_calls = [], []

    @staticmethod
    def _problems(q, k, cu_q, cu_k):
        """(q rows, k rows) index pairs per sequence, for the dense and the packed layouts."""
        if cu_q is None:
            return [(b, b) for b in range(q.size(0))]
        cq, ck = cu_q.tolist(), cu_k.tolist()
        return [(slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])) for b in range(len(cq) - 1)]

    @staticmethod
    def _setup(q, k, softmax_scale, causal, window_left, window_right):
        scale = softmax_scale if softmax_scale != 0.0 else 1.0 / math.sqrt(q.size(-1))
        return scale, lambda s_q, s_k: allowed_keys(s_q, s_k, causal, window_left, window_right)

    def fwd(self, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
            max_seqlen_q=0, max_seqlen_k=0, page_table=None, q_descale=None, k_descale=None,
            v_descale=None, softmax_scale=0.0, causal=False, window_left=-1, window_right=-1,
            softcap=0.0, num_splits=1, deterministic=False):
        self.fwd_calls.append(dict(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q,
                                   cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                                   max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                   softmax_scale=softmax_scale, causal=causal,
                                   window_left=window_left, window_right=window_right))
        assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
        scale, mask = self._setup(q, k, softmax_scale, causal, window_left, window_right)
        out = q.new_zeros(*q.shape[:-1], v.size(-1))
        lse = (torch.full((q.size(0), q.size(2), q.size(1)), float("inf"), dtype=torch.float32)
               if cu_seqlens_q is None else
               torch.full((q.size(1), q.size(0)), float("inf"), dtype=torch.float32))
        for iq, ik in self._problems(q, k, cu_seqlens_q, cu_seqlens_k):
            qb, kb, vb = (t.transpose(0, 1)[None].to(F64) for t in (q[iq], k[ik], v[ik]))
            o, l = ref_attention(qb, kb, vb, scale, mask(qb.size(2), kb.size(2)))
            out[iq] = o[0].transpose(0, 1).to(out.dtype)
            if cu_seqlens_q is None:
                lse[iq] = l[0].float()
            else:
                lse[:, iq] = l[0].float()
        return out, lse

    def bwd(self, dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None,
            seqused_q=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0, softmax_scale=0.0,
            causal=False, window_left=-1, window_right=-1, softcap=0.0, deterministic=False):
        self.bwd_calls.append(dict(dout=dout, q=q, k=k, v=v, out=out, softmax_lse=softmax_lse,
                                   cu_seqlens_q=cu_seqlens_q, softmax_scale=softmax_scale,
                                   causal=causal, window_left=window_left,
                                   window_right=window_right))
        scale, mask = self._setup(q, k, softmax_scale, causal, window_left, window_right)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for iq, ik in self._problems(q, k, cu_seqlens_q, cu_seqlens_k):
            qb, kb, vb, dob = (t.transpose(0, 1)[None].to(F64)
                               for t in (q[iq], k[ik], v[ik], dout[iq]))
            g = ref_attention_grads(qb, kb, vb, dob, scale, mask(qb.size(2), kb.size(2)))
            dq[iq], dk[ik], dv[ik] = (t[0].transpose(0, 1) for t in g)
        return dq, dk, dv, q.new_empty(0, dtype=torch.float32)  # (no sinks: dsinks is empty)


@pytest.fixture
def stand_in(monkeypatch):
    """fa3's operators replaced by the float64 stand-in, and the decision forced to fa3."""
    s = Fa3StandIn()
    monkeypatch.setattr(_ops, "fwd", s.fwd)
    monkeypatch.setattr(_ops, "bwd", s.bwd)
    monkeypatch.setattr(sdpa, "_fa3_reason", lambda *a, **kw: None)
    return s


@pytest.fixture
def cpu_overrides(monkeypatch):
    """The overrides registered for CPU, so aten's operators and autograd run them here."""
    monkeypatch.setattr(_ops, "available", lambda: True)
    handle = sdpa._register("CPU")
    yield handle
    handle.remove()


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def randn(*shape, dtype=F64, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


# ---- registration -------------------------------------------------------------------------------
def test_import_registers_without_activating_or_touching_cuda():
    # A fresh interpreter: importing must register "fa3" only, and initialise no CUDA context.
    code = ("import torch, torch.nn.attention as A, fa3.sdpa\n"
            "assert 'fa3' in A.list_flash_attention_impls(), A.list_flash_attention_impls()\n"
            "assert A.current_flash_attention_impl() is None\n"
            "assert not torch.cuda.is_initialized()\n"
            "assert not torch._C._get_fa3_sdp_enabled()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "fa3" in attention.list_flash_attention_impls()


def test_activate_needs_the_compiled_library(monkeypatch):
    monkeypatch.setattr(_ops, "available", lambda: False)
    before = attention.current_flash_attention_impl()
    with pytest.raises(RuntimeError, match="not loaded"):
        sdpa.activate()
    assert attention.current_flash_attention_impl() == before != "fa3"


def _cuda_kernel_sites(op):
    dump = torch._C._dispatch_dump(op)
    return [line for line in dump.splitlines() if line.startswith("CUDA:")]


def test_activate_overrides_the_cuda_kernels_and_deactivate_restores(monkeypatch):
    monkeypatch.setattr(_ops, "available", lambda: True)
    ops = ["aten::_flash_attention_forward", "aten::_flash_attention_backward",
           "aten::_scaled_dot_product_flash_attention",
           "aten::_scaled_dot_product_flash_attention_backward"]
    if "quantized" in torch.ops.aten._flash_attention_forward.overloads():
        ops += ["aten::_flash_attention_forward.quantized",
                "aten::_scaled_dot_product_flash_attention.quantized"]
    before = {op: _cuda_kernel_sites(op) for op in ops}
    assert not torch._C._get_fa3_sdp_enabled()
    sdpa.activate()
    try:
        assert attention.current_flash_attention_impl() == "fa3"
        assert torch._C._get_fa3_sdp_enabled()
        for op in ops:
            assert any("fa3" in line and "sdpa.py" in line for line in _cuda_kernel_sites(op)), op
    finally:
        sdpa.deactivate()
    assert attention.current_flash_attention_impl() is None
    assert not torch._C._get_fa3_sdp_enabled()
    assert {op: _cuda_kernel_sites(op) for op in ops} == before
    sdpa.deactivate()  # not active: a no-op
    assert attention.current_flash_attention_impl() is None


def test_handle_restores_the_previous_fa3_flag(monkeypatch):
    monkeypatch.setattr(_ops, "available", lambda: True)
    torch._C._set_sdp_use_fa3(True)
    try:
        handle = sdpa._register("CPU")
        assert torch._C._get_fa3_sdp_enabled()
        handle.remove()
        assert torch._C._get_fa3_sdp_enabled()
        handle.remove()  # twice is harmless
    finally:
        torch._C._set_sdp_use_fa3(False)


# ---- the decision --------------------------------------------------------------------------------
def _fakes(q_shape, k_shape, v_shape=None, dtype=torch.bfloat16, device="cuda"):
    with FakeTensorMode():
        return (torch.empty(q_shape, dtype=dtype, device=device),
                torch.empty(k_shape, dtype=dtype, device=device),
                torch.empty(v_shape or k_shape, dtype=dtype, device=device))


H100 = dict(library_loaded=True, capability=(9, 0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_decision_accepts_what_fa3_runs(dtype):
    d = 128
    q, k, v = _fakes((2, 17, 8, d), (2, 33, 2, d), dtype=dtype)
    assert sdpa._fa3_can_run(q, k, v, **H100) is None
    assert sdpa._fa3_can_run(q, k, v, scale=0.1, descaled=dtype == torch.float8_e4m3fn,
                             **H100) is None
    qv, kv, vv = _fakes((40, 8, d), (50, 2, d), dtype=dtype)
    assert sdpa._fa3_can_run(qv, kv, vv, varlen=True, **H100) is None
    if dtype != torch.float8_e4m3fn:
        assert sdpa._fa3_can_run(q, k, v, grad_out=q, out=q, logsumexp=_lse(q), **H100) is None


def _lse(q, dtype=torch.float32):
    with FakeTensorMode():
        return torch.empty(q.size(0), q.size(2), q.size(1), dtype=dtype, device=q.device)


@pytest.mark.parametrize("case, words", [
    (dict(library_loaded=False), "not loaded"),
    (dict(capability=(8, 0)), "compute capability"),
    (dict(capability=None), "compute capability"),
    (dict(dropout_p=0.1), "dropout"),
    (dict(return_debug_mask=True), "return_debug_mask"),
    (dict(alibi_slopes=torch.ones(8)), "alibi"),
    (dict(scale=0.0), "scale"),
    (dict(scale=float("inf")), "scale"),
    (dict(descaled=True), "descales"),
    (dict(varlen=True), "expected 3-D"),
])
def test_decision_names_why_it_falls_back(case, words):
    q, k, v = _fakes((2, 17, 8, 64), (2, 17, 2, 64))
    kw = {**H100, **case}
    reason = sdpa._fa3_can_run(q, k, v, **kw)
    assert reason is not None and words in reason


@pytest.mark.parametrize("shapes, dtype, words", [
    (((2, 17, 8, 64), (2, 17, 2, 64)), torch.float32, "dtype"),
    (((2, 17, 8, 64), (2, 17, 2, 64)), torch.float64, "dtype"),
    (((2, 17, 8, 60), (2, 17, 2, 60)), torch.bfloat16, "head_dim_qk"),
    (((2, 17, 8, 512), (2, 17, 2, 512)), torch.bfloat16, "head_dim_qk"),
    (((2, 17, 8, 32), (2, 17, 2, 32)), torch.float8_e4m3fn, None),
    (((2, 17, 8, 40), (2, 17, 2, 40)), torch.float8_e4m3fn, "head_dim_qk"),  # fp8: 16 elements
    (((2, 17, 8, 64), (2, 17, 3, 64)), torch.bfloat16, "heads"),
    (((2, 0, 8, 64), (2, 17, 2, 64)), torch.bfloat16, "empty"),
])
def test_decision_checks_shapes_and_dtypes(shapes, dtype, words):
    q, k, v = _fakes(*shapes, dtype=dtype)
    reason = sdpa._fa3_can_run(q, k, v, **H100)
    assert (reason is None) if words is None else (words in reason)


def test_decision_off_cuda_and_for_backwards():
    q, k, v = _fakes((2, 17, 8, 64), (2, 17, 2, 64), device="cpu")
    assert "CUDA" in sdpa._fa3_can_run(q, k, v, **H100)
    q, k, v = _fakes((2, 17, 8, 64), (2, 17, 2, 64), dtype=torch.float8_e4m3fn)
    assert "backward" in sdpa._fa3_can_run(q, k, v, grad_out=q, out=q, logsumexp=_lse(q), **H100)
    q, k, v = _fakes((2, 17, 8, 64), (2, 17, 2, 64))
    assert "logsumexp" in sdpa._fa3_can_run(q, k, v, grad_out=q, out=q,
                                            logsumexp=_lse(q, torch.bfloat16), **H100)
    g, _, _ = _fakes((2, 17, 8, 64), (2, 17, 2, 64), dtype=torch.float16)
    assert "grad_out" in sdpa._fa3_can_run(q, k, v, grad_out=g, out=q, logsumexp=_lse(q), **H100)


def test_environment_wrapper_sees_cpu_tensors_as_fallback():
    q = torch.randn(1, 4, 2, 64, dtype=torch.bfloat16)
    assert sdpa._fa3_reason(q, q, q) is not None


# ---- the math fallback against float64 references ------------------------------------------------
MASKS = [  # (s_q, s_k, causal, window_left, window_right)
    (9, 9, False, -1, -1),
    (9, 9, True, -1, -1),
    (5, 12, True, -1, -1),   # bottom-right causal with more keys than queries
    (12, 5, True, -1, -1),   # more queries: the first rows see no key
    (16, 16, False, 3, 2),
    (16, 16, True, 4, -1),   # sliding causal window
    (7, 20, False, 0, 5),
]


@pytest.mark.parametrize("s_q, s_k, causal, wl, wr", MASKS)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_math_fallback_dense(s_q, s_k, causal, wl, wr, heads, dtype):
    torch.manual_seed(0)
    h_q, h_kv = heads
    q = randn(2, s_q, h_q, 16, dtype=dtype)
    k = randn(2, s_k, h_kv, 16, dtype=dtype)
    v = randn(2, s_k, h_kv, 24, dtype=dtype)  # d_v != d_qk
    out, lse, rng_state, unused, debug = sdpa._flash_attention_forward(
        q, k, v, None, None, s_q, s_k, 0.0, causal, False, scale=None, window_size_left=wl,
        window_size_right=wr)
    mask = allowed_keys(s_q, s_k, causal, wl, wr)
    t = lambda x: x.transpose(1, 2).to(F64)  # noqa: E731
    ref, ref_lse = ref_attention(t(q), t(k), t(v), 1 / math.sqrt(16), mask)
    assert out.dtype == dtype and out.shape == (2, s_q, h_q, 24)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel(out.transpose(1, 2), ref) <= tol
    assert lse.dtype == torch.float32 and lse.shape == (2, h_q, s_q)
    seen = mask.any(-1)
    assert torch.isinf(lse[..., ~seen]).all() and (lse[..., ~seen] > 0).all()
    assert torch.allclose(lse[..., seen].double(), ref_lse[..., seen], rtol=1e-5, atol=1e-5)
    assert rng_state.dtype == torch.uint64 and rng_state.shape == (2,)
    assert unused.dtype == torch.uint64 and unused.shape == ()
    assert debug.numel() == 0

    do = torch.randn_like(out)
    dq, dk, dv = sdpa._flash_attention_backward(
        do, q, k, v, out, lse, None, None, s_q, s_k, 0.0, causal, rng_state, unused,
        window_size_left=wl, window_size_right=wr)
    refs = ref_attention_grads(t(q), t(k), t(v), t(do), 1 / math.sqrt(16), mask)
    for got, want, like in zip((dq, dk, dv), refs, (q, k, v)):
        assert got.dtype == like.dtype and got.shape == like.shape
        assert rel(got.transpose(1, 2), want) <= (1e-5 if dtype == torch.float32 else 2e-2)


def test_math_fallback_float64_matches_sdpa_math():
    torch.manual_seed(1)
    q, k, v = randn(2, 4, 11, 8), randn(2, 4, 11, 8), randn(2, 4, 11, 8)
    out = sdpa._sdpa_flash_forward(q, k, v, 0.0, True, False, scale=0.7)[0]
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.7)
    assert out.dtype == F64 and rel(out, ref) < 1e-12


def _pack(lens, h, d, dtype=torch.float32):
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    return randn(int(cu[-1]), h, d, dtype=dtype), cu


@pytest.mark.parametrize("causal, wl, wr", [(False, -1, -1), (True, -1, -1), (False, 2, 0)])
def test_math_fallback_varlen(causal, wl, wr):
    torch.manual_seed(2)
    lens_q, lens_k = [3, 1, 7], [5, 4, 7]
    q, cu_q = _pack(lens_q, 4, 16)
    k, cu_k = _pack(lens_k, 2, 16)
    v, _ = _pack(lens_k, 2, 16)
    # Extra packed rows past the last sequence: they belong to no sequence.
    q = torch.cat([q, torch.randn(2, 4, 16)])
    out, lse, rng_state, _, _ = sdpa._flash_attention_forward(
        q, k, v, cu_q, cu_k, 7, 7, 0.0, causal, False, scale=0.3, window_size_left=wl,
        window_size_right=wr)
    assert out.shape == q.shape and lse.shape == (4, q.size(0))
    do = torch.randn_like(out)
    dq, dk, dv = sdpa._flash_attention_backward(
        do, q, k, v, out, lse, cu_q, cu_k, 7, 7, 0.0, causal, rng_state, None, scale=0.3,
        window_size_left=wl, window_size_right=wr)
    for b in range(3):
        iq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ik = slice(int(cu_k[b]), int(cu_k[b + 1]))
        t = lambda x: x.transpose(0, 1)[None].to(F64)  # noqa: E731
        mask = allowed_keys(lens_q[b], lens_k[b], causal, wl, wr)
        ref, ref_lse = ref_attention(t(q[iq]), t(k[ik]), t(v[ik]), 0.3, mask)
        assert rel(out[iq], ref[0].transpose(0, 1)) < 1e-5
        seen = mask.any(-1)
        assert torch.allclose(lse[:, iq][:, seen].double(), ref_lse[0][:, seen], atol=1e-5)
        gq, gk, gv = ref_attention_grads(t(q[iq]), t(k[ik]), t(v[ik]), t(do[iq]), 0.3, mask)
        assert rel(dq[iq], gq[0].transpose(0, 1)) < 1e-5
        assert rel(dk[ik], gk[0].transpose(0, 1)) < 1e-5
        assert rel(dv[ik], gv[0].transpose(0, 1)) < 1e-5
    assert (out[-2:] == 0).all() and torch.isinf(lse[:, -2:]).all()
    assert (dq[-2:] == 0).all()


def test_math_fallback_seqused_k_limits_the_keys():
    torch.manual_seed(3)
    q, k, v = randn(2, 4, 2, 8), randn(2, 10, 2, 8), randn(2, 10, 2, 8)
    used = torch.tensor([3, 10], dtype=torch.int32)
    out = sdpa._flash_attention_forward(q, k, v, None, None, 4, 10, 0.0, True, False,
                                        seqused_k=used)[0]
    for b, n in enumerate(used.tolist()):
        t = lambda x: x[b:b + 1, :n].transpose(1, 2)  # noqa: E731  (the first n keys)
        ref, _ = ref_attention(q[b:b + 1].transpose(1, 2), t(k), t(v), 1 / math.sqrt(8),
                               allowed_keys(4, n, True, -1, -1))
        assert rel(out[b:b + 1].transpose(1, 2), ref) < 1e-12


def test_math_fallback_alibi():
    torch.manual_seed(4)
    q, k, v = randn(1, 6, 2, 8), randn(1, 9, 2, 8), randn(1, 9, 2, 8)
    slopes = torch.tensor([0.5, 0.25])
    out = sdpa._flash_attention_forward(q, k, v, None, None, 6, 9, 0.0, False, False,
                                        alibi_slopes=slopes)[0]
    # FlashAttention's ALiBi: score -= slope * |i + s_k - s_q - j|
    i = torch.arange(6)[:, None] + 3
    j = torch.arange(9)[None, :]
    bias = -slopes.double()[:, None, None] * (i - j).abs()
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=bias[None])
    assert rel(out.transpose(1, 2), ref) < 1e-12


def test_math_fallback_fp8_dequantises_with_descales():
    torch.manual_seed(5)
    b, s, h_q, h_kv, d = 2, 9, 4, 2, 16
    q8, k8, v8 = (torch.randn(b, s, h, d).to(torch.float8_e4m3fn) for h in (h_q, h_kv, h_kv))
    qd, kd, vd = (torch.rand(b, h_kv) + 0.5 for _ in range(3))
    out = sdpa._flash_attention_forward_quantized(q8, k8, v8, None, None, s, s, 0.0, True, False,
                                                  qd, kd, vd)[0]
    assert out.dtype == torch.bfloat16
    deq = lambda t, ds, g: t.double() * ds.double().repeat_interleave(g, 1)[:, None, :, None]  # noqa: E731
    qf, kf, vf = deq(q8, qd, 2), deq(k8, kd, 1), deq(v8, vd, 1)
    ref, _ = ref_attention(qf.transpose(1, 2), kf.transpose(1, 2), vf.transpose(1, 2),
                           1 / math.sqrt(d), allowed_keys(s, s, True, -1, -1))
    assert rel(out.transpose(1, 2), ref) < 1e-2
    with pytest.raises(ValueError, match="k_descale"):
        sdpa._flash_attention_forward_quantized(q8, k8, v8, None, None, s, s, 0.0, True, False,
                                                qd, kd[:, :1], vd)


def test_math_fallback_empty_keys():
    q, k, v = randn(1, 3, 2, 8), randn(1, 0, 2, 8), randn(1, 0, 2, 8)
    out, lse, rng, unused, _ = sdpa._flash_attention_forward(q, k, v, None, None, 3, 0, 0.0,
                                                            False, False)
    assert (out == 0).all() and torch.isinf(lse).all()
    dq, dk, dv = sdpa._flash_attention_backward(torch.randn_like(out), q, k, v, out, lse, None,
                                                None, 3, 0, 0.0, False, rng, unused)
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape


# ---- dropout: the backward regenerates the forward's mask ----------------------------------------
@pytest.mark.parametrize("causal, heads", [(False, (4, 4)), (True, (4, 2))])
def test_dropout_backward_uses_the_forward_mask(causal, heads):
    torch.manual_seed(6)
    h_q, h_kv = heads
    p = 0.3
    q, k, v = randn(2, h_q, 13, 16), randn(2, h_kv, 13, 16), randn(2, h_kv, 13, 16)
    out, lse, _, _, _, _, rng_state, unused, debug = sdpa._sdpa_flash_forward(
        q, k, v, p, causal, True, scale=0.25)
    assert rng_state.dtype == torch.uint64 and rng_state.shape == (2,) and int(rng_state[0]) != 0
    assert debug.shape == (2, h_q, 13, 13)
    # The debug mask is PyTorch's flash convention: probabilities, negative where dropped.
    keep = (debug >= 0).double()
    mask = allowed_keys(13, 13, causal, -1, -1)
    dropped = ((debug < 0) & mask).sum() / (mask.sum() * 2 * h_q)
    assert abs(dropped.item() - p) < 0.08
    probs, _ = ref_probs(q, k, 0.25, mask)
    assert torch.allclose(debug.abs(), probs, atol=1e-12)

    # Autograd through the same masked forward is the reference for the backward.
    ql, kl, vl = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    ref, _ = ref_attention(ql, kl, vl, 0.25, mask, keep=keep, dropout_p=p)
    assert rel(out, ref) < 1e-12
    do = torch.randn_like(out)
    want = torch.autograd.grad(ref, (ql, kl, vl), do)
    got = sdpa._sdpa_flash_backward(do, q, k, v, out, lse, None, None, 13, 13, p, causal,
                                    rng_state, unused, scale=0.25)
    for g, w in zip(got, want):
        assert rel(g, w) < 1e-12
    # Same seed, same mask: a second backward is identical.
    again = sdpa._sdpa_flash_backward(do, q, k, v, out, lse, None, None, 13, 13, p, causal,
                                      rng_state, unused, scale=0.25)
    assert all(torch.equal(a, b) for a, b in zip(got, again))


def test_dropout_follows_torch_manual_seed():
    q = randn(1, 2, 8, 8)
    torch.manual_seed(7)
    a = sdpa._sdpa_flash_forward(q, q, q, 0.5)
    torch.manual_seed(7)
    b = sdpa._sdpa_flash_forward(q, q, q, 0.5)
    c = sdpa._sdpa_flash_forward(q, q, q, 0.5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[6], b[6])
    assert not torch.equal(b[0], c[0])


def test_dropout_varlen_backward_matches_recomputation():
    torch.manual_seed(8)
    q, cu = _pack([4, 6], 2, 8, dtype=F64)
    k, _ = _pack([4, 6], 2, 8, dtype=F64)
    v, _ = _pack([4, 6], 2, 8, dtype=F64)
    out, lse, rng_state, unused, debug = sdpa._flash_attention_forward(
        q, k, v, cu, cu, 6, 6, 0.4, True, True)
    assert debug.shape == (2, 2, 6, 6)
    do = torch.randn_like(out)
    got = sdpa._flash_attention_backward(do, q, k, v, out, lse, cu, cu, 6, 6, 0.4, True,
                                         rng_state, unused)
    ql, kl, vl = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    outs = []
    for b, (a, e) in enumerate([(0, 4), (4, 10)]):
        n = e - a
        keep = (debug[b, :, :n, :n] >= 0).double()
        t = lambda x: x[a:e].transpose(0, 1)[None]  # noqa: E731
        o, _ = ref_attention(t(ql), t(kl), t(vl), 1 / math.sqrt(8),
                             allowed_keys(n, n, True, -1, -1), keep=keep, dropout_p=0.4)
        outs.append(o[0].transpose(0, 1))
    ref = torch.cat(outs)
    assert rel(out, ref) < 1e-12
    want = torch.autograd.grad(ref, (ql, kl, vl), do)
    for g, w in zip(got, want):
        assert rel(g, w) < 1e-12


# ---- the glue to fa3 (operators replaced by the float64 stand-in) --------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_sdpa_forward_hands_fa3_bshd_views(stand_in, causal, heads):
    torch.manual_seed(9)
    h_q, h_kv = heads
    q, k, v = randn(2, h_q, 10, 16), randn(2, h_kv, 10, 16), randn(2, h_kv, 10, 16)
    res = sdpa._sdpa_flash_forward(q, k, v, 0.0, causal, False, scale=0.2)
    out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, debug = res
    (call,) = stand_in.fwd_calls
    for name, t in (("q", q), ("k", k), ("v", v)):
        got = call[name]
        # A transposed view of the caller's tensor: same memory, BSHD shape, no copy.
        assert got.data_ptr() == t.data_ptr() and got.shape == t.transpose(1, 2).shape
        assert got.stride() == t.transpose(1, 2).stride()
    assert call["cu_seqlens_q"] is None and call["softmax_scale"] == 0.2
    assert call["causal"] is causal and call["window_right"] == (0 if causal else -1)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.2,
                                         enable_gqa=h_q != h_kv)
    assert out.shape == q.shape and rel(out, ref) < 1e-12
    # Laid out as torch.empty_like(query), as aten's meta kernel promises (BHSD memory here).
    assert out.stride() == torch.empty_like(q).stride()
    scores = (q @ k.repeat_interleave(h_q // h_kv, 1).transpose(-1, -2)) * 0.2
    if causal:
        scores = scores.masked_fill(~allowed_keys(10, 10, True, -1, -1), float("-inf"))
    assert torch.allclose(lse.double(), torch.logsumexp(scores, -1), atol=1e-5)
    assert cum_q is None and cum_k is None and (max_q, max_k) == (10, 10)
    assert rng_state.dtype == torch.uint64 and rng_state.shape == (2,)
    assert (rng_state == 0).all() and unused.shape == () and debug.numel() == 0

    do = torch.randn_like(out)
    dq, dk, dv = sdpa._sdpa_flash_backward(do, q, k, v, out, lse, cum_q, cum_k, max_q, max_k,
                                           0.0, causal, rng_state, unused, scale=0.2)
    (bcall,) = stand_in.bwd_calls
    assert bcall["dout"].data_ptr() == do.data_ptr() and bcall["dout"].shape == (2, 10, h_q, 16)
    assert bcall["out"].data_ptr() == out.data_ptr() and bcall["softmax_lse"] is lse
    ql, kl, vl = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(ql, kl, vl, is_causal=causal, scale=0.2,
                                         enable_gqa=h_q != h_kv)
    want = torch.autograd.grad(ref, (ql, kl, vl), do)
    for g, w in zip((dq, dk, dv), want):
        assert g.shape == w.shape and rel(g, w) < 1e-12


def test_flash_forward_passes_scale_and_windows(stand_in):
    q, k, v = randn(1, 8, 2, 16), randn(1, 8, 2, 16), randn(1, 8, 2, 16)
    sdpa._flash_attention_forward(q, k, v, None, None, 8, 8, 0.0, False, False,
                                  window_size_left=3, window_size_right=1)
    sdpa._flash_attention_forward(q, k, v, None, None, 8, 8, 0.0, True, False, scale=0.5,
                                  window_size_left=-5, window_size_right=None)
    a, b = stand_in.fwd_calls
    assert a["softmax_scale"] == pytest.approx(1 / math.sqrt(16))  # None: 1/sqrt(d), not fa3's 0
    assert (a["window_left"], a["window_right"], a["causal"]) == (3, 1, False)
    assert (b["window_left"], b["window_right"], b["causal"]) == (-1, 0, True)
    assert b["softmax_scale"] == 0.5


def test_varlen_forward_maps_cum_seq_to_cu_seqlens(stand_in):
    q, cu_q = _pack([2, 5], 2, 16, dtype=F64)
    k, cu_k = _pack([3, 5], 2, 16, dtype=F64)
    v, _ = _pack([3, 5], 2, 16, dtype=F64)
    used = torch.tensor([3, 4], dtype=torch.int64)
    out, lse, *_ = sdpa._flash_attention_forward(q, k, v, cu_q.long(), cu_k, 5, 5, 0.0, True,
                                                 False, seqused_k=used)
    (call,) = stand_in.fwd_calls
    assert call["cu_seqlens_q"].dtype == torch.int32 and call["cu_seqlens_k"] is cu_k
    assert torch.equal(call["cu_seqlens_q"], cu_q)
    assert call["seqused_k"].dtype == torch.int32 and torch.equal(call["seqused_k"].long(), used)
    assert (call["max_seqlen_q"], call["max_seqlen_k"]) == (5, 5)
    assert call["q"] is q and out.shape == q.shape and lse.shape == (2, 7)


def test_fa3_not_supported_falls_back_and_real_errors_propagate(monkeypatch):
    monkeypatch.setattr(sdpa, "_fa3_reason", lambda *a, **kw: None)

    def unsupported(*a, **kw):
        raise RuntimeError("fa3: fwd: not supported yet: hopper kernel: something")
    monkeypatch.setattr(_ops, "fwd", unsupported)
    monkeypatch.setattr(_ops, "bwd", unsupported)
    q, k, v = randn(1, 2, 6, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8)
    out, lse, *rest = sdpa._sdpa_flash_forward(q, k, v, 0.0, True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert rel(out, ref) < 1e-12
    do = torch.randn_like(out)
    dq, _, _ = sdpa._sdpa_flash_backward(do, q, k, v, out, lse, None, None, 6, 6, 0.0, True,
                                         rest[4], rest[5])
    ql = q.detach().clone().requires_grad_(True)
    (want,) = torch.autograd.grad(F.scaled_dot_product_attention(ql, k, v, is_causal=True), ql, do)
    assert rel(dq, want) < 1e-12

    def broken(*a, **kw):
        raise RuntimeError("fa3: k: expected head_dim 8 (that of q), got 4")
    monkeypatch.setattr(_ops, "fwd", broken)
    with pytest.raises(RuntimeError, match="expected head_dim"):
        sdpa._sdpa_flash_forward(q, k, v)


# ---- end to end through aten's operators and autograd (registered for CPU) -----------------------
@pytest.mark.parametrize("causal, heads", [(False, (4, 4)), (True, (4, 2))])
def test_aten_sdpa_flash_op_and_its_autograd_reach_fa3(cpu_overrides, stand_in, causal, heads):
    torch.manual_seed(10)
    h_q, h_kv = heads
    q, k, v = randn(2, h_q, 12, 16, grad=True), randn(2, h_kv, 12, 16, grad=True), \
        randn(2, h_kv, 12, 16, grad=True)
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False,
                                                             scale=0.3)[0]
    do = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), do)
    assert len(stand_in.fwd_calls) == 1 and len(stand_in.bwd_calls) == 1
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3,
                                         enable_gqa=h_q != h_kv)
    want = torch.autograd.grad(ref, (q, k, v), do)
    assert rel(out, ref) < 1e-12
    for g, w in zip(got, want):
        assert rel(g, w) < 1e-12


@pytest.mark.parametrize("memory", ["bshd", "bhsd"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_outputs_are_laid_out_like_the_inputs(cpu_overrides, stand_in, memory, dropout_p):
    # aten's meta kernels give the output and the gradients torch.empty_like's layout of query, key
    # and value, and compiled graphs assert it: for BSHD memory (transformers' projections viewed
    # and transposed: fa3's own layout) and BHSD memory, fa3's path and the math fallback (dropout).
    torch.manual_seed(12)
    shape = (2, 10, 4, 16) if memory == "bshd" else (2, 4, 10, 16)
    q, k, v = (randn(*shape) for _ in range(3))
    if memory == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, False, False)[0]
    assert out.stride() == torch.empty_like(q).stride()
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    for g, t in zip(grads, (q, k, v)):
        assert g.stride() == torch.empty_like(t).stride()


def test_compiled_sdpa_flash_op_checks_out(cpu_overrides):
    # Inductor asserts the operator's output strides against its meta kernel: here those of BSHD
    # memory, where the math fallback (dropout) computes in BHSD.
    torch.manual_seed(13)
    q, k, v = (randn(1, 8, 2, 16, dtype=torch.float32).transpose(1, 2) for _ in range(3))
    fn = lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(  # noqa: E731
        q, k, v, 0.1, False, False)[0]
    out = torch.compile(fn, backend="inductor", fullgraph=True)(q, k, v)
    assert out.shape == q.shape and out.stride() == q.stride()


def test_aten_dropout_autograd_runs_the_fallback(cpu_overrides):
    torch.manual_seed(11)
    q, k, v = randn(1, 2, 10, 8, grad=True), randn(1, 2, 10, 8, grad=True), \
        randn(1, 2, 10, 8, grad=True)
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.25, False, True)
    out, debug = res[0], res[8]
    do = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), do)
    ql, kl, vl = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    ref, _ = ref_attention(ql, kl, vl, 1 / math.sqrt(8), allowed_keys(10, 10, False, -1, -1),
                           keep=(debug >= 0).double(), dropout_p=0.25)
    want = torch.autograd.grad(ref, (ql, kl, vl), do)
    assert rel(out, ref) < 1e-12
    for g, w in zip(got, want):
        assert rel(g, w) < 1e-12


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 0)])
def test_varlen_attn_reaches_fa3(cpu_overrides, stand_in, window):
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    torch.manual_seed(12)
    lens = [3, 8, 1]
    q, cu = _pack(lens, 4, 16, dtype=F64)
    k, _ = _pack(lens, 4, 16, dtype=F64)
    v, _ = _pack(lens, 4, 16, dtype=F64)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = varlen.varlen_attn(q, k, v, cu, cu, 8, 8, window_size=window)
    do = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), do)
    (call,) = stand_in.fwd_calls
    assert call["cu_seqlens_q"] is cu and call["max_seqlen_q"] == 8
    assert (call["window_left"], call["window_right"]) == window
    assert len(stand_in.bwd_calls) == 1
    refs = []
    for b in range(len(lens)):
        sl = slice(int(cu[b]), int(cu[b + 1]))
        t = lambda x: x[sl].transpose(0, 1)[None]  # noqa: E731
        o, _ = ref_attention(t(q), t(k), t(v), 1 / math.sqrt(16),
                             allowed_keys(lens[b], lens[b], False, *window))
        refs.append(o[0].transpose(0, 1))
    ref = torch.cat(refs)
    want = torch.autograd.grad(ref, (q, k, v), do)
    assert rel(out, ref) < 1e-12
    for g, w in zip(got, want):
        assert rel(g, w) < 1e-12
