"""fa3.hf on CPU: the transformers integration with fa3's kernels replaced by a float64 math stand-in.

The stand-in implements FlashAttention semantics (bottom-right causal, windows, softcap, GQA, varlen), so a
tiny random Llama / Gemma2 run with attn_implementation="fa3" must reproduce "eager": this checks what the
integration hands to the kernels (layouts, cu_seqlens, max lengths, flags) for dense, padded, packed and
cached batches, and the gradients through the gather/scatter.
"""

import copy

import pytest
import torch

import fa3  # from the source tree (conftest.py) or installed

transformers = pytest.importorskip("transformers")

import fa3.hf  # noqa: E402
from fa3 import interface  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

NAME = fa3.hf.register()


# ---------------------------------------------------------------- float64 math stand-in for the kernels


def _reference(q, k, v, softmax_scale, causal, window_size, softcap, sink=None):
    """One sequence: q [s_q, h_q, d], k [s_k, h_kv, d], v [s_k, h_kv, d_v] -> [s_q, h_q, d_v] (float64 math);
    sink: [h_q] logits joining each row's softmax denominator (gpt-oss), or None."""
    s_q, h_q, d = q.shape
    s_k, h_kv = k.shape[:2]
    assert h_q % h_kv == 0, "GQA needs h_q divisible by h_kv"
    group = h_q // h_kv
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    kf = k.double().repeat_interleave(group, dim=1)
    vf = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kf) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(s_q)[:, None] + (s_k - s_q)  # bottom-right alignment
    j = torch.arange(s_k)[None, :]
    allowed = torch.ones(s_q, s_k, dtype=torch.bool)
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sink is not None:  # one more logit per row, dropped after the softmax (it has no value)
        column = sink.double().reshape(h_q, 1, 1).expand(h_q, s_q, 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
        return torch.einsum("hqk,khd->qhd", probs, vf).to(q.dtype)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows without keys give 0, as fa3
    return torch.einsum("hqk,khd->qhd", probs, vf).to(q.dtype)


class StandIn:
    """Replaces interface.flash_attn_func / flash_attn_varlen_func; records every call."""

    def __init__(self):
        self.calls = []

    def dense(self, q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
              deterministic=False, **rest):
        assert q.dim() == 4 and k.dim() == 4 and v.dim() == 4
        assert q.shape[0] == k.shape[0] and k.shape[1] == v.shape[1]
        assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
        self.calls.append(dict(kind="dense", q_shape=tuple(q.shape), k_shape=tuple(k.shape),
                               softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size),
                               softcap=softcap, rest=rest))
        return torch.stack([_reference(q[b], k[b], v[b], softmax_scale, causal, window_size, softcap,
                                       rest.get("learnable_sink")) for b in range(q.shape[0])])

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
               causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False, **rest):
        assert q.dim() == 3 and k.dim() == 3 and v.dim() == 3
        assert cu_seqlens_q.dtype == torch.int32 and cu_seqlens_k.dtype == torch.int32
        assert isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        assert len(cq) == len(ck) and cq[0] == 0 and ck[0] == 0
        assert cq[-1] == q.shape[0] and ck[-1] == k.shape[0] == v.shape[0]
        # The integration computes exact maxima; check them exactly.
        assert max_seqlen_q == max(b - a for a, b in zip(cq, cq[1:]))
        assert max_seqlen_k == max(b - a for a, b in zip(ck, ck[1:]))
        self.calls.append(dict(kind="varlen", cu_q=cq, cu_k=ck, max_q=max_seqlen_q, max_k=max_seqlen_k,
                               softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size),
                               softcap=softcap, rest=rest))
        pieces = [_reference(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]], softmax_scale, causal,
                             window_size, softcap, rest.get("learnable_sink")) for i in range(len(cq) - 1)]
        return torch.cat(pieces)

    def count(self, kind):
        return sum(c["kind"] == kind for c in self.calls)


@pytest.fixture
def standin(monkeypatch):
    s = StandIn()
    monkeypatch.setattr(interface, "flash_attn_func", s.dense)
    monkeypatch.setattr(interface, "flash_attn_varlen_func", s.varlen)
    return s


