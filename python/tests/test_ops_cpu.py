"""The parts of the fa3 package that need no GPU: loading, schemas, fake kernels, autograd wiring,
opcheck's schema/fake/aot checks on meta tensors, torch.compile/export tracing, argument errors,
and the pure-PyTorch pieces (combine, rotary, the KV-cache append) against float64 math."""

import math

import pytest
import torch

import fa3
from fa3 import _kvcache, _ops, interface

needs_lib = pytest.mark.skipif(not fa3.available(), reason=f"fa3 operators not built: {_ops.load_error()}")

BF16 = torch.bfloat16


def meta(*shape, dtype=BF16, grad=False):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)


@needs_lib
def test_schemas_name_every_argument():
    fwd = str(torch.ops.fa3.fwd.default._schema)
    bwd = str(torch.ops.fa3.bwd.default._schema)
    for arg in ("cu_seqlens_q", "seqused_k", "page_table", "q_descale", "softmax_scale", "causal",
                "window_left", "window_right", "softcap", "num_splits", "deterministic"):
        assert arg in fwd
    assert "-> (Tensor out, Tensor softmax_lse)" in fwd
    assert "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)" in bwd
    assert "Tensor? sinks=None" in fwd and "Tensor? sinks=None" in bwd
    # Functional operators: nothing is mutated or aliased.
    assert "!" not in fwd and "!" not in bwd


@needs_lib
@pytest.mark.parametrize("dq,dv,hq,hkv", [(64, 64, 8, 8), (128, 128, 8, 2), (192, 128, 4, 1)])
def test_fake_shapes_dense(dq, dv, hq, hkv):
    q, k, v = meta(2, 17, hq, dq), meta(2, 33, hkv, dq), meta(2, 33, hkv, dv)
    out, lse = _ops.fwd(q, k, v, causal=True)
    assert out.shape == (2, 17, hq, dv) and out.dtype == BF16
    assert lse.shape == (2, hq, 17) and lse.dtype == torch.float32
    dq_, dk_, dv_, ds_ = _ops.bwd(out, q, k, v, out, lse)
    assert dq_.shape == q.shape and dk_.shape == k.shape and dv_.shape == v.shape
    assert ds_.shape == (0,)
    sinks = torch.empty(hq, dtype=torch.float32, device="meta")
    out, lse = _ops.fwd(q, k, v, sinks=sinks)
    assert out.shape == (2, 17, hq, dv)
    ds_ = _ops.bwd(out, q, k, v, out, lse, sinks=sinks)[3]
    assert ds_.shape == (hq,) and ds_.dtype == torch.float32


@needs_lib
def test_fwd_kvcache_schema_and_fake_shapes():
    schema = str(torch.ops.fa3.fwd_kvcache.default._schema)
    # The caches are written in place (the append), and say so; nothing else is mutated or aliased.
    assert "Tensor(a!) k_cache" in schema and "Tensor(b!) v_cache" in schema and schema.count("!") == 2
    q = meta(2, 4, 8, 128)
    k_cache, v_cache = meta(2, 300, 2, 128), meta(2, 300, 2, 64)
    k_new, v_new = meta(2, 4, 2, 128), meta(2, 4, 2, 64)
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    out, lse = _ops.fwd_kvcache(q, k_cache, v_cache, k_new, v_new, lens, causal=True)
    assert out.shape == (2, 4, 8, 64) and lse.shape == (2, 8, 4) and lse.dtype == torch.float32


@needs_lib
def test_fake_shapes_varlen_and_fp8():
    q, k = meta(100, 8, 64), meta(300, 2, 64)
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    out, lse = _ops.fwd(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=50, max_seqlen_k=120)
    assert out.shape == (100, 8, 64) and lse.shape == (8, 100)
    q8, k8 = meta(2, 16, 4, 128, dtype=torch.float8_e4m3fn), meta(2, 16, 4, 128, dtype=torch.float8_e4m3fn)
    out8, _ = _ops.fwd(q8, k8, k8)
    assert out8.dtype == BF16


@needs_lib
def test_fp8_block_descales_and_quantize_schemas():
    fwd = str(torch.ops.fa3.fwd.default._schema)
    for arg in ("q_block_descale", "k_block_descale", "v_block_descale", "q_block_size", "kv_block_size"):
        assert arg in fwd
    x = meta(2, 300, 4, 128)
    x8, ds = fa3.quantize_fp8(x, 128, hadamard=True)
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape
    assert ds.shape == (2, 4, 3) and ds.dtype == torch.float32
    out8, _ = fa3.flash_attn_func(x8, x8, x8, q_block_descale=ds, k_block_descale=ds, v_block_descale=ds,
                                  return_attn_probs=True)
    assert out8.shape == x.shape and out8.dtype == BF16
    with pytest.raises(ValueError, match="CUDA"):
        fa3.quantize_fp8(torch.zeros(1, 16, 1, 64, dtype=BF16))


@needs_lib
def test_autograd_reaches_every_input_through_out_and_lse(monkeypatch):
    """softmax_lse is differentiable: fa3::bwd gets its gradient as dlse (None when the loss did not
    use it, so the common backward reads nothing more), and a loss through LSE alone gets dO = 0."""
    seen = []
    real = _ops.bwd

    def spy(*args):
        seen.append((args[0], args[19]))  # (dout, dlse)
        return real(*args)

    monkeypatch.setattr(_ops, "bwd", spy)
    for use_out, use_lse in [(True, False), (True, True), (False, True)]:
        q, k, v = meta(2, 17, 8, 64, grad=True), meta(2, 40, 2, 64, grad=True), meta(2, 40, 2, 64, grad=True)
        out, lse = fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert out.requires_grad and lse.requires_grad
        loss = (out.sum() if use_out else 0) + (lse.float().square().sum() if use_lse else 0)
        loss.backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
        dout, dlse = seen.pop()
        assert dout.shape == out.shape
        assert (dlse is not None) == use_lse
        if use_lse:
            assert dlse.dtype == torch.float32 and dlse.shape == lse.shape and dlse.is_contiguous()


