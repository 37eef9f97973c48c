"""fa3.sdpa on a Hopper GPU: after fa3.sdpa.activate(), F.scaled_dot_product_attention's flash
backend and torch.nn.attention.varlen.varlen_attn run fa3 (counted through wrappers of
fa3._ops.fwd / bwd) and match float64 math in outputs and gradients (relative error <= 1e-2);
dropout runs the fallback; deactivate() gives PyTorch's own kernels back."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, current_flash_attention_impl, sdpa_kernel

from util import count_calls, rel_err, skip_unless_hopper

skip_unless_hopper()

from fa3 import _ops, sdpa  # noqa: E402

DEV = "cuda"
F64 = torch.float64


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEV, dtype=dtype, requires_grad=True)


def leaves64(*ts):
    return [t.detach().to(F64).requires_grad_(True) for t in ts]


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls that reach fa3's operators (the real ones run underneath)."""
    return count_calls(monkeypatch, _ops, fwd="fwd", bwd="bwd")


@pytest.fixture
def active():
    sdpa.activate()
    assert current_flash_attention_impl() == "fa3"
    yield
    sdpa.deactivate()


def sdpa_flash(q, k, v, **kw):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def sdpa_math64(q, k, v, **kw):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kw)


# ---- dense SDPA ---------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s", [1, 17, 1000])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_flash_backend_runs_fa3(active, calls, dtype, heads, s, causal, d):
    torch.manual_seed(0)
    h_q, h_kv = heads
    kw = dict(is_causal=causal, enable_gqa=h_q != h_kv)
    q, k, v = rand(2, h_q, s, d, dtype=dtype), rand(2, h_kv, s, d, dtype=dtype), \
        rand(2, h_kv, s, d, dtype=dtype)
    out = sdpa_flash(q, k, v, **kw)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert calls == {"fwd": 1, "bwd": 1}

    q64, k64, v64 = leaves64(q, k, v)
    ref = sdpa_math64(q64, k64, v64, **kw)
    want = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel_err(out, ref) <= 1e-2
    for name, g, w in zip("qkv", grads, want):
        assert g.shape == w.shape, name
        assert rel_err(g, w) <= 1e-2, name


