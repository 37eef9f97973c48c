"""fa3.hf on a Hopper GPU with the real kernels: a tiny bf16 Llama under attn_implementation="fa3" against
"sdpa" (logits, parameter gradients, padded / packed / cached batches) and a short training run.

Tolerance: bf16 models, relative error ||a - b|| / ||b|| <= 2e-2 per tensor.
"""

import copy

import pytest
import torch

import test_hf  # the CPU tests' helpers (python/tests is on sys.path: conftest.py)

import fa3  # noqa: F401 (from the source tree, conftest.py, or installed)
import util
from util import count_calls, skip_unless_hopper

skip_unless_hopper()

transformers = pytest.importorskip("transformers")

import fa3.hf  # noqa: E402
from fa3 import interface  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

NAME = fa3.hf.register()
DEVICE = "cuda"
TOL = 2e-2
VOCAB = 512
LAYERS = 2


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the calls that reach fa3's kernels (so a silent fallback would show), calling the real ones."""
    return count_calls(monkeypatch, interface, dense="flash_attn_func", varlen="flash_attn_varlen_func")


def llama_config(head_dim):
    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS, num_attention_heads=8,
                       num_key_value_heads=2, head_dim=head_dim, vocab_size=VOCAB, max_position_embeddings=1024,
                       pad_token_id=0)


def model_pair(config, dtype=torch.bfloat16, reference="sdpa", seed=0):
    """The same random weights under `reference` and under fa3, on the GPU."""
    torch.manual_seed(seed)
    # Separate config copies: the implementation name lives on the config.
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=reference)
    ref = ref.to(device=DEVICE, dtype=dtype).eval()
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=NAME)
    ours = ours.to(device=DEVICE, dtype=dtype).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def rel_err(a, b):
    return util.rel_err(a, b, floor=0.0)  # model outputs and gradients: no zero references


def assert_rel(a, b, what, tol=TOL):
    err = rel_err(a, b)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.0e}"


def assert_grads_rel(ref, ours):
    named_ref = dict(ref.named_parameters())
    checked = 0
    for name, p in ours.named_parameters():
        g_ref = named_ref[name].grad
        assert (p.grad is None) == (g_ref is None), name
        if g_ref is not None:
            assert_rel(p.grad, g_ref, f"grad {name}")
            checked += 1
    assert checked > 0


def weighted_loss(logits, weights, keep=None):
    terms = logits.float() * weights
    if keep is not None:
        terms = terms[keep]
    return terms.sum() / terms.numel() ** 0.5


def padding_mask(lengths, total, side):
    return test_hf.padding_mask(lengths, total, side).to(DEVICE)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_dense_logits_and_grads_match_sdpa(kernel_calls, head_dim):
    ref, ours = model_pair(llama_config(head_dim))
    ids = torch.randint(1, VOCAB, (3, 173), device=DEVICE)
    weights = torch.randn(3, 173, VOCAB, device=DEVICE)
    out_ref, out = ref(ids).logits, ours(ids).logits
    assert_rel(out, out_ref, "logits")
    assert kernel_calls == {"dense": LAYERS, "varlen": 0}
    weighted_loss(out_ref, weights).backward()
    weighted_loss(out, weights).backward()
    assert_grads_rel(ref, ours)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_padded_logits_and_grads_match_sdpa(kernel_calls, side, head_dim):
    ref, ours = model_pair(llama_config(head_dim))
    lengths, total = [150, 97, 31, 150], 150
    ids = torch.randint(1, VOCAB, (4, total), device=DEVICE)
    mask = padding_mask(lengths, total, side)
    keep = mask.bool()
    weights = torch.randn(4, total, VOCAB, device=DEVICE)
    out_ref = ref(ids, attention_mask=mask).logits
    out = ours(ids, attention_mask=mask).logits
    assert_rel(out[keep], out_ref[keep], f"{side}-padded logits")
    assert kernel_calls == {"dense": 0, "varlen": LAYERS}
    weighted_loss(out_ref, weights, keep).backward()
    weighted_loss(out, weights, keep).backward()
    assert_grads_rel(ref, ours)


