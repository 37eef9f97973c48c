"""fa3's Python functions on a Hopper GPU against float64 PyTorch math: outputs, LSE and gradients
(bf16 relative error <= 1e-2), varlen, the KV cache, determinism, opcheck on CUDA tensors,
torch.compile, CUDA-graph capture, and the operators' argument errors."""

import math

import pytest
import torch

import fa3
from fa3 import _ops
from util import rel_err, skip_unless_hopper

skip_unless_hopper()

DEV = "cuda"


def ref_attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None, sinks=None, chunk=0):
    """float64 attention, BSHD, bottom-right causal/windows as fa3; rows without keys give 0.
    sinks [h]: one more logit per row (no value), as gpt-oss. chunk > 0: a query at position p sees
    only keys j with j // chunk == p // chunk (attention_chunk). Returns (out, lse[b, h, s_q])."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    if chunk > 0:
        visible &= torch.div(i, chunk, rounding_mode="floor") == torch.div(j, chunk, rounding_mode="floor")
    s = s.masked_fill(~visible, -math.inf)
    if sinks is not None:
        column = sinks.double().reshape(1, -1, 1, 1).expand(s.shape[0], -1, sq, 1)
        lse = torch.logsumexp(torch.cat([s, column], dim=-1), dim=-1)
        return torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - lse[..., None]), v), lse
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0)[..., None])
    p = torch.nan_to_num(p, nan=0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def _expect_float64_match(names, leaves, run, reference):
    """run(*leaves) -> (out, lse) by fa3 against reference(*leaves in float64) -> (out, lse): out
    and LSE, then each leaf's gradient for a random dO, within bf16's tolerance."""
    out, lse = run(*leaves)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref, ref_lse = reference(*leaves64)
    assert rel_err(out, ref) <= 1e-2
    assert torch.allclose(lse.double(), ref_lse, atol=1e-3, rtol=1e-3)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.double())
    for name, t, t64 in zip(names, leaves, leaves64):
        assert t.grad is not None and rel_err(t.grad, t64.grad) <= 1e-2, name


def rand(*shape, dtype):
    return torch.randn(*shape, device=DEV, dtype=dtype)


CASES = [
    # b, s_q, s_k, h, h_kv, d, d_v, causal, window, softcap
    (2, 1, 1, 4, 4, 64, 64, False, (-1, -1), 0.0),
    (2, 17, 17, 8, 2, 64, 64, True, (-1, -1), 0.0),
    (1, 1000, 1000, 4, 4, 128, 128, True, (-1, -1), 0.0),
    (2, 300, 1000, 8, 1, 128, 128, False, (-1, -1), 0.0),
    (1, 1000, 300, 4, 2, 128, 128, True, (-1, -1), 0.0),     # rows that see no key
    (1, 513, 513, 4, 4, 64, 64, False, (100, 30), 0.0),
    (1, 257, 257, 4, 4, 128, 128, True, (-1, -1), 30.0),
    (1, 255, 255, 2, 2, 256, 256, True, (-1, -1), 0.0),
    (1, 200, 200, 4, 4, 192, 128, False, (-1, -1), 0.0),
    (1, 4097, 4097, 2, 1, 64, 64, True, (-1, -1), 0.0),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_func_forward_and_backward_match_float64(case, dtype):
    b, sq, sk, h, hkv, d, dv, causal, window, softcap = case
    torch.manual_seed(sq * 31 + d)
    q = rand(b, sq, h, d, dtype=dtype).requires_grad_()
    k = rand(b, sk, hkv, d, dtype=dtype).requires_grad_()
    v = rand(b, sk, hkv, dv, dtype=dtype).requires_grad_()
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                   return_attn_probs=True)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = ref_attention(q64, k64, v64, causal, window, softcap)
    assert rel_err(out, ref) <= 1e-2
    finite = torch.isfinite(ref_lse)
    assert torch.allclose(lse[finite].double(), ref_lse[finite], atol=1e-3, rtol=1e-3)
    assert torch.isneginf(lse[~finite]).all()  # rows that see no key: LSE -inf (and O 0)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.double())
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert rel_err(got, want) <= 1e-2, name


def test_varlen_matches_each_sequence():
    torch.manual_seed(3)
    lens_q = [0, 1, 17, 1000, 250, 3]
    lens_k = [5, 1, 40, 1000, 700, 0]
    h, hkv, d = 8, 2, 128
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=DEV)
    q = rand(sum(lens_q), h, d, dtype=torch.bfloat16).requires_grad_()
    k = rand(sum(lens_k), hkv, d, dtype=torch.bfloat16).requires_grad_()
    v = rand(sum(lens_k), hkv, d, dtype=torch.bfloat16).requires_grad_()
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                          return_attn_probs=True)
    assert lse.shape == (h, sum(lens_q))
    dout = torch.randn_like(out)
    out.backward(dout)
    refs = []
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    for i in range(len(lens_q)):
        a, e = cu_q[i].item(), cu_q[i + 1].item()
        c, f = cu_k[i].item(), cu_k[i + 1].item()
        if e == a:
            continue
        r, _ = ref_attention(q64[None, a:e], k64[None, c:f], v64[None, c:f], causal=True)
        refs.append((a, e, r[0]))
    ref = torch.zeros_like(out, dtype=torch.float64)
    for a, e, r in refs:
        ref[a:e] = r
    assert rel_err(out, ref) <= 1e-2
    ref.backward(dout.double())
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert rel_err(got, want) <= 1e-2, name


def test_qkvpacked_gradients():
    torch.manual_seed(4)
    qkv = rand(2, 100, 3, 4, 64, dtype=torch.bfloat16).requires_grad_()
    out = fa3.flash_attn_qkvpacked_func(qkv, causal=True)
    q64 = qkv.detach().double().requires_grad_()
    ref, _ = ref_attention(q64[:, :, 0], q64[:, :, 1], q64[:, :, 2], causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.double())
    assert rel_err(out, ref) <= 1e-2 and rel_err(qkv.grad, q64.grad) <= 1e-2


def _cache_of(k_full, v_full, page):
    """(page_table, k_cache, v_cache) holding k_full / v_full [b, len, h, d]: copies, or (page > 0)
    pages of `page` rows in a shuffled order behind an int32 page table."""
    if page == 0:
        return None, k_full.clone(), v_full.clone()
    b, cache_len, hkv, d = k_full.shape
    npages = b * cache_len // page
    page_table = torch.randperm(npages, device=DEV).reshape(b, -1).to(torch.int32)
    k_cache = torch.empty(npages, page, hkv, d, device=DEV, dtype=k_full.dtype)
    v_cache = torch.empty_like(k_cache)
    k_cache[page_table.long()] = k_full.reshape(b, -1, page, hkv, d)
    v_cache[page_table.long()] = v_full.reshape(b, -1, page, hkv, d)
    return page_table, k_cache, v_cache


def _logical(cache, page_table):
    """A cache as [b, len, h, d] rows (through its page table when paged)."""
    return cache if page_table is None else cache[page_table.long()].flatten(1, 2)


@pytest.mark.parametrize("page,interleaved,s_new", [(0, False, 1), (64, False, 1), (0, True, 3), (64, True, 2),
                                                    (1, False, 1), (8, True, 2)])
def test_kvcache_append_and_rotary(page, interleaved, s_new):
    """The append and rotary in fa3's call (fa3::fwd_kvcache): the cache bit for bit as PyTorch's
    rotary makes it (fp32 products, one rounding), the rest of the cache untouched, the attention of
    the rotated queries vs float64. Pages of 1 and 8 rows are gathered row by row by the kernel."""
    torch.manual_seed(5)
    b, h, hkv, d, cache_len = 3, 8, 2, 128, 512
    lens = torch.tensor([0, 100, 400], dtype=torch.int32, device=DEV)
    k_full, v_full = rand(b, cache_len, hkv, d, dtype=torch.bfloat16), rand(b, cache_len, hkv, d, dtype=torch.bfloat16)
    k_new, v_new = rand(b, s_new, hkv, d, dtype=torch.bfloat16), rand(b, s_new, hkv, d, dtype=torch.bfloat16)
    q = rand(b, s_new, h, d, dtype=torch.bfloat16)
    theta = torch.rand(cache_len, d // 4, device=DEV) * 6
    cos, sin = theta.cos().to(torch.bfloat16), theta.sin().to(torch.bfloat16)  # in q's dtype, as FA3 asks
    page_table, k_cache, v_cache = _cache_of(k_full, v_full, page)
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                      cache_seqlens=lens, page_table=page_table, causal=True,
                                      rotary_interleaved=interleaved)
    k_ref, v_ref = k_full.clone(), v_full.clone()
    from fa3._kvcache import rotary as _rotary
    for i in range(b):
        n = int(lens[i])
        k_ref[i, n:n + s_new] = _rotary(k_new[i:i + 1], cos[None, n:n + s_new], sin[None, n:n + s_new], interleaved)[0]
        v_ref[i, n:n + s_new] = v_new[i]
        q_i = _rotary(q[i:i + 1], cos[None, n:n + s_new], sin[None, n:n + s_new], interleaved)
        r, _ = ref_attention(q_i, k_ref[i:i + 1, :n + s_new], v_ref[i:i + 1, :n + s_new], causal=True)
        assert rel_err(out[i:i + 1], r) <= 1e-2
    assert torch.equal(_logical(k_cache, page_table), k_ref) and torch.equal(_logical(v_cache, page_table), v_ref)


@pytest.mark.parametrize("paged,packed_new", [(False, True), (True, True), (False, False)])
def test_kvcache_append_with_packed_queries(paged, packed_new):
    """Speculative decoding with a different number of draft tokens per sequence: packed queries
    (cu_seqlens_q) and packed new keys (cu_seqlens_k_new, or dense [b, s_new] ones), appended and
    rotated in fa3's call; the cache bit for bit, each sequence's attention vs float64."""
    torch.manual_seed(15)
    h, hkv, d, cache_len, page = 8, 2, 128, 384, 64
    lens = torch.tensor([0, 100, 300, 7], dtype=torch.int32, device=DEV)
    n_new = [3, 1, 4, 2] if packed_new else [2, 2, 2, 2]
    b = len(n_new)
    cu = torch.tensor([0] + torch.tensor(n_new).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    total = int(cu[-1])
    k_full, v_full = rand(b, cache_len, hkv, d, dtype=torch.bfloat16), rand(b, cache_len, hkv, d, dtype=torch.bfloat16)
    k_new, v_new = rand(total, hkv, d, dtype=torch.bfloat16), rand(total, hkv, d, dtype=torch.bfloat16)
    q = rand(total, h, d, dtype=torch.bfloat16)  # a query per new token
    theta = torch.rand(cache_len, d // 4, device=DEV) * 6
    cos, sin = theta.cos().to(torch.bfloat16), theta.sin().to(torch.bfloat16)
    page_table, k_cache, v_cache = _cache_of(k_full, v_full, page if paged else 0)
    kn, vn = (k_new, v_new) if packed_new else (k_new.reshape(b, 2, hkv, d), v_new.reshape(b, 2, hkv, d))
    out, lse = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                           cache_seqlens=lens, page_table=page_table, causal=True,
                                           cu_seqlens_q=cu, max_seqlen_q=max(n_new),
                                           cu_seqlens_k_new=cu if packed_new else None, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (h, total)
    from fa3._kvcache import rotary as _rotary
    k_ref, v_ref = k_full.clone(), v_full.clone()
    for i in range(b):
        n, a, e = int(lens[i]), int(cu[i]), int(cu[i + 1])
        c, s = cos[None, n:n + e - a], sin[None, n:n + e - a]
        k_ref[i, n:n + e - a] = _rotary(k_new[None, a:e], c, s, True)[0]
        v_ref[i, n:n + e - a] = v_new[a:e]
        q_i = _rotary(q[None, a:e], c, s, True)
        r, r_lse = ref_attention(q_i, k_ref[i:i + 1, :n + e - a], v_ref[i:i + 1, :n + e - a], causal=True)
        assert rel_err(out[a:e], r[0]) <= 1e-2
        assert torch.allclose(lse[:, a:e].double(), r_lse[0], atol=1e-3, rtol=1e-3)
    assert torch.equal(_logical(k_cache, page_table), k_ref) and torch.equal(_logical(v_cache, page_table), v_ref)


@pytest.mark.parametrize("s_new", [1, 4])
def test_kvcache_left_padding_and_rotary_positions(s_new):
    """cache_leftpad (FlashAttention-3's): each sequence attends to its cache rows from its padding
    on, new keys appended at cache_seqlens as without it; rotary_seqlens: the rotary positions of the
    new keys and queries start there instead. The cache bit for bit, the attention vs float64; also
    left padding alone (no new keys) and with split-KV."""
    torch.manual_seed(25)
    b, h, hkv, d, cache_len = 3, 8, 2, 128, 512
    lens = torch.tensor([5, 100, 400], dtype=torch.int32, device=DEV)
    pad = torch.tensor([5, 30, 257], dtype=torch.int32, device=DEV)  # sequence 0: only its new keys
    rot = torch.tensor([0, 7, 300], dtype=torch.int32, device=DEV)
    k_full, v_full = rand(b, cache_len, hkv, d, dtype=torch.bfloat16), rand(b, cache_len, hkv, d, dtype=torch.bfloat16)
    k_new, v_new = rand(b, s_new, hkv, d, dtype=torch.bfloat16), rand(b, s_new, hkv, d, dtype=torch.bfloat16)
    q = rand(b, s_new, h, d, dtype=torch.bfloat16)
    theta = torch.rand(cache_len, d // 4, device=DEV) * 6
    cos, sin = theta.cos().to(torch.bfloat16), theta.sin().to(torch.bfloat16)
    k_cache, v_cache = k_full.clone(), v_full.clone()
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                      cache_seqlens=lens, cache_leftpad=pad, rotary_seqlens=rot, causal=True)
    from fa3._kvcache import rotary as _rotary
    k_ref, v_ref = k_full.clone(), v_full.clone()
    for i in range(b):
        n, p, r = int(lens[i]), int(pad[i]), int(rot[i])
        c, s = cos[None, r:r + s_new], sin[None, r:r + s_new]
        k_ref[i, n:n + s_new] = _rotary(k_new[i:i + 1], c, s, True)[0]
        v_ref[i, n:n + s_new] = v_new[i]
        q_i = _rotary(q[i:i + 1], c, s, True)
        want, _ = ref_attention(q_i, k_ref[i:i + 1, p:n + s_new], v_ref[i:i + 1, p:n + s_new], causal=True)
        assert rel_err(out[i:i + 1], want) <= 1e-2
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    # Left padding alone: the keys of cache_seqlens from the padding on, split or not.
    for splits in (1, 4):
        out, lse = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, cache_leftpad=pad,
                                               num_splits=splits, return_softmax_lse=True)
        for i in range(b):
            n, p = int(lens[i]), int(pad[i])
            want, want_lse = ref_attention(q[i:i + 1], k_cache[i:i + 1, p:n], v_cache[i:i + 1, p:n])
            assert rel_err(out[i:i + 1], want) <= 1e-2
            assert torch.allclose(lse[i:i + 1].double(), want_lse, atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="cache_leftpad"):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, cache_leftpad=pad,
                                    cache_batch_idx=torch.arange(b, dtype=torch.int32, device=DEV))


def test_kvcache_left_padding_e4m3():
    """cache_leftpad with an e4m3 cache and per-(batch, kv head) descales: the new keys appended by
    PyTorch operations at cache_seqlens, then fa3's FP8 kernel on the caches viewed in place as
    packed rows from each sequence's padding on; against float64 on the de-quantized values."""
    torch.manual_seed(26)
    b, h, hkv, d, cache_len, s_new = 3, 16, 2, 128, 512, 2
    e4m3 = torch.float8_e4m3fn
    lens = torch.tensor([5, 100, 400], dtype=torch.int32, device=DEV)
    pad = torch.tensor([5, 30, 257], dtype=torch.int32, device=DEV)
    k_full, v_full = (rand(b, cache_len, hkv, d, dtype=torch.bfloat16).to(e4m3) for _ in range(2))
    k_new, v_new = (rand(b, s_new, hkv, d, dtype=torch.bfloat16).to(e4m3) for _ in range(2))
    q = rand(b, s_new, h, d, dtype=torch.bfloat16).to(e4m3)
    qd, kd, vd = (torch.rand(b, hkv, device=DEV) + 0.5 for _ in range(3))
    k_cache, v_cache = k_full.clone(), v_full.clone()
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, cache_leftpad=pad,
                                      causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16
    want = []
    for i in range(b):
        n, p = int(lens[i]), int(pad[i])
        assert torch.equal(k_cache[i, n:n + s_new].view(torch.uint8), k_new[i].view(torch.uint8))
        keys = torch.cat([k_full[i:i + 1, p:n], k_new[i:i + 1]], dim=1).float() * kd[i][None, None, :, None]
        vals = torch.cat([v_full[i:i + 1, p:n], v_new[i:i + 1]], dim=1).float() * vd[i][None, None, :, None]
        qi = q[i:i + 1].float() * qd[i].repeat_interleave(h // hkv)[None, None, :, None]
        want.append(ref_attention(qi, keys, vals, causal=True)[0])
    # P rounded to e4m3 on the FP8 kernel (as test_fp8_forward_error_is_stated), over all 96 rows:
    # a row's own error does not average (fp8_tolerance in the C++ tests)
    assert rel_err(out, torch.cat(want)) <= 3e-2


@pytest.mark.parametrize("page", [1, 24, 16])
def test_kvcache_e4m3_pages(page):
    """An e4m3 paged cache (SGLang's pages of 1, odd sizes gathered row by row on the FP8 kernel,
    16 by TMA boxes) with new keys appended and per-(batch, kv head) descales; against float64 on
    the de-quantized values, and the same call on a contiguous copy of the cache."""
    torch.manual_seed(28 + page)
    b, h, hkv, d, length, s_new = 3, 8, 2, 128, 480, 2
    e4m3 = torch.float8_e4m3fn
    lens = torch.tensor([0, 77, 400], dtype=torch.int32, device=DEV)
    k_full, v_full = (rand(b, length, hkv, d, dtype=torch.bfloat16).to(e4m3) for _ in range(2))
    k_new, v_new = (rand(b, s_new, hkv, d, dtype=torch.bfloat16).to(e4m3) for _ in range(2))
    q = rand(b, s_new, h, d, dtype=torch.bfloat16).to(e4m3)
    qd, kd, vd = (torch.rand(b, hkv, device=DEV) + 0.5 for _ in range(3))
    n = b * length // page
    perm = torch.randperm(n, device=DEV)
    k_cache, v_cache = (torch.empty(n, page, hkv, d, dtype=e4m3, device=DEV) for _ in range(2))
    k_cache.view(torch.uint8)[perm] = k_full.view(torch.uint8).reshape(n, page, hkv, d)
    v_cache.view(torch.uint8)[perm] = v_full.view(torch.uint8).reshape(n, page, hkv, d)
    table = perm.to(torch.int32).reshape(b, length // page)
    kw = dict(cache_seqlens=lens, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, page_table=table, **kw)
    k_after, v_after = (t[perm].reshape(b, length, hkv, d) for t in (k_cache, v_cache))
    k_dense, v_dense = k_full.clone(), v_full.clone()
    dense = fa3.flash_attn_with_kvcache(q, k_dense, v_dense, k_new, v_new, **kw)
    assert torch.equal(k_after.view(torch.uint8), k_dense.view(torch.uint8))
    assert torch.equal(v_after.view(torch.uint8), v_dense.view(torch.uint8))
    want = []
    for i in range(b):
        m = int(lens[i]) + s_new
        keys = k_after[i:i + 1, :m].float() * kd[i][None, None, :, None]
        vals = v_after[i:i + 1, :m].float() * vd[i][None, None, :, None]
        qi = q[i:i + 1].float() * qd[i].repeat_interleave(h // hkv)[None, None, :, None]
        want.append(ref_attention(qi, keys, vals, causal=True)[0])
    # P rounded to e4m3 (as test_kvcache_left_padding_e4m3); the paged and contiguous reads agree
    # to the order of the key blocks' sums (the same tile and blocks: bit-equal in practice)
    assert rel_err(out, torch.cat(want)) <= 3e-2
    assert rel_err(out, dense) <= 1e-3


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("s_q", [1, 4])
def test_kvcache_attention_chunk(paged, s_q):
    """flash_attn_with_kvcache with attention_chunk (Llama 4's chunked layers): new keys appended,
    then the cache read in place as one grouped call (contiguous: packed rows; paged: a page-table
    row per group), queries across a chunk boundary for s_q = 4; against float64 per sequence."""
    torch.manual_seed(27 + s_q)
    b, h, hkv, d, length, chunk, page = 3, 8, 2, 128, 2048, 512, 256
    lens = torch.tensor([1, 510, 1500], dtype=torch.int32, device=DEV)  # 510 + 4: across 512
    k_full, v_full = (rand(b, length, hkv, d, dtype=torch.bfloat16) for _ in range(2))
    k_new, v_new = (rand(b, s_q, hkv, d, dtype=torch.bfloat16) for _ in range(2))
    q = rand(b, s_q, h, d, dtype=torch.bfloat16)
    kw = dict(cache_seqlens=lens, causal=True, attention_chunk=chunk, return_softmax_lse=True)
    if paged:
        n = b * length // page
        perm = torch.randperm(n, device=DEV)
        k_cache, v_cache = (torch.empty(n, page, hkv, d, dtype=torch.bfloat16, device=DEV) for _ in range(2))
        k_cache[perm], v_cache[perm] = k_full.reshape(n, page, hkv, d), v_full.reshape(n, page, hkv, d)
        table = perm.to(torch.int32).reshape(b, length // page)
        out, lse = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, page_table=table, **kw)
        k_after, v_after = (t[perm].reshape(b, length, hkv, d) for t in (k_cache, v_cache))
    else:
        k_after, v_after = k_full.clone(), v_full.clone()
        out, lse = fa3.flash_attn_with_kvcache(q, k_after, v_after, k_new, v_new, **kw)
    for i in range(b):
        n = int(lens[i]) + s_q
        assert torch.equal(k_after[i, n - s_q:n], k_new[i]) and torch.equal(v_after[i, n - s_q:n], v_new[i])
        want, want_lse = ref_attention(q[i:i + 1], k_after[i:i + 1, :n], v_after[i:i + 1, :n], causal=True, chunk=chunk)
        assert rel_err(out[i:i + 1], want) <= 1e-2
        assert torch.allclose(lse[i:i + 1].double(), want_lse, atol=1e-3, rtol=1e-3)


def test_fp8_forward_error_is_stated():
    torch.manual_seed(6)
    q, k, v = (rand(1, 256, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    one = torch.ones(1, 4, device=DEV)
    out = fa3.flash_attn_func(q8, k8, v8, q_descale=one, k_descale=one, v_descale=one)
    ref, _ = ref_attention(q8.float(), k8.float(), v8.float())
    assert out.dtype == torch.bfloat16
    # e4m3 operands (P too, on the Hopper kernel): the error vs the quantised inputs' attention,
    # 2.43e-2 measured on the H200 (2026-12-01)
    assert rel_err(out, ref) <= 3e-2


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_softcap_with_descales(causal):
    """e4m3 with softcap on the Hopper kernel: the descales (a different one per (batch, kv head))
    go inside the tanh; against float64 attention on the de-quantized inputs."""
    torch.manual_seed(9)
    q, k, v = (rand(2, 300, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    k8, v8 = k8[:, :, :2], v8[:, :, :2]  # GQA 2:1
    qd, kd, vd = (torch.rand(2, 2, device=DEV) + 0.5 for _ in range(3))
    out = fa3.flash_attn_func(q8, k8, v8, causal=causal, softcap=2.0, q_descale=qd, k_descale=kd, v_descale=vd)
    deq = [t.float() * d[:, None, :, None] for t, d in ((q8, qd.repeat_interleave(2, dim=1)), (k8, kd), (v8, vd))]
    ref, _ = ref_attention(*deq, causal=causal, softcap=2.0)
    assert out.dtype == torch.bfloat16
    # as test_fp8_forward_error_is_stated: P rounded to e4m3 on the Hopper kernel
    assert rel_err(out, ref) <= 3e-2


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_softcap_block_descales_match_per_head(d, causal):
    """e4m3 softcap with block descales (each row's Q factor and each key block's K factor inside
    the tanh) against the per-head softcap kernel on inputs pre-scaled by the same power-of-two
    factors (exact in e4m3: no input is subnormal or near the top): the tanh sees the same
    products, so O agrees bit for bit, but for a few elements the two softmax variants round
    differently (<= 52 of 2M, within a bf16 ulp, H100 2026-12-06)."""
    torch.manual_seed(d + causal)
    b, sq, sk, h, hkv, qb, kb = 2, 300, 517, 4, 2, 64, 128

    def e4m3(*shape):  # magnitudes in [1/8, 4]: halving and doubling stay exact
        x = torch.randn(*shape, device=DEV)
        return torch.where(x.abs() < 0.125, torch.full_like(x, 0.125), x).clamp(-4, 4).to(torch.float8_e4m3fn)

    q8, k8, v8 = e4m3(b, sq, h, d), e4m3(b, sk, hkv, d), e4m3(b, sk, hkv, d)
    pick = lambda *shape: torch.tensor([0.5, 1.0, 2.0], device=DEV)[torch.randint(0, 3, shape, device=DEV)]
    qf, kf = pick(b, h, (sq + qb - 1) // qb), pick(b, hkv, (sk + kb - 1) // kb)
    vf = torch.ones(b, hkv, (sk + kb - 1) // kb, device=DEV)  # (V's factors shift P: not bitwise)
    per_row = lambda f, block, s: f.repeat_interleave(block, dim=2)[:, :, :s].transpose(1, 2)[..., None]
    q8s = (q8.float() * per_row(qf, qb, sq)).to(torch.float8_e4m3fn)
    k8s = (k8.float() * per_row(kf, kb, sk)).to(torch.float8_e4m3fn)
    assert torch.equal(q8s.float(), q8.float() * per_row(qf, qb, sq))
    ds = [torch.rand(b, hkv, device=DEV) + 0.5 for _ in range(3)]
    for cap in (0.5, 5.0, 30.0):
        blk = fa3.flash_attn_func(q8, k8, v8, causal=causal, softcap=cap, q_descale=ds[0], k_descale=ds[1],
                                  v_descale=ds[2], q_block_descale=qf, k_block_descale=kf, v_block_descale=vf,
                                  q_block_size=qb, kv_block_size=kb)
        head = fa3.flash_attn_func(q8s, k8s, v8, causal=causal, softcap=cap, q_descale=ds[0], k_descale=ds[1],
                                   v_descale=ds[2])
        diff = (blk.float() - head.float()).abs()
        assert (diff > 0).sum().item() <= blk.numel() // 10000, cap
        assert (diff <= head.float().abs() * 2**-7 + 1e-6).all(), cap


@pytest.mark.parametrize("causal", [False, True])
def test_negative_softmax_scale(causal):
    """A negative softmax_scale runs on the Hopper kernels as |scale| on -q (a copy in the
    workspace): against float64, and bit for bit the positive scale on -q (negation is exact); the
    backward's dq is the gradient of q, not of the copy (deterministic mode: bitwise)."""
    torch.manual_seed(12 + causal)
    q = rand(2, 333, 8, 128, dtype=torch.bfloat16).requires_grad_()
    k = rand(2, 517, 2, 128, dtype=torch.bfloat16).requires_grad_()
    v = rand(2, 517, 2, 128, dtype=torch.bfloat16).requires_grad_()
    out = fa3.flash_attn_func(q, k, v, softmax_scale=-0.1, causal=causal, deterministic=True)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = ref_attention(q64, k64, v64, causal, scale=-0.1)
    assert rel_err(out, ref) <= 1e-2
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.double())
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert rel_err(got, want) <= 1e-2, name
    qn = (-q.detach()).requires_grad_()
    kp, vp = (t.detach().requires_grad_() for t in (k, v))
    pos = fa3.flash_attn_func(qn, kp, vp, softmax_scale=0.1, causal=causal, deterministic=True)
    assert torch.equal(out, pos)
    pos.backward(dout)
    assert torch.equal(q.grad, -qn.grad) and torch.equal(k.grad, kp.grad) and torch.equal(v.grad, vp.grad)


def test_fp8_quantize_and_block_descales():
    """fa3.quantize_fp8 (blocks of 128 tokens; q and k rotated with one seed) into flash_attn_func's
    block descales, against bf16 attention on the unquantized inputs; the descales de-quantize to
    the (rotated) inputs."""
    torch.manual_seed(8)
    q, k, v = (rand(2, 300, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    (q8, qs), (k8, ks) = (fa3.quantize_fp8(t, 128, hadamard=True, seed=11) for t in (q, k))
    v8, vs = fa3.quantize_fp8(v, 128)
    assert q8.dtype == torch.float8_e4m3fn and qs.shape == (2, 4, 3) and qs.dtype == torch.float32
    deq = (v8.float() * vs.repeat_interleave(128, dim=2)[:, :, :300].transpose(1, 2)[..., None])
    assert rel_err(deq, v.float()) <= 4e-2
    out = fa3.flash_attn_func(q8, k8, v8, q_block_descale=qs, k_block_descale=ks, v_block_descale=vs)
    ref, _ = ref_attention(q.float(), k.float(), v.float())
    assert out.dtype == torch.bfloat16
    # e4m3 rounding of q, k, v and P: 5.3e-2 measured on such inputs (FwdGpu.Fp8QuantizedPipeline)
    assert rel_err(out, ref) <= 8e-2
    with pytest.raises(RuntimeError, match="k_block_descale"):
        fa3.flash_attn_func(q8, k8, v8, k_block_descale=ks[:, :1])
    with pytest.raises(RuntimeError, match="block_size"):
        fa3.quantize_fp8(q, 48)


def test_deterministic_backward_is_bitwise_reproducible():
    torch.manual_seed(7)
    q = rand(2, 1000, 8, 128, dtype=torch.bfloat16).requires_grad_()
    k = rand(2, 1000, 2, 128, dtype=torch.bfloat16).requires_grad_()
    v = rand(2, 1000, 2, 128, dtype=torch.bfloat16).requires_grad_()
    dout = torch.randn(2, 1000, 8, 128, device=DEV, dtype=torch.bfloat16)
    first = None
    for _ in range(20):
        q.grad = k.grad = v.grad = None
        fa3.flash_attn_func(q, k, v, causal=True, deterministic=True).backward(dout)
        grads = [t.grad.clone() for t in (q, k, v)]
        if first is None:
            first = grads
        else:
            assert all(torch.equal(a, b) for a, b in zip(first, grads))


def test_opcheck_on_cuda():
    torch.manual_seed(8)
    q = rand(2, 70, 4, 64, dtype=torch.bfloat16).requires_grad_()
    k = rand(2, 90, 2, 64, dtype=torch.bfloat16).requires_grad_()
    v = rand(2, 90, 2, 64, dtype=torch.bfloat16).requires_grad_()
    r = torch.library.opcheck(torch.ops.fa3.fwd.default, (q, k, v), dict(causal=True, softmax_scale=0.125))
    assert all(x == "SUCCESS" for x in r.values()), r
    out, lse = _ops.fwd(q.detach(), k.detach(), v.detach(), causal=True, softmax_scale=0.125)
    r = torch.library.opcheck(torch.ops.fa3.bwd.default,
                              (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse),
                              dict(causal=True, softmax_scale=0.125))
    assert all(x == "SUCCESS" for x in r.values()), r


def test_compile_fullgraph_matches_eager():
    torch.manual_seed(9)

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(128, 128, dtype=torch.bfloat16, device=DEV)

        def forward(self, q, k, v):
            return self.proj(fa3.flash_attn_func(q, k, v, causal=True))

    m = Attn()
    cm = torch.compile(m, fullgraph=True)
    q, k, v = (rand(2, 300, 4, 128, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    a = m(q, k, v)
    ga = torch.autograd.grad(a.sum(), (q, k, v))
    b = cm(q, k, v)
    gb = torch.autograd.grad(b.sum(), (q, k, v))
    assert rel_err(b, a) <= 1e-3
    assert all(rel_err(x, y) <= 1e-3 for x, y in zip(gb, ga))


def test_cuda_graph_capture_of_forward_and_backward():
    torch.manual_seed(10)
    q, k, v = (rand(2, 500, 4, 128, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = torch.randn(2, 500, 4, 128, device=DEV, dtype=torch.bfloat16)

    def step():
        out = fa3.flash_attn_func(q, k, v, causal=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = step()
    for t in (q, k, v):
        t.data.copy_(torch.randn_like(t))
    g.replay()
    torch.cuda.synchronize()
    eager = step()
    assert all(torch.equal(a, b) for a, b in zip(captured[:1], eager[:1]))
    assert all(rel_err(a, b) <= 1e-3 for a, b in zip(captured, eager))


@pytest.mark.parametrize("make,match", [
    (lambda x: (x, x.float(), x), "k: expected the dtype of q"),
    (lambda x: (x, x[0], x), "k: expected 4 dims"),
    (lambda x: (x, x.cpu(), x), "k: expected a CUDA tensor"),
    (lambda x: (x.float(), x.float(), x.float()), "q: expected float16, bfloat16"),
    (lambda x: (x, x[:1], x[:1]), "k: expected batch"),
    (lambda x: (x, x[..., :32], x[..., :32]), "k: expected head_dim 64"),
])
def test_operator_errors_name_the_argument(make, match):
    x = rand(2, 64, 4, 64, dtype=torch.bfloat16)
    q, k, v = make(x)
    with pytest.raises(RuntimeError, match=match):
        _ops.fwd(q, k, v)


def test_sm_margin_leaves_the_outputs_unchanged():
    """sm_margin changes which SMs run the forward's tiles, not what a tile computes (one CTA's
    work whatever the grid): outputs bitwise equal with any margin, a negative one refused by name."""
    q, k, v = (rand(2, 1000, 8, 128, dtype=torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        ref = fa3.flash_attn_func(q, k, v, causal=causal)
        for margin in (1, 100, 10**6):
            assert torch.equal(fa3.flash_attn_func(q, k, v, causal=causal, sm_margin=margin), ref)
    with pytest.raises(RuntimeError, match="sm_margin must be >= 0"):
        fa3.flash_attn_func(q, k, v, sm_margin=-1)


def test_sizes_past_int32_are_refused_by_name():
    # fa3's sizes are int32: a Python int past it is refused, not wrapped (2**32 + 64 would wrap to 64).
    q = rand(2, 64, 4, 64, dtype=torch.bfloat16).reshape(128, 4, 64)
    cu = torch.tensor([0, 64, 128], dtype=torch.int32, device=DEV)
    with pytest.raises(RuntimeError, match="max_seqlen_q: 4294967360 does not fit"):
        _ops.fwd(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2**32 + 64, max_seqlen_k=64)
    with pytest.raises(RuntimeError, match="num_splits"):
        _ops.fwd(q.reshape(2, 64, 4, 64), q.reshape(2, 64, 4, 64), q.reshape(2, 64, 4, 64), num_splits=2**31)


def test_paged_cache_too_short_for_max_seqlen_k_is_refused():
    q = rand(2, 1, 8, 64, dtype=torch.bfloat16)
    k_pages = rand(8, 16, 2, 64, dtype=torch.bfloat16)
    table = torch.arange(8, dtype=torch.int32, device=DEV).reshape(2, 4)  # 4 pages x 16 = 64 keys each
    out, _ = _ops.fwd(q, k_pages, k_pages, page_table=table, max_seqlen_k=64)
    assert torch.isfinite(out).all()
    with pytest.raises(RuntimeError, match="max_seqlen_k: 65 keys exceed page_table"):
        _ops.fwd(q, k_pages, k_pages, page_table=table, max_seqlen_k=65)


def test_backward_rejects_a_wrong_lse():
    q = rand(2, 64, 4, 64, dtype=torch.bfloat16)
    out, lse = _ops.fwd(q, q, q)
    with pytest.raises(RuntimeError, match="softmax_lse"):
        _ops.bwd(out, q, q, q, out, lse.transpose(1, 2).contiguous())
    with pytest.raises(RuntimeError, match="dout"):
        _ops.bwd(out.float(), q, q, q, out, lse)


def test_any_host_thread_may_call():
    import threading
    q = rand(2, 200, 4, 64, dtype=torch.bfloat16)
    result = {}

    def work():
        try:
            result["out"] = fa3.flash_attn_func(q, q, q, causal=True)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (reported below)
            result["error"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in result, result.get("error")
    ref, _ = ref_attention(q, q, q, causal=True)
    assert rel_err(result["out"], ref) <= 1e-2


def test_compile_varlen_with_gradients():
    torch.manual_seed(11)
    lens = [5, 300, 77]
    cu = torch.tensor([0, 5, 305, 382], dtype=torch.int32, device=DEV)
    q, k, v = (rand(sum(lens), 4, 64, dtype=torch.bfloat16).requires_grad_() for _ in range(3))

    def f(q, k, v):
        return fa3.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)

    a = f(q, k, v)
    ga = torch.autograd.grad(a.float().square().sum(), (q, k, v))
    b = torch.compile(f, fullgraph=True)(q, k, v)
    gb = torch.autograd.grad(b.float().square().sum(), (q, k, v))
    assert rel_err(b, a) <= 1e-3
    assert all(rel_err(x, y) <= 1e-3 for x, y in zip(gb, ga))


def test_head_dim_strided_inputs_are_copied_not_refused():
    torch.manual_seed(12)
    # [b, s, d, h] memory viewed as [b, s, h, d]: the head dim has stride h.
    q, k, v = (torch.randn(2, 70, 64, 4, device=DEV, dtype=torch.bfloat16).transpose(-1, -2).requires_grad_()
               for _ in range(3))
    assert q.stride(-1) != 1
    out = fa3.flash_attn_func(q, k, v, causal=True)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = ref_attention(q64, k64, v64, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.double())
    assert rel_err(out, ref) <= 1e-2
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert rel_err(got, want) <= 1e-2
    with pytest.raises(ValueError, match="softmax_scale"):
        fa3.flash_attn_func(q, k, v, softmax_scale=0.0)


SINK_CASES = [
    # b, s_q, s_k, h, h_kv, d, causal
    (2, 17, 17, 8, 2, 64, True),
    (1, 1000, 300, 4, 2, 128, True),     # rows that see no key: O = 0, LSE = the sink
    (2, 300, 1000, 4, 1, 256, False),
]


@pytest.mark.parametrize("case", SINK_CASES)
def test_sinks_forward_and_backward_match_float64(case):
    """gpt-oss's learnable sinks (a bf16 parameter here): out, LSE and every gradient, the sinks' too."""
    b, sq, sk, h, hkv, d, causal = case
    torch.manual_seed(sq + d)
    q = rand(b, sq, h, d, dtype=torch.bfloat16).requires_grad_()
    k = rand(b, sk, hkv, d, dtype=torch.bfloat16).requires_grad_()
    v = rand(b, sk, hkv, d, dtype=torch.bfloat16).requires_grad_()
    sinks = torch.linspace(-2.0, 6.0, h, device=DEV).to(torch.bfloat16).requires_grad_()
    _expect_float64_match(
        ("dq", "dk", "dv", "dsinks"), (q, k, v, sinks),
        lambda q, k, v, s: fa3.flash_attn_func(q, k, v, causal=causal, learnable_sink=s, return_attn_probs=True),
        lambda q, k, v, s: ref_attention(q, k, v, causal, sinks=s))


@pytest.mark.parametrize("causal,with_sinks,use_out", [(False, False, True), (True, True, True), (True, False, False)])
def test_lse_gradient_matches_float64(causal, with_sinks, use_out):
    """softmax_lse is differentiable (FlashAttention's is not): a loss through out and LSE (merging
    partial attentions, a z-loss), or LSE alone, gets every gradient as float64 autograd does."""
    b, sq, sk, h, hkv, d = 2, 300, 400, 8, 2, 128
    torch.manual_seed(21 + causal)
    q = rand(b, sq, h, d, dtype=torch.bfloat16).requires_grad_()
    k = rand(b, sk, hkv, d, dtype=torch.bfloat16).requires_grad_()
    v = rand(b, sk, hkv, d, dtype=torch.bfloat16).requires_grad_()
    sinks = torch.randn(h, device=DEV).requires_grad_() if with_sinks else None
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, learnable_sink=sinks, return_attn_probs=True)
    assert lse.requires_grad
    leaves = [q, k, v] + ([sinks] if with_sinks else [])
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref, ref_lse = ref_attention(*leaves64[:3], causal, sinks=leaves64[3] if with_sinks else None)
    dout, dl = torch.randn_like(out), torch.randn_like(lse)
    loss = (lse * dl).sum() + ((out.float() * dout).sum() if use_out else 0)
    loss.backward()
    loss64 = (ref_lse * dl.double()).sum() + ((ref * dout.double()).sum() if use_out else 0)
    loss64.backward()
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), (t.grad for t in leaves), (t.grad for t in leaves64)):
        if name == "dv" and not use_out:
            assert got is None or got.abs().max() == 0, name  # LSE does not depend on V
            continue
        assert got is not None and rel_err(got, want) <= 1e-2, name


@pytest.mark.parametrize("s_q,s_k,chunk,causal", [(1000, 1000, 256, True), (300, 4097, 1024, True),
                                                  (700, 700, 160, False)])
def test_attention_chunk_forward_and_backward_match_float64(s_q, s_k, chunk, causal):
    """attention_chunk (Llama 4's local layers) as one varlen call: out, LSE and every gradient
    (FlashAttention-3 has no backward for it) against float64."""
    torch.manual_seed(s_q + chunk)
    b, h, hkv, d = 2, 8, 2, 128
    q = rand(b, s_q, h, d, dtype=torch.bfloat16).requires_grad_()
    k = rand(b, s_k, hkv, d, dtype=torch.bfloat16).requires_grad_()
    v = rand(b, s_k, hkv, d, dtype=torch.bfloat16).requires_grad_()
    _expect_float64_match(
        ("dq", "dk", "dv"), (q, k, v),
        lambda q, k, v: fa3.flash_attn_func(q, k, v, causal=causal, attention_chunk=chunk, return_attn_probs=True),
        lambda q, k, v: ref_attention(q, k, v, causal, chunk=chunk))


def test_attention_chunk_varlen_with_seqused():
    """flash_attn_varlen_func with attention_chunk and seqused_q / seqused_k: each sequence's used
    rows chunked on their own (the groups' counts as seqused); out and LSE of the used rows
    against float64."""
    torch.manual_seed(15)
    lens, used_q, used_k, chunk = [300, 40, 900], [250, 0, 700], [300, 17, 880], 128
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
    h, hkv, d = 8, 2, 128
    q = rand(sum(lens), h, d, dtype=torch.bfloat16)
    k = rand(sum(lens), hkv, d, dtype=torch.bfloat16)
    v = rand(sum(lens), hkv, d, dtype=torch.bfloat16)
    sq, sk = (torch.tensor(u, dtype=torch.int32, device=DEV) for u in (used_q, used_k))
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), seqused_q=sq, seqused_k=sk,
                                          causal=True, attention_chunk=chunk, return_attn_probs=True)
    for i in range(len(lens)):
        a = cu[i].item()
        if not used_q[i]:
            continue
        want, want_lse = ref_attention(q[None, a:a + used_q[i]], k[None, a:a + used_k[i]], v[None, a:a + used_k[i]],
                                       True, chunk=chunk)
        assert rel_err(out[a:a + used_q[i]], want[0]) <= 1e-2, i
        assert torch.allclose(lse[:, a:a + used_q[i]].double(), want_lse[0], atol=1e-3, rtol=1e-3), i


def test_sinks_varlen_decode_and_compile():
    torch.manual_seed(14)
    lens = [0, 1, 17, 700]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
    h, hkv, d = 8, 2, 128
    q = rand(sum(lens), h, d, dtype=torch.bfloat16).requires_grad_()
    k = rand(sum(lens), hkv, d, dtype=torch.bfloat16).requires_grad_()
    v = rand(sum(lens), hkv, d, dtype=torch.bfloat16).requires_grad_()
    sinks = torch.randn(h, device=DEV, dtype=torch.float32).requires_grad_()
    out = fa3.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, learnable_sink=sinks)
    dout = torch.randn_like(out)
    out.backward(dout)
    q64, k64, v64, s64 = (t.detach().double().requires_grad_() for t in (q, k, v, sinks))
    ref = torch.zeros_like(out, dtype=torch.float64)
    for i in range(len(lens)):
        a, e = cu[i].item(), cu[i + 1].item()
        if e > a:
            ref[a:e] = ref_attention(q64[None, a:e], k64[None, a:e], v64[None, a:e], True, sinks=s64)[0][0]
    ref.backward(dout.double())
    assert rel_err(out, ref) <= 1e-2 and rel_err(sinks.grad, s64.grad) <= 1e-2
    # Decodes: one split (the decode kernel's epilogue) or several (the combine adds the sink once).
    qd = rand(2, 1, 32, 128, dtype=torch.bfloat16)
    kd, vd = rand(2, 3001, 8, 128, dtype=torch.bfloat16), rand(2, 3001, 8, 128, dtype=torch.bfloat16)
    sd = torch.linspace(-1.0, 9.0, 32, device=DEV)
    ref_d, ref_lse = ref_attention(qd, kd, vd, sinks=sd)
    for num_splits in (1, 7):
        o, l = fa3.flash_attn_with_kvcache(qd, kd, vd, num_splits=num_splits, learnable_sink=sd,
                                           return_softmax_lse=True)
        assert rel_err(o, ref_d) <= 1e-2 and (l.double() - ref_lse).abs().max().item() <= 1e-3
    # torch.compile(fullgraph) with the sinks' gradient.
    f = torch.compile(lambda q, k, v, s: fa3.flash_attn_func(q, k, v, causal=True, learnable_sink=s),
                      fullgraph=True)
    qc, kc, vc = (rand(2, 300, 4, 64, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    sc = torch.zeros(4, device=DEV).requires_grad_()
    ge = torch.autograd.grad(fa3.flash_attn_func(qc, kc, vc, causal=True, learnable_sink=sc).sum(), (qc, sc))
    gc = torch.autograd.grad(f(qc, kc, vc, sc).sum(), (qc, sc))
    assert all(rel_err(x, y) <= 1e-3 for x, y in zip(gc, ge))
    r = torch.library.opcheck(torch.ops.fa3.fwd.default, (qc.detach(), kc.detach(), vc.detach()),
                              dict(causal=True, sinks=sc.detach()))
    assert all(x == "SUCCESS" for x in r.values()), r


@pytest.mark.parametrize("num_splits", [0, 1, 3, 16])
@pytest.mark.parametrize("s_q,causal", [(1, False), (4, True)])
def test_decode_splits_match_float64(num_splits, s_q, causal):
    """Decodes run fa3's decode kernel (pack-GQA, split-KV, the combine kernel)."""
    torch.manual_seed(11)
    q = rand(3, s_q, 32, 128, dtype=torch.bfloat16)
    k, v = rand(3, 3001, 8, 128, dtype=torch.bfloat16), rand(3, 3001, 8, 128, dtype=torch.bfloat16)
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, num_splits=num_splits, return_attn_probs=True)[:2]
    ref, ref_lse = ref_attention(q, k, v, causal=causal)
    assert rel_err(out, ref) <= 1e-2
    assert (lse.double() - ref_lse).abs().max().item() <= 1e-3


def test_combine_kernel_matches_float64():
    torch.manual_seed(12)
    splits, b, s, h, d = 5, 3, 7, 4, 64
    out_p = torch.randn(splits, b, s, h, d, device=DEV)
    lse_p = torch.randn(splits, b, s, h, device=DEV) * 3
    lse_p[2:, 0] = -math.inf          # rows where some splits saw no key
    lse_p[:, 1, 0] = -math.inf        # a row no split saw: output 0, lse -inf
    out_p[3, 0] = float("nan")        # a split of weight 0 is not read
    for dtype in (torch.float32, torch.bfloat16):
        out, lse = fa3.flash_attn_combine(out_p, lse_p, out_dtype=dtype)
        ref_lse = torch.logsumexp(lse_p.double(), dim=0)
        w = torch.exp(lse_p.double() - ref_lse.masked_fill(torch.isinf(ref_lse), 0).unsqueeze(0))
        ref = (w.unsqueeze(-1) * torch.nan_to_num(out_p.double(), nan=0.0)).sum(0)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert rel_err(out, ref) <= (1e-6 if dtype == torch.float32 else 1e-2)
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        fin = torch.isfinite(ref_lse)
        assert (lse.double()[fin] - ref_lse[fin]).abs().max().item() <= 1e-5


def test_cuda_graph_capture_of_a_decode():
    torch.manual_seed(13)
    q = rand(2, 1, 16, 128, dtype=torch.bfloat16)
    k, v = rand(2, 5000, 2, 128, dtype=torch.bfloat16), rand(2, 5000, 2, 128, dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fa3.flash_attn_func(q, k, v, num_splits=0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = fa3.flash_attn_func(q, k, v, num_splits=0)
    q.copy_(torch.randn_like(q))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, fa3.flash_attn_func(q, k, v, num_splits=0))