# ---- varlen_attn --------------------------------------------------------------------------------
def window_mask(n, window, device):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    left, right = window
    m = torch.ones(n, n, dtype=torch.bool, device=device)
    if left >= 0:
        m &= j >= i - left
    if right >= 0:
        m &= j <= i + right
    return m


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (128, 0)], ids=["full", "causal", "slide"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen_attn_runs_fa3(active, calls, d, heads, window):
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    torch.manual_seed(1)
    h_q, h_kv = heads
    lens = [1, 17, 1000, 64, 129]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    total = int(cu[-1])
    q, k, v = rand(total, h_q, d), rand(total, h_kv, d), rand(total, h_kv, d)
    out, lse = varlen.varlen_attn(q, k, v, cu, cu, max(lens), max(lens), window_size=window,
                                  return_aux=varlen.AuxRequest(lse=True))
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert calls == {"fwd": 1, "bwd": 1}

    # float64 reference, one sequence at a time.
    q64, k64, v64 = leaves64(q, k, v)
    refs, ref_lse = [], []
    for a, n in zip(cu.tolist(), lens):
        t = lambda x: x[a:a + n].transpose(0, 1)[None]  # noqa: E731  [1, h, n, d]
        qb, kb, vb = t(q64), t(k64), t(v64)
        mask = window_mask(n, window, DEV)
        refs.append(sdpa_math64(qb, kb, vb, attn_mask=mask, enable_gqa=h_q != h_kv)[0]
                    .transpose(0, 1))
        kr = kb.repeat_interleave(h_q // h_kv, dim=1)
        scores = (qb @ kr.transpose(-1, -2)).detach() / math.sqrt(d)
        ref_lse.append(torch.logsumexp(scores.masked_fill(~mask, -math.inf), -1)[0])
    ref = torch.cat(refs)
    want = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    assert rel_err(out, ref) <= 1e-2
    for name, g, w in zip("qkv", grads, want):
        assert rel_err(g, w) <= 1e-2, name
    # The LSE layout of PyTorch's varlen flash kernel: [heads, total_q].
    assert lse.shape == (h_q, total) and lse.dtype == torch.float32
    assert torch.allclose(lse.double(), torch.cat(ref_lse, dim=1), atol=1e-3, rtol=1e-3)


# ---- dropout: the fallback ----------------------------------------------------------------------
def test_dropout_runs_the_fallback(active, calls):
    torch.manual_seed(2)
    p = 0.3
    q, k, v = rand(2, 8, 256, 64), rand(2, 8, 256, 64), rand(2, 8, 256, 64)
    ref = sdpa_math64(*leaves64(q, k, v))
    out = sdpa_flash(q, k, v, dropout_p=p)
    assert calls["fwd"] == 0  # fa3 has no dropout
    assert torch.isfinite(out).all() and out.dtype == torch.bfloat16
    single = rel_err(out, ref)
    assert single > 0.1  # dropout visibly changed the output
    # Unbiased: E[out] is the attention without dropout; the mean of many draws converges to it.
    draws = torch.stack([sdpa_flash(q, k, v, dropout_p=p).detach().double() for _ in range(32)])
    mean_err = rel_err(draws.mean(0), ref)
    assert mean_err < 0.5 * single and mean_err < 0.3

    # Reproducible from the seed, and the backward (regenerating the mask) runs without fa3.
    torch.manual_seed(3)
    a = sdpa_flash(q, k, v, dropout_p=p)
    grads = torch.autograd.grad(a, (q, k, v), torch.randn_like(a))
    torch.manual_seed(3)
    b = sdpa_flash(q, k, v, dropout_p=p)
    assert torch.equal(a, b)
    assert calls == {"fwd": 0, "bwd": 0}
    assert all(torch.isfinite(g).all() for g in grads)


# ---- fp8 forwards -------------------------------------------------------------------------------
def test_quantized_sdpa_op_runs_fa3_fp8(active, calls):
    torch.manual_seed(4)
    b, h_q, h_kv, s, d = 2, 8, 2, 256, 128
    q8, k8, v8 = (torch.randn(b, h, s, d, device=DEV).to(torch.float8_e4m3fn)
                  for h in (h_q, h_kv, h_kv))
    qd, kd, vd = (0.75 + 0.5 * torch.rand(b, h_kv, device=DEV) for _ in range(3))
    out = torch.ops.aten._scaled_dot_product_flash_attention.quantized(
        q8, k8, v8, qd, kd, vd, 0.0, True)[0]
    assert calls["fwd"] == 1 and out.dtype == torch.bfloat16 and out.shape == (b, h_q, s, d)
    deq = lambda t, ds, g: t.double() * ds.double().repeat_interleave(g, 1)[:, :, None, None]  # noqa: E731
    ref = sdpa_math64(deq(q8, qd, h_q // h_kv), deq(k8, kd, 1), deq(v8, vd, 1), is_causal=True,
                      enable_gqa=True)
    assert rel_err(out, ref) <= 3e-2  # e4m3 operands (P too); vs the quantised inputs' attention


def test_sdpa_with_fp8_tensors_reaches_fa3(active, calls):
    # Possible only because activation sets torch's FA3 flag (the flash dtype gate then takes fp8).
    torch.manual_seed(5)
    q8, k8, v8 = (torch.randn(1, 4, 128, 64, device=DEV).to(torch.float8_e4m3fn) for _ in range(3))
    out = sdpa_flash(q8, k8, v8)
    assert calls["fwd"] == 1 and out.dtype == torch.bfloat16
    assert rel_err(out, sdpa_math64(q8.double(), k8.double(), v8.double())) <= 3e-2


# ---- deactivation -------------------------------------------------------------------------------
def test_deactivate_restores_pytorch_flash(calls):
    sdpa.activate()
    sdpa.deactivate()
    assert current_flash_attention_impl() is None
    assert not torch._C._get_fa3_sdp_enabled()
    torch.manual_seed(6)
    q, k, v = rand(2, 8, 300, 64), rand(2, 8, 300, 64), rand(2, 8, 300, 64)
    out = sdpa_flash(q, k, v, is_causal=True)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert calls == {"fwd": 0, "bwd": 0}  # PyTorch's own flash kernels ran
    q64, k64, v64 = leaves64(q, k, v)
    ref = sdpa_math64(q64, k64, v64, is_causal=True)
    want = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    assert rel_err(out, ref) <= 1e-2
    for g, w in zip(grads, want):
        assert rel_err(g, w) <= 1e-2