@needs_lib
def test_sm_margin_reaches_the_forward_operators(monkeypatch):
    """FlashAttention-3's sm_margin (SMs the forward's persistent grid leaves free, fa3_c.h) goes
    from each function to the forward operator; the operators' schemas take it."""
    for op in (torch.ops.fa3.fwd, torch.ops.fa3.fwd_kvcache):
        assert "int sm_margin=0" in str(op.default._schema)
    seen = []
    real = _ops.fwd

    def spy(*args, **kwargs):
        seen.append(kwargs["sm_margin"] if "sm_margin" in kwargs else args[26] if len(args) > 26 else 0)
        return real(*args, **kwargs)

    monkeypatch.setattr(_ops, "fwd", spy)
    q, k, v = meta(2, 17, 8, 64), meta(2, 40, 2, 64), meta(2, 40, 2, 64)
    fa3.flash_attn_func(q, k, v, causal=True, sm_margin=6)
    fa3.flash_attn_func(q, k, v, causal=True)
    cu_q = torch.tensor([0, 17], dtype=torch.int32, device="meta")
    cu_k = torch.tensor([0, 40], dtype=torch.int32, device="meta")
    fa3.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 17, 40, sm_margin=5)
    fa3.flash_attn_with_kvcache(q, k, v, sm_margin=4)  # (meta tensors: the operator path without the append)
    fa3.flash_attn_qkvpacked_func(meta(2, 17, 3, 8, 64), sm_margin=3)
    assert seen == [6, 0, 5, 4, 3]


@needs_lib
def test_qkvpacked_views_share_one_gradient():
    qkv = meta(2, 9, 3, 4, 64, grad=True)
    fa3.flash_attn_qkvpacked_func(qkv, causal=True).sum().backward()
    assert qkv.grad.shape == qkv.shape
    gqa = meta(2, 9, 8 + 2 * 2, 64, grad=True)
    out = fa3.flash_attn_qkvpacked_func(gqa, num_heads_q=8)
    assert out.shape == (2, 9, 8, 64)


@needs_lib
@pytest.mark.parametrize("op,args", [
    ("fwd", lambda: ((meta(2, 17, 8, 64), meta(2, 33, 2, 64), meta(2, 33, 2, 64)),
                     dict(causal=True, softmax_scale=0.1, window_left=5))),
    ("bwd", lambda: ((meta(2, 17, 8, 64), meta(2, 17, 8, 64), meta(2, 33, 2, 64), meta(2, 33, 2, 64),
                      meta(2, 17, 8, 64), meta(2, 8, 17, dtype=torch.float32)), dict(causal=True))),
])
def test_opcheck_on_meta(op, args):
    a, kw = args()
    result = torch.library.opcheck(getattr(torch.ops.fa3, op).default, a, kw)
    assert all(v == "SUCCESS" for v in result.values()), result


@needs_lib
def test_compile_has_no_graph_break_and_export_works():
    def f(q, k, v):
        return fa3.flash_attn_func(q, k, v, causal=True, window_size=(16, 0), softcap=30.0)

    q, k = meta(2, 17, 8, 64, grad=True), meta(2, 33, 2, 64)
    assert torch._dynamo.explain(f)(q, k, k).graph_break_count == 0

    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return fa3.flash_attn_func(q, k, v, causal=True)

    ep = torch.export.export(M(), (meta(2, 17, 8, 64), k, k))
    assert any("fa3.fwd" in str(n.target) for n in ep.graph.nodes)