@pytest.mark.parametrize("via", ["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_packed_logits_and_grads_match_separate_sdpa(kernel_calls, via, head_dim):
    from transformers import DataCollatorWithFlattening

    ref, ours = model_pair(llama_config(head_dim))
    lengths = [77, 130, 1, 45]
    seqs = [torch.randint(1, VOCAB, (n,), device=DEVICE) for n in lengths]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=via == "cu_seq_lens")(
        [{"input_ids": s.tolist()} for s in seqs])
    batch.pop("labels")
    batch = {k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in batch.items()}
    weights = torch.randn(sum(lengths), VOCAB, device=DEVICE)

    expected = torch.cat([ref(s[None]).logits[0] for s in seqs])
    got = ours(**batch).logits[0]
    assert_rel(got, expected, f"packed ({via}) logits")
    assert kernel_calls == {"dense": 0, "varlen": LAYERS}
    weighted_loss(expected, weights).backward()
    weighted_loss(got, weights).backward()
    assert_grads_rel(ref, ours)


def test_cached_decode_matches_sdpa(kernel_calls):
    ref, ours = model_pair(llama_config(128))
    ids = torch.randint(1, VOCAB, (3, 90), device=DEVICE)
    mask = padding_mask([90, 60, 17], 90, "left")
    new = torch.randint(1, VOCAB, (3, 4), device=DEVICE)
    results = []
    with torch.no_grad():
        for model in (ref, ours):
            out = model(ids, attention_mask=mask, use_cache=True)
            logits, past, full = [out.logits[:, -1]], out.past_key_values, mask
            for step in range(new.shape[1]):
                full = torch.cat([full, torch.ones(3, 1, dtype=full.dtype, device=DEVICE)], dim=1)
                out = model(new[:, step:step + 1], attention_mask=full, past_key_values=past, use_cache=True)
                logits.append(out.logits[:, -1])
                past = out.past_key_values
            results.append(torch.stack(logits, dim=1))
    assert_rel(results[1], results[0], "cached decode logits")
    assert kernel_calls["varlen"] == 5 * LAYERS


def test_gemma2_sliding_window_and_softcap_match_eager(kernel_calls):
    from transformers import Gemma2Config

    config = Gemma2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                          num_key_value_heads=2, head_dim=64, vocab_size=VOCAB, max_position_embeddings=1024,
                          sliding_window=48, attn_logit_softcapping=20.0, final_logit_softcapping=None,
                          query_pre_attn_scalar=64, layer_types=["sliding_attention", "full_attention"],
                          pad_token_id=0)
    ref, ours = model_pair(config, reference="eager")
    ids = torch.randint(1, VOCAB, (2, 160), device=DEVICE)
    mask = padding_mask([160, 111], 160, "right")
    keep = mask.bool()
    weights = torch.randn(2, 160, VOCAB, device=DEVICE)
    out_ref = ref(ids, attention_mask=mask).logits
    out = ours(ids, attention_mask=mask).logits
    assert_rel(out[keep], out_ref[keep], "gemma2 logits")
    weighted_loss(out_ref, weights, keep).backward()
    weighted_loss(out, weights, keep).backward()
    assert_grads_rel(ref, ours)


@pytest.mark.parametrize("precision", ["bf16", "autocast"])
def test_training_run_tracks_sdpa(kernel_calls, precision):
    """20 AdamW steps on one fixed random batch: both implementations learn it, along the same curve.
    "autocast" keeps float32 weights, so fp32 queries reach attention and are cast to bf16 on the way."""
    config = llama_config(64)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(1234)
    # Enough tokens that 20 steps stay on the smooth part of the curve (a tiny batch is memorised within
    # 20 steps, and there bf16 rounding alone moves the final loss by a few percent between implementations).
    ids = torch.randint(1, VOCAB, (8, 256), device=DEVICE)
    curves = {}
    for impl in ("sdpa", NAME):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl)
        model = model.to(device=DEVICE, dtype=dtype).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(20):
            with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=precision == "autocast"):
                loss = model(ids, labels=ids).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        curves[impl] = losses
    assert kernel_calls["dense"] == 20 * LAYERS

    for impl, losses in curves.items():
        assert all(torch.isfinite(torch.tensor(losses))), f"{impl}: {losses}"
        assert losses[-1] < 0.8 * losses[0], f"{impl} did not learn: {losses}"
    first_ref, last_ref = curves["sdpa"][0], curves["sdpa"][-1]
    first, last = curves[NAME][0], curves[NAME][-1]
    assert abs(first - first_ref) <= 1e-2 * first_ref, (curves["sdpa"], curves[NAME])
    assert abs(last - last_ref) <= 2e-2 * last_ref, (curves["sdpa"], curves[NAME])