# ---------------------------------------------------------------- tiny models

LAYERS = 2


def llama_config(**overrides):
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, pad_token_id=0)
    kw.update(overrides)
    return LlamaConfig(**kw)


def model_pair(config, reference="eager", seed=0):
    """The same random weights under `reference` and under fa3, float32, eval mode."""
    torch.manual_seed(seed)
    # Each model gets its own config copy: the implementation name is stored on the config.
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=reference).float().eval()
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=NAME).float().eval()
    ours.load_state_dict(ref.state_dict())
    assert ref.config._attn_implementation == reference and ours.config._attn_implementation == NAME
    return ref, ours


def assert_close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, msg=lambda m: f"{what}: {m}")


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(ref, ours):
    g_ref, g_ours = grads(ref), grads(ours)
    assert g_ref.keys() == g_ours.keys() and g_ref
    for n in g_ref:
        # Gradients sum over many float32 terms (embedding rows reach |g| ~ 10): a looser absolute floor.
        torch.testing.assert_close(g_ours[n], g_ref[n], rtol=1e-3, atol=1e-4, msg=lambda m: f"grad {n}: {m}")


def weighted_loss(logits, weights, keep=None):
    """A loss whose gradient touches every logit that counts (random weights, optional position selection)."""
    terms = logits * weights
    if keep is not None:
        terms = terms[keep]
    return terms.sum()


# ---------------------------------------------------------------- registration and names


def test_register_is_idempotent_and_model_takes_the_name():
    assert fa3.hf.register() == NAME == "fa3"
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert AttentionInterface._global_mapping[NAME] is fa3.hf.attention_forward
    assert NAME in AttentionMaskInterface._global_mapping
    model = AutoModelForCausalLM.from_config(llama_config(), attn_implementation=NAME)
    assert model.config._attn_implementation == NAME


@pytest.mark.parametrize("bad", ["my_flash", "flash_attention_3", "fa3_sdpa", "flex_attention_x", "org/repo",
                                 "paged|fa3", "eager", ""])
def test_register_refuses_names_transformers_interprets(bad):
    with pytest.raises(ValueError, match="name"):
        fa3.hf.register(bad)


def test_register_under_another_name(standin):
    name = fa3.hf.register("fa3_custom")
    model = AutoModelForCausalLM.from_config(llama_config(), attn_implementation=name).eval()
    with torch.no_grad():
        model(torch.randint(1, 128, (2, 9)))
    assert standin.count("dense") == LAYERS


def test_set_attn_implementation_switches_to_fa3(standin):
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(llama_config(), attn_implementation="eager").eval()
    ids = torch.randint(1, 128, (2, 11))
    with torch.no_grad():
        expected = model(ids).logits
        model.set_attn_implementation(NAME)
        assert model.config._attn_implementation == NAME
        got = model(ids).logits
    assert standin.count("dense") == LAYERS
    assert_close(got, expected, "logits after set_attn_implementation")


# ---------------------------------------------------------------- dense


def test_no_padding_matches_eager_and_calls_dense(standin):
    ref, ours = model_pair(llama_config())
    ids = torch.randint(1, 128, (3, 17))
    weights = torch.randn(3, 17, 128)
    out_ref = ref(ids).logits
    out = ours(ids).logits
    assert_close(out, out_ref, "logits")

    assert standin.count("dense") == LAYERS and standin.count("varlen") == 0
    call = standin.calls[0]
    assert call["q_shape"] == (3, 17, 4, 16) and call["k_shape"] == (3, 17, 2, 16)  # GQA: k/v not repeated
    assert call["causal"] is True and call["window_size"] == (-1, -1) and call["softcap"] == 0.0
    assert call["softmax_scale"] == pytest.approx(16**-0.5)

    weighted_loss(out_ref, weights).backward()
    weighted_loss(out, weights).backward()
    assert_grads_close(ref, ours)


