"""fa3.distributed on one Hopper GPU: rings of 2 and 4 virtual ranks (threads, each calling fa3's
operators) against single-GPU fa3 and float64, BSHD and packed, causal and not, both layouts; the
head-parallel layer over 2 and 4 threads against single-GPU fa3; the public functions over a one-rank
NCCL group with autograd; PyTorch's own context_parallel running
through fa3's SDPA route. (Two GPUs: bench/ring_bench.py --distributed under torchrun.)"""

import os
import socket

import pytest
import torch
import torch.distributed as dist

import fa3
import fa3.distributed as cp
from fa3 import _ops
from fa3.distributed.blocks import Fa3Blocks
from fa3.distributed.hybrid import grid_spec, hybrid_backward, hybrid_forward, shard_2d, unshard_2d
from fa3.distributed.ring import RingSpec, ring_backward, ring_forward
from fa3.distributed.rows import ShardRows
from fa3.distributed.ulysses import Packing, UlyssesSpec, ulysses_backward, ulysses_forward
from ring_util import ThreadGroup, ThreadRing, attention_reference
from util import count_calls, rel_err, skip_unless_hopper

skip_unless_hopper()

DEV = "cuda"


def _single_gpu(q, k, v, dout, causal, cu, max_seqlen, scale):
    """fa3 on the whole sequence: (out, lse, (dq, dk, dv))."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    if cu is None:
        out, lse = fa3.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_attn_probs=True)
    else:
        out, lse = fa3.flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, softmax_scale=scale,
                                              causal=causal, return_attn_probs=True)
    out.backward(dout)
    return out.detach(), lse, (q.grad, k.grad, v.grad)


def _shard_rows(ql, cu_local):
    if cu_local is None:
        return ShardRows(seqlen=ql.shape[1])
    lengths = (cu_local[1:] - cu_local[:-1]).tolist()
    return ShardRows(cu_seqlens=cu_local, max_seqlen=max(lengths), total=ql.shape[0])


@pytest.mark.parametrize("packed", [False, True], ids=["bshd", "packed"])
@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("world", [2, 4])
def test_thread_ring_on_fa3_matches_single_gpu(world, causal, layout, packed):
    torch.manual_seed(world * 100 + causal * 10 + packed)
    h, hkv, d, dtype, scale = 8, 2, 128, torch.bfloat16, 0.088
    parts = 2 * world if layout == "zigzag" else world
    if packed:
        lengths = [parts * n for n in (64, 1, 0, 250, 3)]
        cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
        shape_q, shape_k, max_seqlen = (sum(lengths), h, d), (sum(lengths), hkv, d), max(lengths)
    else:
        cu, max_seqlen = None, 0
        shape_q, shape_k = (2, parts * 128, h, d), (2, parts * 128, hkv, d)
    q, k, v, dout = (torch.randn(s, device=DEV, dtype=dtype) for s in (shape_q, shape_k, shape_k, shape_q))

    def local(x, r):
        return cp.shard(x, world, r, layout) if cu is None else cp.shard_varlen(x, cu, world, r, layout)

    cu_local = None if cu is None else cp.local_cu_seqlens(cu, world, layout)
    ring = ThreadRing(world)

    def rank_fn(r):  # (each virtual rank on its own host thread: fa3 from several threads at once)
        ql, kl, vl, dol = (local(x, r) for x in (q, k, v, dout))
        spec = RingSpec(exchange=ring.exchange(r), rows=_shard_rows(ql, cu_local), causal=causal, layout=layout,
                        scale=scale, blocks=Fa3Blocks)
        out, lse = ring_forward(ql, kl, vl, spec)
        return out, ring_backward(dol, ql, kl, vl, out, lse, spec)

    results = ring.run(rank_fn)
    torch.cuda.synchronize()

    def whole(xs):
        return cp.unshard(xs, layout) if cu is None else cp.unshard_varlen(xs, cu, layout)

    out = whole([o for o, _ in results])
    grads = [whole([g[i] for _, g in results]) for i in range(3)]
    one_out, _, one_grads = _single_gpu(q, k, v, dout, causal, cu, max_seqlen, scale)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ref, _ = attention_reference(q64, k64, v64, causal=causal, scale=scale, cu_seqlens=cu)
    ref.backward(dout.double())
    assert rel_err(out, one_out) <= 1e-2
    assert rel_err(out, ref) <= 1e-2
    for name, got, single, want in zip(("dq", "dk", "dv"), grads, one_grads, (q64.grad, k64.grad, v64.grad)):
        assert rel_err(got, single) <= 1e-2, name
        assert rel_err(got, want) <= 1e-2, name


@pytest.mark.parametrize("packed", [False, True], ids=["bshd", "packed"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("world", [2, 4])
def test_thread_ulysses_on_fa3_matches_single_gpu(world, causal, packed):
    torch.manual_seed(world * 10 + causal + 100 * packed)
    scale = 0.088
    if packed:  # sequences of 1000, 0, 256 and 2048 tokens, each in W contiguous chunks
        cu = torch.tensor([0, 1000, 1000, 1256, 3304], dtype=torch.int32, device=DEV)
        shape_q, shape_k, max_seqlen = (3304, 8, 128), (3304, 4, 128), 2048
    else:
        cu, max_seqlen = None, 0
        shape_q, shape_k = (2, 1024, 8, 128), (2, 1024, 4, 128)
    q, dout = (torch.randn(shape_q, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(shape_k, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    group = ThreadGroup(world)
    local_cu = None if cu is None else cp.local_cu_seqlens(cu, world, "contiguous")

    def local(x, r):
        return cp.shard(x, world, r, "contiguous") if cu is None else cp.shard_varlen(x, cu, world, r, "contiguous")

    def whole(xs):
        return cp.unshard(xs, "contiguous") if cu is None else cp.unshard_varlen(xs, cu, "contiguous")

    def rank_fn(r):
        ql, kl, vl, dol = (local(x, r) for x in (q, k, v, dout))
        packing = None if cu is None else Packing(local_cu, max_seqlen // world, ql.shape[0], world)
        spec = UlyssesSpec(exchange=group.exchange(r), packing=packing, causal=causal, scale=scale, blocks=Fa3Blocks)
        out, lse, saved = ulysses_forward(ql, kl, vl, spec)
        return out, lse, ulysses_backward(dol, saved, spec)

    results = group.run(rank_fn)
    torch.cuda.synchronize()
    out = whole([o for o, _, _ in results])
    # LSE: BSHD [b, h, s_local], packed [h, total_local]: shards join along the sequence.
    if cu is None:
        lse = whole([l.transpose(1, 2) for _, l, _ in results]).transpose(1, 2)
    else:
        lse = whole([l.t() for _, l, _ in results]).t()
    grads = [whole([g[i] for _, _, g in results]) for i in range(3)]
    one_out, one_lse, one_grads = _single_gpu(q, k, v, dout, causal, cu, max_seqlen, scale)
    assert rel_err(out, one_out) <= 1e-2
    assert torch.allclose(lse, one_lse, atol=1e-3, rtol=1e-3)
    for name, got, want in zip(("dq", "dk", "dv"), grads, one_grads):
        assert rel_err(got, want) <= 1e-2, name


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_thread_grid_on_fa3_matches_single_gpu(causal):
    ring_world, head_world, scale = 2, 2, 0.088
    torch.manual_seed(30 + causal)
    q, dout = (torch.randn(2, 1024, 8, 128, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 1024, 4, 128, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    rings, groups = [ThreadRing(ring_world) for _ in range(head_world)], [ThreadGroup(head_world) for _ in range(ring_world)]

    def rank_fn(rank):
        r, h = divmod(rank, head_world)
        ql, kl, vl, dol = (shard_2d(x, ring_world, r, head_world, h) for x in (q, k, v, dout))
        spec = grid_spec(rings[h].exchange(r), groups[r].exchange(h), ql, layout="zigzag", causal=causal, scale=scale,
                         blocks=Fa3Blocks)
        out, lse, saved = hybrid_forward(ql, kl, vl, spec)
        return out, hybrid_backward(dol, saved, spec)

    results = ThreadRing(ring_world * head_world).run(rank_fn)
    torch.cuda.synchronize()

    def whole(pick):
        return unshard_2d([[pick(results[r * head_world + h]) for h in range(head_world)] for r in range(ring_world)])

    one_out, _, one_grads = _single_gpu(q, k, v, dout, causal, None, 0, scale)
    assert rel_err(whole(lambda x: x[0]), one_out) <= 1e-2
    for i, name in enumerate(("dq", "dk", "dv")):
        assert rel_err(whole(lambda x: x[1][i]), one_grads[i]) <= 1e-2, name


@pytest.fixture(scope="module")
def nccl_group():
    """A one-rank NCCL process group (the ring's own transfers are skipped at world size 1)."""
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=torch.device(DEV, torch.cuda.current_device()))
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_public_functions_with_autograd_on_one_rank(nccl_group):
    torch.manual_seed(11)
    q = torch.randn(1, 1024, 8, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 1024, 2, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 1024, 2, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    out, lse = cp.ring_attn_func(q, k, v, causal=True, group=nccl_group, return_lse=True, sm_margin=4)
    dout = torch.randn_like(out)
    out.backward(dout)
    one_out, one_lse, one_grads = _single_gpu(q, k, v, dout, True, None, 0, 128 ** -0.5)
    assert rel_err(out, one_out) <= 1e-2
    assert torch.allclose(lse, one_lse, atol=1e-3, rtol=1e-3)
    for got, want in zip((q.grad, k.grad, v.grad), one_grads):
        assert rel_err(got, want) <= 1e-2
    # Packed sequences.
    cu = torch.tensor([0, 100, 356, 1024], dtype=torch.int32, device=DEV)
    qp, kp, vp = (x.detach()[0].clone().requires_grad_() for x in (q, k, v))
    out = cp.ring_attn_varlen_func(qp, kp, vp, cu, 668, causal=True, group=nccl_group)
    out.backward(dout[0])
    one_out, _, one_grads = _single_gpu(qp, kp, vp, dout[0], True, cu, 668, 128 ** -0.5)
    assert rel_err(out, one_out) <= 1e-2
    for got, want in zip((qp.grad, kp.grad, vp.grad), one_grads):
        assert rel_err(got, want) <= 1e-2


def test_ulysses_function_with_autograd_on_one_rank(nccl_group):
    torch.manual_seed(13)
    q = torch.randn(1, 512, 8, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 512, 2, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 512, 2, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    out = cp.ulysses_attn_func(q, k, v, causal=True, group=nccl_group)
    dout = torch.randn_like(out)
    out.backward(dout)
    one_out, _, one_grads = _single_gpu(q, k, v, dout, True, None, 0, 128 ** -0.5)
    assert rel_err(out, one_out) <= 1e-2
    for got, want in zip((q.grad, k.grad, v.grad), one_grads):
        assert rel_err(got, want) <= 1e-2


def test_pytorch_context_parallel_runs_on_fa3(nccl_group, monkeypatch):
    """torch.distributed.tensor.experimental.context_parallel calls the flash SDPA operator per ring
    step; with fa3.sdpa activated that operator is fa3's (forward and backward)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import fa3.sdpa

    mesh = init_device_mesh(DEV, (dist.get_world_size(),))
    torch.manual_seed(12)
    # (context_parallel shards its buffers in place on entry: plain tensors, leaves made inside.)
    q, k, v = (torch.randn(1, 8, 512, 128, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(*(x.double() for x in (q, k, v)), is_causal=True)
    fa3.sdpa.activate()
    try:
        counts = count_calls(monkeypatch, _ops, fwd="fwd", bwd="bwd")
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            ql, kl, vl = (x.detach().clone().requires_grad_() for x in (q, k, v))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, is_causal=True)
                out.backward(torch.ones_like(out))
    finally:
        fa3.sdpa.deactivate()
    assert counts["fwd"] >= 1 and counts["bwd"] >= 1, counts
    out = out.detach()
    assert rel_err(out.full_tensor() if hasattr(out, "full_tensor") else out, want) <= 1e-2
    assert ql.grad is not None and bool(torch.isfinite(ql.grad).all())