def test_compiled_backward_traces_the_layout_checks():
    """torch.compile traces fa3's backward with FakeTensors, which have no data pointer: the
    layout check (tma_layout) reads their storage offset instead (it raised on the GPU, where only
    the compiled tests reached it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        view = torch.empty(2, 16, 4, 68, dtype=BF16)[..., 4:]
        assert _ops.tma_layout(view).is_contiguous()
        dense = torch.empty(2, 16, 4, 64, dtype=BF16)
        assert _ops.tma_layout(dense) is dense
        shifted = torch.empty(2 * 16 * 4 * 64 + 4, dtype=BF16)[4:].view(2, 16, 4, 64)
        assert _ops.start_offset(_ops.tma_layout(shifted)) % 16 == 0

    def f(q, k, v):
        out, lse = fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        return out.float().sum() + lse.sum()

    q, k, v = meta(2, 17, 8, 64, grad=True), meta(2, 33, 2, 64, grad=True), meta(2, 33, 2, 64, grad=True)
    torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


@needs_lib
def test_cpu_tensors_get_a_clear_error():
    x = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match="expected CUDA tensors"):
        fa3.flash_attn_func(x, x, x)


def test_unsupported_arguments_are_named():
    x = meta(1, 4, 2, 64)
    with pytest.raises(NotImplementedError, match="qv"):
        fa3.flash_attn_func(x, x, x, qv=x)
    with pytest.raises(ValueError, match="cache_leftpad: cannot be combined with page_table"):
        fa3.flash_attn_with_kvcache(x, x, x, cache_leftpad=torch.zeros(1, dtype=torch.int32),
                                    page_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="rotary_seqlens: given without rotary_cos"):
        fa3.flash_attn_with_kvcache(x, x, x, rotary_seqlens=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="num_heads_q"):
        fa3.flash_attn_qkvpacked_func(meta(1, 4, 6, 64))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        fa3.flash_attn_varlen_func(x, x, x, None, None, 4, 4)


def test_windows_as_flash_attention_3_reads_them(monkeypatch):
    # causal sets the right edge to 0 whatever window_size says (FlashAttention-3's rule; transformers
    # passes causal=True with window_size=(w - 1, w - 1)); sizes past int32 are clamped, not wrapped.
    calls = []

    def fake_fwd(q, k, v, *args, **kw):
        calls.append(kw.get("window_left", args[12] if len(args) > 12 else None))
        calls.append(kw.get("window_right", args[13] if len(args) > 13 else None))
        return q, None

    monkeypatch.setattr(_ops, "fwd", fake_fwd)
    x = meta(1, 4, 2, 64)
    fa3.flash_attn_func(x, x, x, causal=True, window_size=(127, 127))
    fa3.flash_attn_func(x, x, x, window_size=(2**40, 3))
    fa3.flash_attn_varlen_func(x[0], x[0], x[0], torch.zeros(2, dtype=torch.int32), None, 4, 4,
                               causal=True, window_size=(-1, 5))
    assert calls == [127, 0, 2**31 - 1, 3, -1, 0]


def test_tma_layout_copies_only_what_fa3_cannot_read():
    base = torch.randn(2, 16, 4, 68, dtype=BF16)
    view = base[..., 4:]                         # strides of 68 elements (136 bytes), 8 bytes in
    assert _ops.tma_layout(view).is_contiguous()
    wide = torch.randn(2, 16, 4, 72, dtype=BF16)[..., :64]
    assert _ops.tma_layout(wide) is wide         # 144-byte strides: read in place
    bshd = torch.randn(2, 4, 16, 64, dtype=BF16).transpose(1, 2)
    assert _ops.tma_layout(bshd) is bshd         # BHSD memory seen as BSHD: read in place
    flat = torch.randn(2 * 16 * 4 * 64 + 4, dtype=BF16)
    shifted = flat[4:].view(2, 16, 4, 64)        # contiguous, 8 bytes past an aligned start
    assert shifted.data_ptr() % 16 != 0
    fixed = _ops.tma_layout(shifted)
    assert fixed.data_ptr() % 16 == 0 and torch.equal(fixed, shifted)
    assert _ops.tma_layout(None) is None


def test_combine_matches_float64():
    torch.manual_seed(0)
    splits, b, s, h, d = 5, 3, 7, 4, 16
    out_p = torch.randn(splits, b, s, h, d)
    lse_p = torch.randn(splits, b, s, h) * 3
    lse_p[2:, 0] = -math.inf          # rows where some splits saw no key
    lse_p[:, 1, 0] = -math.inf        # a row no split saw: output 0, lse -inf
    out, lse = fa3.flash_attn_combine(out_p, lse_p, out_dtype=torch.float32)
    l64 = torch.logsumexp(lse_p.double(), 0)
    w = torch.nan_to_num(torch.exp(lse_p.double() - l64), nan=0.0)
    ref = (w.unsqueeze(-1) * out_p.double()).sum(0)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(l64))
    assert torch.all(out[1, 0] == 0)
    assert torch.allclose(lse[~torch.isinf(lse)].double(), l64[~torch.isinf(l64)], atol=1e-5)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_matches_the_rotation_formula(interleaved):
    torch.manual_seed(1)
    s, h, d, r = 6, 2, 16, 8
    x = torch.randn(1, s, h, d, dtype=torch.float64)
    theta = torch.rand(s, r // 2, dtype=torch.float64) * 6
    y = _kvcache.rotary(x, theta.cos()[None], theta.sin()[None], interleaved)
    ref = x.clone()
    for i in range(r // 2):
        a, b_ = (2 * i, 2 * i + 1) if interleaved else (i, i + r // 2)
        c, sn = theta.cos()[:, i, None], theta.sin()[:, i, None]
        ref[0, :, :, a] = x[0, :, :, a] * c - x[0, :, :, b_] * sn
        ref[0, :, :, b_] = x[0, :, :, a] * sn + x[0, :, :, b_] * c
    assert torch.allclose(y, ref, atol=1e-12)


def _attention_f64(q, k, v, seqused_k, causal):
    """Per-batch float64 attention over the first seqused_k[b] keys (bottom-right causal)."""
    outs = []
    for b in range(q.shape[0]):
        n = int(seqused_k[b])
        qb, kb, vb = q[b].double(), k[b, :n].double(), v[b, :n].double()
        kb = kb.repeat_interleave(qb.shape[1] // kb.shape[1], dim=1)
        vb = vb.repeat_interleave(qb.shape[1] // vb.shape[1], dim=1)
        s = torch.einsum("qhd,khd->hqk", qb, kb) / math.sqrt(q.shape[-1])
        if causal:
            i = torch.arange(qb.shape[0])[:, None]
            j = torch.arange(n)[None, :]
            s = s.masked_fill(j > i + n - qb.shape[0], -math.inf)
        outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vb))
    return torch.stack(outs)


def _paged_stand_in(q, k, v, page_table=None, seqused_k=None, causal=False, **kw):
    # What fa3's kernel computes, in float64 on CPU: gathers the pages, then plain attention.
    if page_table is not None:
        k = k[page_table.long()].flatten(1, 2)
        v = v[page_table.long()].flatten(1, 2)
    out = _attention_f64(q, k, v, seqused_k, causal).to(q.dtype)
    return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_append_writes_the_cache_and_attends_to_it(monkeypatch, paged):
    monkeypatch.setattr(_ops, "fwd", _paged_stand_in)
    torch.manual_seed(2)
    b, s_new, h, hkv, d, cache_len, page = 3, 2, 4, 2, 16, 12, 4
    seqlens = torch.tensor([0, 5, 9], dtype=torch.int32)
    k_full = torch.randn(b, cache_len, hkv, d)
    v_full = torch.randn(b, cache_len, hkv, d)
    k_new, v_new = torch.randn(b, s_new, hkv, d), torch.randn(b, s_new, hkv, d)
    q = torch.randn(b, s_new, h, d)
    if paged:
        perm = torch.randperm(b * cache_len // page)
        page_table = perm.reshape(b, cache_len // page).to(torch.int32)
        k_cache = torch.empty(b * cache_len // page, page, hkv, d)
        v_cache = torch.empty_like(k_cache)
        k_cache[page_table.long()] = k_full.reshape(b, -1, page, hkv, d)
        v_cache[page_table.long()] = v_full.reshape(b, -1, page, hkv, d)
    else:
        page_table = None
        k_cache, v_cache = k_full.clone(), v_full.clone()
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                      page_table=page_table, causal=True)
    k_ref, v_ref = k_full.clone(), v_full.clone()
    for i in range(b):
        n = int(seqlens[i])
        k_ref[i, n:n + s_new], v_ref[i, n:n + s_new] = k_new[i], v_new[i]
    got_k = k_cache[page_table.long()].flatten(1, 2) if paged else k_cache
    assert torch.equal(got_k, k_ref)
    ref = _attention_f64(q, k_ref, v_ref, seqlens + s_new, causal=True)
    assert torch.allclose(out.double(), ref, atol=1e-5)


def _random_cache(paged, b, cache_len, page, h, d):
    """(page table or None, cache): b sequences of cache_len rows, in shuffled pages of `page` rows."""
    if paged:
        table = torch.randperm(b * cache_len // page).reshape(b, -1).to(torch.int32)
        return table, torch.randn(b * cache_len // page, page, h, d)
    return None, torch.randn(b, cache_len, h, d)


def _append_dense(cache, table, base, new):
    """Dense rows new [b, s_new, h, d] at positions base[s] + i, as the dense append writes them."""
    b, s_new = new.shape[:2]
    seq, index, counts, first = _kvcache.dense_rows(b, s_new, new.device)
    _kvcache.write_rows(cache, table, seq, index, base, counts, first, new.flatten(0, 1))


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_append_outside_the_cache_writes_nothing(paged):
    """The PyTorch-operations append (e4m3 caches, CPU tensors): positions past the cache or
    negative write nothing (fa3's append kernel's rule; indexing with them raised, a device-side
    assert on the GPU); the valid rows of the same call land, the last cache row among them."""
    torch.manual_seed(3)
    b, s_new, h, d, cache_len, page = 4, 3, 2, 8, 12, 4
    base = torch.tensor([10, -2, 3, 11])  # rows 10, 11 | 12 (past); -2, -1 (before) | 0; 3, 4, 5; 11 | 12, 13
    pos = base[:, None] + torch.arange(s_new)[None, :]
    new = torch.randn(b, s_new, h, d)
    table, cache = _random_cache(paged, b, cache_len, page, h, d)
    expect = cache.clone()
    for i in range(b):
        for j in range(s_new):
            p = int(pos[i, j])
            if not 0 <= p < cache_len:
                continue
            if paged:
                expect[int(table[i, p // page]), p % page] = new[i, j]
            else:
                expect[i, p] = new[i, j]
    _append_dense(cache, table, base, new)
    assert torch.equal(cache, expect)
    e4m3 = expect.to(torch.float8_e4m3fn)  # a one-byte cache (written as bytes)
    cache8 = e4m3.clone()
    _append_dense(cache8, table, base, new)
    assert torch.equal(cache8.view(torch.uint8), e4m3.view(torch.uint8))


@pytest.mark.parametrize("paged", [False, True])
def test_packed_rows_land_where_each_sequence_puts_them(paged):
    """write_rows (the PyTorch-operations append, packed or dense rows) against a row-by-row loop:
    sequence s's rows go to base[s] + i, positions outside the cache (negative, past its end) and
    rows past a sequence's count write nothing, and the clamped rows that meet a valid one at the
    cache's first or last row do not undo it; one-byte caches alike."""
    torch.manual_seed(4)
    h, d, cache_len, page = 2, 8, 12, 4
    base = torch.tensor([10, -2, 3, 11, 0], dtype=torch.int32)  # past the end, before the start, inside, both
    counts = torch.tensor([3, 3, 2, 0, 12], dtype=torch.int32)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0).to(torch.int32)])
    total = int(cu[-1]) + 2  # two rows past the last sequence's count
    b = base.shape[0]
    new = torch.randn(total, h, d)
    table, cache = _random_cache(paged, b, cache_len, page, h, d)
    expect = cache.clone()
    for s in range(b):
        for i in range(int(counts[s])):
            p = int(base[s]) + i
            if 0 <= p < cache_len:
                at = (int(table[s, p // page]), p % page) if paged else (s, p)
                expect[at] = new[int(cu[s]) + i]
    seq, index = _kvcache.packed_rows(cu, total)
    assert seq.tolist()[-3:] == [b - 1] * 3 and index.tolist()[-2:] == [12, 13]
    for dtype in (torch.float32, torch.float8_e4m3fn):  # (one-byte caches are written as bytes)
        got = cache.to(dtype)
        _kvcache.write_rows(got, table, seq, index, base, counts, cu[:-1], new)
        assert torch.equal(got.view(torch.uint8), expect.to(dtype).view(torch.uint8))


def _kvcache_stand_in(q, k, v, cu_seqlens_q=None, **kw):
    # Packed queries: the varlen stand-in (a paged cache); dense ones: the paged one.
    if cu_seqlens_q is not None:
        return _varlen_stand_in(q, k, v, cu_seqlens_q=cu_seqlens_q, **kw)
    return _paged_stand_in(q, k, v, **kw)


@pytest.mark.parametrize("rotary", [False, True])
def test_kvcache_packed_append_matches_each_sequence_alone(monkeypatch, rotary):
    """Packed queries and packed new keys (cu_seqlens_q, cu_seqlens_k_new) through the
    PyTorch-operations append (e4m3 caches and CPU tensors take it): the caches and the outputs are
    those of each sequence's own dense call, rotary positions included (causal: query i at
    cache_seqlens + i)."""
    monkeypatch.setattr(_ops, "fwd", _kvcache_stand_in)
    torch.manual_seed(5)
    h, hkv, d, page, width = 4, 2, 16, 4, 5
    lens_q, lens_new, cached = [2, 1, 2], [3, 0, 2], [4, 7, 0]  # (every query sees a key)
    b = len(lens_q)
    table = torch.randperm(b * width).reshape(b, width).to(torch.int32)
    k_cache = torch.randn(b * width, page, hkv, d)
    v_cache = torch.randn(b * width, page, hkv, d)
    q = torch.randn(sum(lens_q), h, d)
    k_new, v_new = torch.randn(sum(lens_new), hkv, d), torch.randn(sum(lens_new), hkv, d)
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_new = torch.tensor([0] + list(torch.tensor(lens_new).cumsum(0)), dtype=torch.int32)
    angle = torch.rand(page * width, d // 2)
    cos, sin = (angle.cos(), angle.sin()) if rotary else (None, None)
    kc, vc = k_cache.clone(), v_cache.clone()
    out = fa3.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                      cache_seqlens=torch.tensor(cached, dtype=torch.int32), page_table=table,
                                      cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_new, max_seqlen_q=max(lens_q),
                                      causal=True)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    for s in range(b):
        qs = q[int(cu_q[s]):int(cu_q[s + 1])][None]
        ks = k_new[int(cu_new[s]):int(cu_new[s + 1])][None]
        vs = v_new[int(cu_new[s]):int(cu_new[s + 1])][None]
        o = fa3.flash_attn_with_kvcache(qs, ref_k, ref_v, ks if lens_new[s] else None, vs if lens_new[s] else None,
                                        rotary_cos=cos, rotary_sin=sin,
                                        cache_seqlens=torch.tensor([cached[s]], dtype=torch.int32),
                                        page_table=table[s:s + 1], causal=True)
        assert torch.allclose(out[int(cu_q[s]):int(cu_q[s + 1])].double(), o[0].double(), atol=1e-6), s
    assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)


def test_kvcache_batch_index_becomes_a_page_table(monkeypatch):
    seen = {}

    def stand_in(q, k, v, page_table=None, seqused_k=None, **kw):
        seen["page_table"], seen["seqused_k"] = page_table, seqused_k
        return torch.zeros(*q.shape), torch.zeros(1)

    monkeypatch.setattr(_ops, "fwd", stand_in)
    q = torch.randn(2, 1, 4, 16)
    cache = torch.randn(5, 8, 4, 16)
    fa3.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=3,
                                cache_batch_idx=torch.tensor([4, 1], dtype=torch.int32))
    assert seen["page_table"].tolist() == [[4], [1]]
    assert seen["seqused_k"].tolist() == [3, 3]


@pytest.mark.parametrize("causal,window,chunk,local", [(False, (-1, -1), 0, False), (True, (-1, -1), 0, True),
                                                        (False, (2, 2), 0, True), (False, (11, 11), 0, False),
                                                        (False, (2**40, -1), 0, False), (False, None, 0, False),
                                                        (False, (-1, -1), 4, True)])
def test_kvcache_rotary_positions_of_queries(monkeypatch, causal, window, chunk, local):
    # The PyTorch-operations path (CPU here, e4m3 or chunked on a GPU): causal or local queries are
    # rotated at cache_seqlens + i, the others all at cache_seqlens; a window reaching every key
    # (>= 12 - 1 of 12 keys, 4 queries) is none, and chunked attention is local (FlashAttention-3's
    # rules, and the fused kernel's).
    seen = {}

    def stand_in(q, k, v, **kw):  # (chunked: one packed call)
        seen["q"] = q
        return torch.zeros(*q.shape), torch.zeros(q.shape[-2], q.shape[0] if chunk else 1)

    monkeypatch.setattr(_ops, "fwd", stand_in)
    b, s_q, h, d, cache_len = 1, 4, 2, 16, 12
    q = torch.randn(b, s_q, h, d)
    cache = torch.randn(b, cache_len, h, d)
    angle = torch.rand(cache_len, d // 2)
    cos, sin = angle.cos(), angle.sin()
    fa3.flash_attn_with_kvcache(q, cache, cache, rotary_cos=cos, rotary_sin=sin, cache_seqlens=3,
                                causal=causal, window_size=window, attention_chunk=chunk)
    pos = 3 + torch.arange(s_q) if local else torch.full((s_q,), 3)
    want = _kvcache.rotary(q, cos[pos][None], sin[pos][None], True)
    assert torch.equal(seen["q"].reshape(want.shape), want)


def _varlen_stand_in(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
                     page_table=None, max_seqlen_q=0, max_seqlen_k=0, causal=False, window_left=-1,
                     window_right=-1, softmax_scale=0.0, sinks=None, q_descale=None, k_descale=None,
                     v_descale=None, **kw):
    """fa3::fwd on packed query rows in float64 (bottom-right masks per sequence, rows without a key:
    O = 0, LSE = -inf or the sink), checking the caller's max_seqlen bounds as fa3's contract.
    Sequence s's queries: packed rows from cu_seqlens_q[s], seqused_q[s] of them where given (the
    other rows are left as they are: zero here); its keys: packed rows from cu_seqlens_k[s],
    seqused_k[s] of them where given (else up to cu_seqlens_k[s + 1]); or (page_table) pages
    [num_pages, page_size, h, d], seqused_k[s] keys through page-table row s (max_seqlen_k within
    a row's pages, as the operator checks). Descales ([sequences, heads_kv], FlashAttention-3's)
    multiply sequence s's q, k and v."""
    assert cu_seqlens_q.dtype == torch.int32
    groups = cu_seqlens_q.shape[0] - 1
    if page_table is None:
        assert cu_seqlens_k.dtype == torch.int32 and cu_seqlens_q.shape == cu_seqlens_k.shape
    else:
        assert cu_seqlens_k is None and page_table.dtype == torch.int32 and page_table.shape[0] == groups
        assert max_seqlen_k <= page_table.shape[1] * k.shape[1]
    for t in (q_descale, k_descale, v_descale):
        assert t is None or t.shape == (groups, k.shape[-2])
    for used in (seqused_q, seqused_k):
        assert used is None or (used.dtype == torch.int32 and used.shape == (groups,))
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float64)
    scale = softmax_scale or 1 / math.sqrt(q.shape[-1])
    for s in range(groups):
        q0 = int(cu_seqlens_q[s])
        q1 = q0 + int(seqused_q[s]) if seqused_q is not None else int(cu_seqlens_q[s + 1])
        assert q1 <= q.shape[0]
        if page_table is not None:
            n, size = int(seqused_k[s]), k.shape[1]
            assert page_table.shape[1] * size >= n
            pages = [int(page_table[s, j // size]) for j in range(n)]
            ks = torch.stack([k[pages[j], j % size] for j in range(n)]) if n else k[0, :0]
            vs = torch.stack([v[pages[j], j % size] for j in range(n)]) if n else v[0, :0]
        else:
            k0 = int(cu_seqlens_k[s])
            n = int(seqused_k[s]) if seqused_k is not None else int(cu_seqlens_k[s + 1]) - k0
            assert k0 + n <= k.shape[0]
            ks, vs = k[k0:k0 + n], v[k0:k0 + n]
        k0, k1 = 0, n
        assert 0 <= q1 - q0 <= max_seqlen_q and 0 <= k1 - k0 <= max_seqlen_k
        if k1 == k0:  # a sequence without keys: O = 0, LSE = the sink or -inf
            if sinks is not None:
                lse[:, q0:q1] = sinks.double()[:, None]
            continue
        qs, ks, vs = q[q0:q1].double(), ks.double(), vs.double()
        g = qs.shape[1] // ks.shape[1]
        if q_descale is not None:
            qs = qs * q_descale[s].double().repeat_interleave(g)[None, :, None]
            ks, vs = ks * k_descale[s].double()[None, :, None], vs * v_descale[s].double()[None, :, None]
        ks, vs = ks.repeat_interleave(g, 1), vs.repeat_interleave(g, 1)
        sc = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        p = torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)
        j = torch.arange(k1 - k0)[None, :]
        hidden = torch.zeros_like(p + j, dtype=torch.bool)
        if window_right >= 0:
            hidden |= j > p + window_right
        if window_left >= 0:
            hidden |= j < p - window_left
        sc = sc.masked_fill(hidden, -math.inf)
        if sinks is not None:
            sc = torch.cat([sc, sinks.double()[:, None, None].expand(-1, q1 - q0, 1)], -1)
        m = sc.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
        e = (sc - m).exp()
        denom = e.sum(-1, keepdim=True)
        w = (e / denom.clamp(min=1e-300))[..., :k1 - k0]
        out[q0:q1] = torch.einsum("hqk,khd->qhd", w, vs)
        lse[:, q0:q1] = (denom.squeeze(-1).log() + m.squeeze(-1))
    return out.to(q.dtype), lse.float()


def _chunked_f64(q, k, v, chunk, causal, window, sinks=None):
    """FlashAttention-3's attention_chunk on fixed-length [b, s, h, d] tensors, in float64: a query
    at position p (bottom-right) sees the keys j with j // chunk == p // chunk, within its mask."""
    b, s_q, s_k = q.shape[0], q.shape[1], k.shape[1]
    left, right = window
    if causal:
        right = 0
    p = torch.arange(s_q)[:, None] + s_k - s_q
    j = torch.arange(s_k)[None, :]
    visible = torch.div(p, chunk, rounding_mode="floor") == torch.div(j, chunk, rounding_mode="floor")
    if right >= 0:
        visible &= j <= p + right
    if left >= 0:
        visible &= j >= p - left
    g = q.shape[2] // k.shape[2]
    kk, vv = k.double().repeat_interleave(g, 2), v.double().repeat_interleave(g, 2)
    sc = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk) / math.sqrt(q.shape[-1])
    sc = sc.masked_fill(~visible, -math.inf)
    if sinks is not None:
        sc = torch.cat([sc, sinks.double()[None, :, None, None].expand(b, -1, s_q, 1)], -1)
    lse = torch.logsumexp(sc, -1)
    w = (sc - lse[..., None].nan_to_num(neginf=0.0)).exp().nan_to_num(0.0)[..., :s_k]
    return torch.einsum("bhqk,bkhd->bqhd", w, vv), lse


@pytest.mark.parametrize("s_q,s_k,chunk,causal,window,hkv", [
    (16, 16, 4, True, (-1, -1), 2),    # a prefill: four chunks
    (5, 18, 4, True, (-1, -1), 1),     # queries crossing a chunk boundary, MQA
    (20, 13, 4, False, (-1, -1), 2),   # queries before the first key (they see nothing), not causal
    (9, 9, 4, False, (2, 1), 4),       # a window inside the chunks
    (7, 12, 5, True, (3, -1), 2),      # a window and causal, keys not a multiple of the chunk
    (6, 6, 8, False, (-1, -1), 2),     # one chunk holds every key: the plain call
])
def test_attention_chunk_matches_its_definition(monkeypatch, s_q, s_k, chunk, causal, window, hkv):
    monkeypatch.setattr(_ops, "fwd", _varlen_stand_in)
    monkeypatch.setattr(_ops, "available", lambda: True)
    torch.manual_seed(s_q * 31 + s_k)
    b, h, d = 3, 4, 8
    q, k, v = torch.randn(b, s_q, h, d), torch.randn(b, s_k, hkv, d), torch.randn(b, s_k, hkv, d)
    sinks = torch.randn(h) if s_q == 20 else None
    if chunk >= s_k and (causal or s_q <= s_k):  # the plain call: a stand-in that takes dense tensors
        seen = []
        monkeypatch.setattr(_ops, "fwd", lambda *a, **kw: seen.append(kw.get("cu_seqlens_q")) or
                            (torch.zeros(b, s_q, h, d), torch.zeros(b, h, s_q)))
        fa3.flash_attn_func(q, k, v, causal=causal, window_size=window, attention_chunk=chunk)
        assert seen == [None]
        return
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window, attention_chunk=chunk,
                                   learnable_sink=sinks, return_attn_probs=True)
    ref, ref_lse = _chunked_f64(q, k, v, chunk, causal, window, sinks)
    assert out.shape == ref.shape and lse.shape == ref_lse.shape and lse.is_contiguous()
    assert torch.allclose(out.double(), ref, atol=1e-5)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse.double()[finite], ref_lse[finite], atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_chunk_on_packed_sequences(monkeypatch, causal):
    """flash_attn_varlen_func: each sequence chunked on its own (lengths read on the device)."""
    monkeypatch.setattr(_ops, "fwd", _varlen_stand_in)
    torch.manual_seed(4)
    lens_q, lens_k, chunk, h, d = [5, 0, 12, 9], [9, 3, 12, 4], 4, 2, 8
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = torch.randn(sum(lens_q), h, d), torch.randn(sum(lens_k), h, d), torch.randn(sum(lens_k), h, d)
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                          attention_chunk=chunk, return_attn_probs=True)
    for s in range(len(lens_q)):
        q0, q1, k0, k1 = int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s]), int(cu_k[s + 1])
        if q1 == q0:
            continue
        ref, ref_lse = _chunked_f64(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], chunk, causal, (-1, -1))
        assert torch.allclose(out[q0:q1].double(), ref[0], atol=1e-5), s
        finite = torch.isfinite(ref_lse[0])
        assert torch.allclose(lse[:, q0:q1].double()[finite], ref_lse[0][finite], atol=1e-5), s