def test_batch_of_one_with_plain_positions_stays_dense(standin):
    ref, ours = model_pair(llama_config())
    ids = torch.randint(1, 128, (1, 13))
    with torch.no_grad():
        assert_close(ours(ids).logits, ref(ids).logits, "logits")
        # Explicit contiguous positions that do not start at 0 are one sequence too.
        pos = torch.arange(5, 18)[None]
        assert_close(ours(ids, position_ids=pos).logits, ref(ids, position_ids=pos).logits, "offset logits")
    assert standin.count("dense") == 2 * LAYERS and standin.count("varlen") == 0


def test_all_ones_mask_is_dense(standin):
    ref, ours = model_pair(llama_config())
    ids = torch.randint(1, 128, (2, 8))
    with torch.no_grad():
        assert_close(ours(ids, attention_mask=torch.ones(2, 8, dtype=torch.long)).logits, ref(ids).logits, "logits")
    assert standin.count("dense") == LAYERS and standin.count("varlen") == 0


# ---------------------------------------------------------------- padding


def padding_mask(lengths, total, side):
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        if side == "right":
            mask[row, :n] = 1
        else:
            mask[row, total - n:] = 1
    return mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_mask_matches_eager_on_valid_tokens(standin, side):
    ref, ours = model_pair(llama_config())
    lengths, total = [14, 9, 3], 14
    ids = torch.randint(1, 128, (3, total))
    mask = padding_mask(lengths, total, side)
    keep = mask.bool()
    weights = torch.randn(3, total, 128)

    out_ref = ref(ids, attention_mask=mask).logits
    out = ours(ids, attention_mask=mask).logits
    assert_close(out[keep], out_ref[keep], f"{side}-padded logits")

    assert standin.count("varlen") == LAYERS and standin.count("dense") == 0
    call = standin.calls[0]
    assert call["cu_q"] == call["cu_k"] == [0, 14, 23, 26]
    assert call["max_q"] == 14

    weighted_loss(out_ref, weights, keep).backward()
    weighted_loss(out, weights, keep).backward()
    assert_grads_close(ref, ours)


def test_padded_rows_come_back_as_zeros_from_attention():
    # The scatter back leaves padding rows at 0 (fa3's own convention for rows without keys).
    class Module(torch.nn.Module):
        is_causal = True

    calls = StandIn()
    q = torch.randn(2, 4, 6, 8)
    k, v = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = padding_mask([6, 2], 6, "left").bool()
    orig = interface.flash_attn_varlen_func
    interface.flash_attn_varlen_func = calls.varlen
    try:
        out, weights = fa3.hf.attention_forward(Module(), q, k, v, mask)
    finally:
        interface.flash_attn_varlen_func = orig
    assert weights is None and out.shape == (2, 6, 4, 8)
    assert torch.all(out[1, :4] == 0) and torch.all(out[1, 4:] != 0)
    expected = _reference(q[1, :, 4:].transpose(0, 1), k[1, :, 4:].transpose(0, 1), v[1, :, 4:].transpose(0, 1),
                          None, True, (-1, -1), 0.0)
    assert_close(out[1, 4:], expected, "left-padded row")


@pytest.mark.parametrize("q_len", [3, 7, 10])
def test_cross_attention_keeps_every_query(monkeypatch, q_len):
    # Not causal, mask over the keys only (encoder padding): fewer, as many (the decoder padded to the
    # encoder's length: its queries at the encoder's padded positions are real tokens) or more queries.
    class Module(torch.nn.Module):
        is_causal = False

    calls = StandIn()
    monkeypatch.setattr(interface, "flash_attn_varlen_func", calls.varlen)
    q = torch.randn(2, 4, q_len, 8)
    k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    mask = padding_mask([7, 4], 7, "right").bool()
    out, _ = fa3.hf.attention_forward(Module(), q, k, v, mask)
    assert calls.calls[0]["cu_q"] == [0, q_len, 2 * q_len] and calls.calls[0]["cu_k"] == [0, 7, 11]
    for b, n in enumerate([7, 4]):
        expected = _reference(q[b].transpose(0, 1), k[b, :, :n].transpose(0, 1), v[b, :, :n].transpose(0, 1),
                              None, False, (-1, -1), 0.0)
        assert_close(out[b], expected, f"cross-attention row {b}")


# ---------------------------------------------------------------- cache: queries shorter than keys


@pytest.mark.parametrize("padded", [False, True])
def test_decode_with_cache_matches_eager(standin, padded):
    ref, ours = model_pair(llama_config())
    ids = torch.randint(1, 128, (2, 10))
    mask = padding_mask([10, 6], 10, "left") if padded else None
    new = torch.randint(1, 128, (2, 3))
    results = []
    with torch.no_grad():
        for model in (ref, ours):
            first = model(ids, attention_mask=mask, use_cache=True)
            logits = [first.logits[:, -1]]
            past = first.past_key_values
            full_mask = mask
            for step in range(new.shape[1]):  # one token at a time: s_q = 1, s_k grows
                if full_mask is not None:
                    full_mask = torch.cat([full_mask, torch.ones(2, 1, dtype=full_mask.dtype)], dim=1)
                out = model(new[:, step:step + 1], attention_mask=full_mask, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits.append(out.logits[:, -1])
            # and a chunk of two tokens (s_q = 2 < s_k)
            if full_mask is not None:
                full_mask = torch.cat([full_mask, torch.ones(2, 2, dtype=full_mask.dtype)], dim=1)
            out = model(new[:, :2], attention_mask=full_mask, past_key_values=past, use_cache=True)
            logits.append(out.logits.reshape(2, -1))
            results.append(torch.cat(logits, dim=1))
    assert_close(results[1], results[0], "cached decode logits")
    kind = "varlen" if padded else "dense"
    assert standin.count(kind) == 5 * LAYERS and len(standin.calls) == 5 * LAYERS
    if padded:
        step = standin.calls[LAYERS]  # first single-token step
        assert step["cu_q"] == [0, 1, 2] and step["cu_k"] == [0, 11, 18] and step["max_q"] == 1


# ---------------------------------------------------------------- packed (padding-free) batches


def packed_inputs(lengths):
    seqs = [torch.randint(1, 128, (n,)) for n in lengths]
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    return seqs, ids, pos


def separate_logits(model, seqs):
    return torch.cat([model(s[None]).logits[0] for s in seqs])


def test_packed_via_position_ids_matches_separate_sequences(standin):
    ref, ours = model_pair(llama_config())
    lengths = [5, 8, 1, 4]
    seqs, ids, pos = packed_inputs(lengths)
    weights = torch.randn(sum(lengths), 128)

    expected = separate_logits(ref, seqs)
    got = ours(ids, position_ids=pos).logits[0]
    assert_close(got, expected, "packed logits")
    assert standin.count("varlen") == LAYERS and standin.count("dense") == 0
    assert standin.calls[0]["cu_q"] == [0, 5, 13, 14, 18] and standin.calls[0]["max_q"] == 8
    # eager builds the same block-diagonal mask from these position_ids (only without a cache: transformers
    # looks for packed sequences when past_key_values is None)
    with torch.no_grad():
        packed_ref = ref(ids, position_ids=pos, use_cache=False).logits[0]
    assert_close(got.detach(), packed_ref, "packed logits vs packed eager")

    weighted_loss(expected, weights).backward()
    weighted_loss(got, weights).backward()
    assert_grads_close(ref, ours)


def test_packed_via_cu_seq_lens_kwargs_from_the_collator(standin, monkeypatch):
    from transformers import DataCollatorWithFlattening

    # Make sure the kwargs, not the position_ids, decide the layout.
    def no_position_ids(_):
        raise AssertionError("position_ids were read although cu_seq_lens were given")

    monkeypatch.setattr(fa3.hf, "_layout_from_position_ids", no_position_ids)

    ref, ours = model_pair(llama_config())
    lengths = [6, 3, 7]
    seqs, _, _ = packed_inputs(lengths)
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": s.tolist()} for s in seqs])
    labels = batch.pop("labels")
    assert batch["cu_seq_lens_q"].tolist() == [0, 6, 9, 16] and batch["max_length_q"] == 7
    weights = torch.randn(sum(lengths), 128)

    expected = separate_logits(ref, seqs)
    out = ours(**batch)
    got = out.logits[0]
    assert_close(got, expected, "packed logits")
    assert standin.count("varlen") == LAYERS and standin.calls[0]["cu_q"] == [0, 6, 9, 16]

    weighted_loss(expected, weights).backward()
    weighted_loss(got, weights).backward()
    assert_grads_close(ref, ours)

    # The collator's labels (separator at each sequence start) train like the separate sequences.
    ref.zero_grad()
    ours.zero_grad()
    loss = ours(**batch, labels=labels).loss
    loss_ref = ref(batch["input_ids"], position_ids=batch["position_ids"], labels=labels, use_cache=False).loss
    assert_close(loss, loss_ref, "packed loss")


def test_cu_seq_lens_without_max_lengths(standin):
    ref, ours = model_pair(llama_config())
    lengths = [4, 9]
    seqs, ids, pos = packed_inputs(lengths)
    cu = torch.tensor([0, 4, 13], dtype=torch.int64)  # int64 on purpose: converted to int32
    with torch.no_grad():
        got = ours(ids, position_ids=pos, cu_seq_lens_q=cu).logits[0]
        assert_close(got, separate_logits(ref, seqs), "packed logits")
    assert standin.calls[0]["max_q"] == standin.calls[0]["max_k"] == 9


# ---------------------------------------------------------------- sliding window + softcap (Gemma2)


def gemma2_config():
    from transformers import Gemma2Config

    return Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=256,
                        sliding_window=4, attn_logit_softcapping=2.0, final_logit_softcapping=None,
                        query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"],
                        pad_token_id=0)