@pytest.mark.parametrize("causal", [True, False])
def test_attention_chunk_with_seqused(monkeypatch, causal):
    """flash_attn_varlen_func with seqused_q / seqused_k: each sequence's used rows chunked on their
    own (the groups' counts passed as seqused, since the used rows are not back to back)."""
    monkeypatch.setattr(_ops, "fwd", _varlen_stand_in)
    torch.manual_seed(5)
    lens_q, lens_k, used_q, used_k, chunk, h, d = [6, 3, 12, 9], [9, 5, 12, 14], [5, 0, 9, 9], [9, 3, 7, 10], 4, 2, 8
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = torch.randn(sum(lens_q), h, d), torch.randn(sum(lens_k), h, d), torch.randn(sum(lens_k), h, d)
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                          seqused_q=torch.tensor(used_q, dtype=torch.int32),
                                          seqused_k=torch.tensor(used_k, dtype=torch.int32),
                                          attention_chunk=chunk, return_attn_probs=True)
    for s in range(len(lens_q)):
        q0, k0 = int(cu_q[s]), int(cu_k[s])
        q1, k1 = q0 + used_q[s], k0 + used_k[s]
        assert torch.all(out[q1:int(cu_q[s + 1])] == 0), s  # rows past seqused_q: not computed
        if q1 == q0:
            continue
        ref, ref_lse = _chunked_f64(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], chunk, causal, (-1, -1))
        assert torch.allclose(out[q0:q1].double(), ref[0], atol=1e-5), s
        finite = torch.isfinite(ref_lse[0])
        assert torch.equal(torch.isfinite(lse[:, q0:q1]), finite), s
        assert torch.allclose(lse[:, q0:q1].double()[finite], ref_lse[0][finite], atol=1e-5), s