@pytest.mark.parametrize("padded", [False, True])
def test_gemma2_sliding_window_and_softcap_match_eager(standin, padded):
    ref, ours = model_pair(gemma2_config())
    ids = torch.randint(1, 128, (2, 12))
    mask = padding_mask([12, 7], 12, "right") if padded else None
    keep = mask.bool() if padded else torch.ones(2, 12, dtype=torch.bool)
    weights = torch.randn(2, 12, 128)

    out_ref = ref(ids, attention_mask=mask).logits
    out = ours(ids, attention_mask=mask).logits
    assert_close(out[keep], out_ref[keep], "gemma2 logits")

    sliding, full = standin.calls[0], standin.calls[1]
    assert sliding["window_size"] == (3, 0) and full["window_size"] == (-1, -1)
    assert sliding["softcap"] == full["softcap"] == 2.0
    assert sliding["softmax_scale"] == pytest.approx(16**-0.5)

    weighted_loss(out_ref, weights, keep).backward()
    weighted_loss(out, weights, keep).backward()
    assert_grads_close(ref, ours)


def test_window_semantics():
    assert fa3.hf._window_size(None, True, 100) == (-1, -1)
    assert fa3.hf._window_size(8, True, 8) == (-1, -1)  # window covers every key
    assert fa3.hf._window_size(8, True, 9) == (7, 0)
    assert fa3.hf._window_size(8, False, 9) == (7, 7)


# ---------------------------------------------------------------- refusals


def test_dropout_in_training_is_refused(standin):
    model = AutoModelForCausalLM.from_config(llama_config(attention_dropout=0.1), attn_implementation=NAME)
    model.train()
    with pytest.raises(ValueError, match="dropout"):
        model(torch.randint(1, 128, (1, 6)))
    model.eval()  # no dropout at inference: fine
    with torch.no_grad():
        model(torch.randint(1, 128, (1, 6)))
    assert standin.count("dense") == LAYERS


def test_four_d_mask_is_refused(standin):
    model = AutoModelForCausalLM.from_config(llama_config(), attn_implementation=NAME).eval()
    mask = torch.zeros(1, 1, 6, 6)
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.randint(1, 128, (1, 6)), attention_mask=mask)


def gpt_oss_config():
    from transformers import GptOssConfig

    return GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                        vocab_size=128, max_position_embeddings=256, sliding_window=4, pad_token_id=0)


@pytest.mark.parametrize("padded", [False, True])
def test_gpt_oss_sinks_match_eager(standin, padded):
    # gpt-oss passes its learnable sinks as s_aux: they reach the kernel as learnable_sink, and their
    # gradient comes back through it (the stand-in's float64 math here; the kernels in test_hf_gpu /
    # test_interface_gpu).
    ref, ours = model_pair(gpt_oss_config())
    with torch.no_grad():
        for m in (ref, ours):
            for layer in m.model.layers:
                layer.self_attn.sinks.copy_(torch.linspace(-1.0, 2.0, 4))
    ids = torch.randint(1, 128, (2, 9))
    mask = padding_mask([9, 6], 9, "left") if padded else None
    logits_ref = ref(ids, attention_mask=mask).logits
    logits = ours(ids, attention_mask=mask).logits
    keep = mask.bool() if padded else None
    assert_close(logits[keep] if padded else logits, logits_ref[keep] if padded else logits_ref, "logits")
    assert all(c["rest"].get("learnable_sink") is not None for c in standin.calls)
    weights = torch.randn_like(logits)
    weighted_loss(logits_ref, weights, keep).backward()
    weighted_loss(logits, weights, keep).backward()
    assert_grads_close(ref, ours)
    assert ours.model.layers[0].self_attn.sinks.grad.abs().sum() > 0


def test_chunked_mask_guard():
    from transformers import masking_utils as mu

    chunked = mu.chunked_causal_mask_function(8, torch.zeros(1, dtype=torch.long))
    assert fa3.hf._has_chunked_pattern(chunked)
    assert fa3.hf._has_chunked_pattern(mu.and_masks(chunked, mu.padding_mask_function(torch.ones(1, 4))))
    assert not fa3.hf._has_chunked_pattern(mu.causal_mask_function)
    assert not fa3.hf._has_chunked_pattern(mu.sliding_window_causal_mask_function(4))

    mask_fn = mu.ALL_MASK_ATTENTION_FUNCTIONS[NAME]
    config = llama_config()
    config.attention_chunk_size = 8
    with pytest.raises(ValueError, match="attention_chunk_size"):
        mask_fn(batch_size=1, q_length=9, kv_length=9, mask_function=chunked, attention_mask=None, config=config)
    assert mask_fn(batch_size=1, q_length=8, kv_length=8, mask_function=chunked, attention_mask=None,
                   config=config) is None
    pad = torch.tensor([[False, True, True]])
    assert torch.equal(mask_fn(batch_size=1, q_length=3, kv_length=3, attention_mask=pad), pad)


# ---------------------------------------------------------------- helpers


def test_layout_cache_follows_identity_and_in_place_edits():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    first = fa3.hf._unpad_indices(mask, 3)
    assert fa3.hf._unpad_indices(mask, 3) is first  # second layer of the same forward: no new sync
    assert first[2].tolist() == [0, 2, 3] and first[3] == 2
    mask[1, 1] = True  # in place: the version counter changes
    second = fa3.hf._unpad_indices(mask, 3)
    assert second is not first and second[2].tolist() == [0, 2, 4]
    assert fa3.hf._unpad_indices(mask.clone(), 3) is not second


def test_position_id_layout():
    layout = fa3.hf._layout_from_position_ids
    assert layout(torch.arange(6)[None]) is None
    cu, max_len = layout(torch.tensor([[0, 1, 2, 0, 1, 0]]))
    assert cu.tolist() == [0, 3, 5, 6] and cu.dtype == torch.int32 and max_len == 3
    # a row that starts mid-sequence still covers its first tokens
    cu, max_len = layout(torch.tensor([[4, 5, 0, 1, 2]]))
    assert cu.tolist() == [0, 2, 5] and max_len == 3
    # RoBERTa-like numbering starting at 2
    cu, _ = layout(torch.tensor([[2, 3, 2, 3, 4]]))
    assert cu.tolist() == [0, 2, 5]


def test_float32_is_cast_to_the_model_dtype():
    module = torch.nn.Linear(4, 4).to(torch.bfloat16)
    q = torch.randn(1, 2, 3, 4)
    out = fa3.hf._cast_for_kernel(q, q, q, module)
    assert all(t.dtype == torch.bfloat16 for t in out)
    module32 = torch.nn.Linear(4, 4)
    assert all(t is q for t in fa3.hf._cast_for_kernel(q, q, q, module32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert all(t.dtype == torch.bfloat16 for t in fa3.hf._cast_for_kernel(q, q, q, module32))