def test_attention_chunk_arguments():
    q = torch.zeros(1, 4, 2, 8)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="attention_chunk"):
            fa3.flash_attn_func(q, q, q, attention_chunk=bad)
        with pytest.raises(ValueError, match="attention_chunk"):
            fa3.flash_attn_with_kvcache(q, q, q, attention_chunk=bad)
    pages = torch.zeros(4, 16, 2, 8)
    with pytest.raises(NotImplementedError, match="attention_chunk: chunks of 24 keys on pages of 16"):
        fa3.flash_attn_with_kvcache(q, pages, pages, page_table=torch.zeros(1, 4, dtype=torch.int32),
                                    cache_seqlens=40, attention_chunk=24)


@pytest.mark.parametrize("cache,s_q,causal,window", [
    ("contiguous", 1, True, (-1, -1)),   # a decode
    ("contiguous", 3, True, (-1, -1)),   # speculative queries across a chunk boundary
    ("leftpad", 3, True, (2, -1)),       # left padding, a window
    ("batch_idx", 2, False, (-1, -1)),   # cache_batch_idx: entries in another order, not causal
    ("paged", 3, True, (-1, -1)),        # pages of 4, chunks of 8: two pages a chunk
    ("paged", 1, False, (-1, 3)),
])
@pytest.mark.parametrize("append", [False, True])
def test_kvcache_attention_chunk_matches_its_definition(monkeypatch, cache, s_q, causal, window, append):
    """flash_attn_with_kvcache with attention_chunk: the cache read in place as one grouped call
    (contiguous caches as packed rows, paged ones through a page-table row per group), after the
    append (PyTorch operations), against the definition in float64 on each sequence's keys."""
    monkeypatch.setattr(_ops, "fwd", _varlen_stand_in)
    monkeypatch.setattr(_ops, "available", lambda: True)
    torch.manual_seed(len(cache) * 7 + s_q)
    b, h, hkv, d, length, chunk, page = 3, 4, 2, 8, 24, 8, 4
    lens = torch.tensor([5, 0, 17], dtype=torch.int32)  # the second: only its new keys, if any
    full_k, full_v = torch.randn(b, length, hkv, d), torch.randn(b, length, hkv, d)
    k_new = torch.randn(b, 2, hkv, d) if append else None
    v_new = torch.randn(b, 2, hkv, d) if append else None
    q = torch.randn(b, s_q, h, d)
    pad = torch.tensor([1, 0, 6], dtype=torch.int32) if cache == "leftpad" else None
    entries = torch.tensor([2, 0, 1], dtype=torch.int32) if cache == "batch_idx" else None
    kw = dict(cache_seqlens=lens, cache_leftpad=pad, cache_batch_idx=entries, causal=causal, window_size=window,
              attention_chunk=chunk, return_softmax_lse=True)
    descales = None
    if cache in ("batch_idx", "paged"):  # FlashAttention-3's [batch, heads_kv], repeated per group in order
        descales = [torch.rand(b, hkv) + 0.5 for _ in range(3)]
        kw.update(q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    if cache == "paged":  # sequence i's cache in pages perm[i * 6 + c], c = 0 .. 5
        perm = torch.randperm(b * length // page)
        k_pages, v_pages = torch.empty(b * length // page, page, hkv, d), torch.empty(b * length // page, page, hkv, d)
        k_pages[perm] = full_k.reshape(-1, page, hkv, d)
        v_pages[perm] = full_v.reshape(-1, page, hkv, d)
        table = perm.to(torch.int32).reshape(b, length // page)
        out, lse = fa3.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, page_table=table, **kw)
        k_after = k_pages[perm].reshape(b, length, hkv, d)
        v_after = v_pages[perm].reshape(b, length, hkv, d)
    else:
        k_cache, v_cache = full_k.clone(), full_v.clone()
        out, lse = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kw)
        k_after, v_after = k_cache, v_cache
    assert out.shape == (b, s_q, h, d) and lse.shape == (b, h, s_q)
    for i in range(b):
        e = int(entries[i]) if entries is not None else i
        end = int(lens[i]) + (2 if append else 0)
        if append:  # the new keys at cache_seqlens
            assert torch.equal(k_after[e, int(lens[i]):end], k_new[i]) and torch.equal(v_after[e, int(lens[i]):end], v_new[i])
        p = int(pad[i]) if pad is not None else 0
        qi, ki, vi = q[i:i + 1], k_after[e:e + 1, p:end], v_after[e:e + 1, p:end]
        if descales is not None:
            qi = qi * descales[0][i].repeat_interleave(h // hkv)[None, None, :, None]
            ki, vi = ki * descales[1][i][None, None, :, None], vi * descales[2][i][None, None, :, None]
        ref, ref_lse = _chunked_f64(qi, ki, vi, chunk, causal, window)
        assert torch.allclose(out[i:i + 1].double(), ref, atol=1e-5), i
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse[i:i + 1]), finite), i
        assert torch.allclose(lse[i:i + 1].double()[finite], ref_lse[finite], atol=1e-5), i


def test_cache_as_packed_rows():
    """A contiguous cache read as packed key rows (cache_leftpad outside fa3's own call: e4m3 caches,
    descales; attention_chunk): the caches viewed in place, each sequence's rows its cache entry's
    (cache_batch_idx) from its padding on, as many as it has past the padding, clamped as fa3's
    call clamps them (the end to the cache, the padding to the end); batch strides that are not
    whole rows (with more than one entry), rows per entry that differ between k_cache and v_cache,
    and a cache_leftpad of another length are named."""
    from fa3._kvcache import cache_rows as _cache_rows
    b, length, h, d = 4, 10, 2, 4
    k = torch.randn(b, length + 2, h, d)[:, :length]  # a batch stride of 12 rows
    v = torch.randn(b, length + 2, h, d)[:, :length]
    pad = torch.tensor([0, 3, 12, -2], dtype=torch.int32)  # past the cache, negative: clamped
    used = torch.tensor([5, 10, 10, 14], dtype=torch.int32)  # the last past the cache: clamped
    entries = torch.tensor([3, 0, 2, 1], dtype=torch.int32)
    for seqused, leftpad, order in ((used, pad, None), (None, pad, None), (used, None, entries)):
        kr, vr, first, count = _cache_rows(k, v, b, leftpad, seqused, order)
        assert kr.data_ptr() == k.data_ptr() and vr.data_ptr() == v.data_ptr() and kr.shape[0] == 3 * 12 + length
        assert first.dtype == torch.int32 and count.dtype == torch.int32 and first.shape == count.shape == (b,)
        for i in range(b):
            e = int(order[i]) if order is not None else i
            end = min(int(seqused[i]) if seqused is not None else length, length)
            p = min(max(int(leftpad[i]), 0), end) if leftpad is not None else 0
            assert int(first[i]) == 12 * e + p and int(count[i]) == end - p
            rows = slice(int(first[i]), int(first[i]) + end - p)
            assert torch.equal(kr[rows], k[e, p:end]) and torch.equal(vr[rows], v[e, p:end])
    one = torch.randn(1, length, h, d).as_strided((1, length, h, d), (7, h * d, d, 1))  # any batch stride
    kr, _, first, count = _cache_rows(one, one, 1, torch.tensor([2], dtype=torch.int32), None)
    assert first.tolist() == [2] and count.tolist() == [length - 2] and kr.shape[0] == length
    with pytest.raises(ValueError, match="cache_leftpad: expected shape"):
        _cache_rows(k, v, b, pad[:1], used)
    with pytest.raises(ValueError, match="k_cache: expected one entry per sequence"):
        _cache_rows(k, v, b + 1, None, None)
    with pytest.raises(ValueError, match="same rows per batch entry"):
        _cache_rows(k, torch.randn(b, length, h, d), b, pad, used)
    with pytest.raises(ValueError, match="v_cache: expected the batch and length"):
        _cache_rows(k, v[:, :5], b, pad, used)
    odd = torch.randn(b * length * h * d + b).as_strided((b, length, h, d), (length * h * d + 1, h * d, d, 1))
    with pytest.raises(ValueError, match="v_cache: its batch stride"):
        _cache_rows(k, odd, b, pad, used)
