"""fa3.distributed without a GPU: the LSE merge, the layouts, the ring schedule (every visible pair
of chunks computed exactly once, zigzag's equal work), and the ring's forward and backward on CPU
with a float64 stand-in for fa3's block operators, over an in-process ring of threads and over
torch.distributed's gloo backend in real processes; the head-parallel layer (BSHD and packed) and the
grid of rings x head groups the same way."""

import io
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fa3.distributed as cp
from fa3.distributed.exchange import RingExchange
from fa3.distributed.hybrid import HybridAttention, grid_spec, hybrid_backward, hybrid_forward, shard_2d, unshard_2d
from fa3.distributed.layout import ALL, FIRST, SECOND, step_plan
from fa3.distributed.merge import merge_
from fa3.distributed.ring import RingAttention, RingSpec, ring_backward, ring_forward
from fa3.distributed.rows import ShardRows
from fa3.distributed.ulysses import (HeadExchange, Packing, UlyssesAttention, UlyssesSpec, ulysses_backward,
                                    ulysses_forward)
from ring_util import ReferenceBlocks, ThreadGroup, ThreadRing, attention_reference
from util import rel_err


def test_merge_equals_softmax_over_the_union():
    torch.manual_seed(0)
    b, s, h, d, keys = 2, 5, 3, 4, 40
    scores = torch.randn(b, h, s, keys, dtype=torch.float64) * 3
    values = torch.randn(b, keys, h, d, dtype=torch.float64)
    full = torch.einsum("bhsk,bkhd->bshd", torch.softmax(scores, -1), values)
    out = torch.zeros(b, s, h, d, dtype=torch.float64)
    lse = torch.full((b, h, s), float("-inf"), dtype=torch.float64)
    for part in torch.tensor_split(torch.randperm(keys), [3, 4, 21]):   # uneven, one of a single key
        sc = scores[..., part]
        merge_(out, lse, torch.einsum("bhsk,bkhd->bshd", torch.softmax(sc, -1), values[:, part]),
               torch.logsumexp(sc, -1))
    assert rel_err(out, full, floor=0) < 1e-12
    assert rel_err(lse, torch.logsumexp(scores, -1), floor=0) < 1e-12


def test_merge_keeps_unreached_rows_finite():
    out, lse = torch.zeros(1, 2, 1, 4), torch.full((1, 1, 2), float("-inf"))
    merge_(out, lse, torch.ones(1, 2, 1, 4), torch.tensor([[[0.5, float("-inf")]]]))
    assert torch.equal(out[0, 0, 0], torch.ones(4)) and torch.equal(out[0, 1, 0], torch.zeros(4))
    assert lse[0, 0, 0].item() == 0.5 and torch.isneginf(lse[0, 0, 1])


@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_shard_round_trip(layout, world):
    x = torch.randn(2, 4 * world * 3, 3, 2)
    shards = [cp.shard(x, world, r, layout) for r in range(world)]
    assert all(s.shape[1] == x.shape[1] // world for s in shards)
    assert torch.equal(cp.unshard(shards, layout), x)
    cu = torch.tensor([0, 2 * world, 2 * world, 8 * world], dtype=torch.int32)   # with an empty sequence
    packed = torch.randn(8 * world, 3, 2)
    pshards = [cp.shard_varlen(packed, cu, world, r, layout) for r in range(world)]
    assert torch.equal(cp.local_cu_seqlens(cu, world, layout), cu // world)
    assert torch.equal(cp.unshard_varlen(pshards, cu, layout), packed)


def test_shard_rejects_lengths_that_do_not_split():
    with pytest.raises(ValueError, match="multiple of 4"):
        cp.shard(torch.zeros(1, 6, 1, 1), 2, 0, "zigzag")
    with pytest.raises(ValueError, match="multiple of 4"):
        cp.local_cu_seqlens(torch.tensor([0, 4, 10], dtype=torch.int32), 2, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        cp.shard(torch.zeros(1, 4, 1, 1), 2, 0, "striped")


def _chunks_of(rank, world, layout, rows):
    ids = (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)
    return {ALL: ids, FIRST: ids[:1], SECOND: ids[1:]}[rows]


@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_every_visible_pair_of_chunks_is_computed_once(layout, world):
    """Over all ranks and steps, each (query chunk, key chunk) pair a causal mask leaves visible is
    computed once, with the diagonal mask exactly on equal chunks; nothing invisible is computed."""
    units = 2 if layout == "zigzag" else 1         # chunks per shard; a pair's work: 1 (or 1/2 diagonal)
    seen, work = {}, [0.0] * world
    for rank in range(world):
        for t in range(world):
            src = (rank - t) % world
            plan = step_plan(rank, src, world, True, layout)
            if plan is None:
                continue
            for qc in _chunks_of(rank, world, layout, plan.q_rows):
                for kc in _chunks_of(src, world, layout, plan.kv_rows):
                    if plan.causal and kc > qc:
                        continue           # masked whole inside the diagonal block
                    seen[(qc, kc)] = seen.get((qc, kc), 0) + 1
                    assert kc <= qc, (rank, src, qc, kc)
                    diagonal = qc == kc
                    assert diagonal == (plan.causal and qc == kc)
                    work[rank] += 0.5 if diagonal else 1.0
    n = units * world
    assert seen == {(qc, kc): 1 for qc in range(n) for kc in range(qc + 1)}
    if layout == "zigzag":
        assert len(set(work)) == 1, work
    non_causal = {(rank, (rank - t) % world) for rank in range(world) for t in range(world)}
    assert all(step_plan(r, s, world, False, layout).q_rows == ALL for r, s in non_causal)


def _problem(seed, world, layout, packed, heads=4, heads_kv=2, d=8):
    g = torch.Generator().manual_seed(seed)
    parts = 2 * world if layout == "zigzag" else world
    if packed:
        lengths = [parts * n for n in (3, 0, 1, 5)]
        cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
        shape_q, shape_k = (int(cu[-1]), heads, d), (int(cu[-1]), heads_kv, d)
    else:
        cu = None
        shape_q, shape_k = (2, 4 * parts, heads, d), (2, 4 * parts, heads_kv, d)
    q, k, v, dout = (torch.randn(s, generator=g, dtype=torch.float64) for s in (shape_q, shape_k, shape_k, shape_q))
    return q, k, v, dout, cu


def _local(x, cu, world, rank, layout):
    return cp.shard(x, world, rank, layout) if cu is None else cp.shard_varlen(x, cu, world, rank, layout)


def _whole(shards, cu, layout):
    return cp.unshard(shards, layout) if cu is None else cp.unshard_varlen(shards, cu, layout)


def _rows(q_local, cu, world, layout):
    if cu is None:
        return ShardRows(seqlen=q_local.shape[1])
    local = cp.local_cu_seqlens(cu, world, layout)
    return ShardRows(cu_seqlens=local, max_seqlen=int((local[1:] - local[:-1]).max()), total=q_local.shape[0])


def _check_against_reference(outs, lses, grads, q, k, v, dout, cu, causal, softcap, layout, scale):
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref_out, ref_lse = attention_reference(qr, kr, vr, causal=causal, scale=scale, softcap=softcap, cu_seqlens=cu)
    ref_out.backward(dout)
    assert rel_err(_whole(outs, cu, layout), ref_out) < 1e-6
    # LSE: BSHD [b, h, s] (sequence on dim 2), packed [h, total] (on dim 1): shards join on dim 1.
    seq_last = [l.transpose(1, 2) if cu is None else l.t() for l in lses]
    whole_lse = _whole(seq_last, cu, layout)
    assert rel_err(whole_lse.transpose(1, 2) if cu is None else whole_lse.t(), ref_lse) < 1e-6
    for got, want in zip(zip(*grads), (qr.grad, kr.grad, vr.grad)):
        assert rel_err(_whole(list(got), cu, layout), want) < 1e-6


@pytest.mark.parametrize("packed", [False, True], ids=["bshd", "packed"])
@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_thread_ring_matches_whole_sequence_attention(world, causal, layout, packed):
    softcap = 5.0 if world == 3 else 0.0
    q, k, v, dout, cu = _problem(world * 10 + causal, world, layout, packed)
    scale = 0.3
    ring = ThreadRing(world)

    def rank_fn(r):
        ql, kl, vl, dol = (_local(x, cu, world, r, layout) for x in (q, k, v, dout))
        spec = RingSpec(exchange=ring.exchange(r), rows=_rows(ql, cu, world, layout), causal=causal,
                        layout=layout, scale=scale, softcap=softcap, blocks=ReferenceBlocks)
        out, lse = ring_forward(ql, kl, vl, spec)
        return out, lse, ring_backward(dol, ql, kl, vl, out, lse, spec)

    results = ring.run(rank_fn)
    _check_against_reference([o for o, _, _ in results], [l for _, l, _ in results], [g for _, _, g in results],
                             q, k, v, dout, cu, causal, softcap, layout, scale)


def test_ring_steps_take_the_sm_margin():
    """Every forward step of the ring gets the spec's sm_margin (the SMs its transfers need beside the
    attention); the backward's block calls take none (their grid is not persistent)."""
    seen = []

    class Spy(ReferenceBlocks):
        @staticmethod
        def forward(*args, sm_margin=0, **kw):
            seen.append(sm_margin)
            return ReferenceBlocks.forward(*args, **kw)

    world = 3
    q, k, v, _, cu = _problem(5, world, "zigzag", False)
    ring = ThreadRing(world)

    def rank_fn(r):
        ql, kl, vl = (_local(x, cu, world, r, "zigzag") for x in (q, k, v))
        spec = RingSpec(exchange=ring.exchange(r), rows=_rows(ql, cu, world, "zigzag"), causal=False,
                        layout="zigzag", scale=0.3, blocks=Spy, sm_margin=6)
        return ring_forward(ql, kl, vl, spec)

    ring.run(rank_fn)
    assert seen == [6] * (world * world)


def _packing(q_local, cu, world):
    local = cp.local_cu_seqlens(cu, world, "contiguous")
    return Packing(local, int((local[1:] - local[:-1]).max()), q_local.shape[0], world)


@pytest.mark.parametrize("packed", [False, True], ids=["bshd", "packed"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_thread_ulysses_matches_whole_sequence_attention(world, causal, packed):
    # Packed: sequences of 3W, 0, W and 5W tokens (an empty one among them), each in W chunks.
    q, k, v, dout, cu = _problem(world * 10 + causal + 1 + packed, world, "contiguous", packed, heads=8, heads_kv=4)
    softcap = 5.0 if world == 2 else 0.0
    group = ThreadGroup(world)

    def rank_fn(r):
        ql, kl, vl, dol = (_local(x, cu, world, r, "contiguous") for x in (q, k, v, dout))
        spec = UlyssesSpec(exchange=group.exchange(r), packing=_packing(ql, cu, world) if packed else None,
                           causal=causal, scale=0.3, softcap=softcap, blocks=ReferenceBlocks)
        out, lse, saved = ulysses_forward(ql, kl, vl, spec)
        return out, lse, ulysses_backward(dol, saved, spec)

    results = group.run(rank_fn)
    _check_against_reference([o for o, _, _ in results], [l for _, l, _ in results], [g for _, _, g in results],
                             q, k, v, dout, cu, causal, softcap, "contiguous", 0.3)


def test_packing_sends_every_row_home_once():
    # Rank r's rows of sequence i are its chunk r: the whole batch's row g of sequence i, position p,
    # comes from block p // (len_i / W) of the gathered rows, row cu_local[i] + p mod (len_i / W).
    world = 3
    cu = torch.tensor([0, 9, 9, 12, 27], dtype=torch.int32)
    local = cp.local_cu_seqlens(cu, world, "contiguous")
    pk = Packing(local, 5, int(local[-1]), world)
    assert sorted(pk.index.tolist()) == list(range(27))
    assert pk.rows.cu_seqlens.tolist() == cu.tolist() and pk.rows.max_seqlen == 15
    whole = torch.arange(27)
    shards = [cp.shard_varlen(whole, cu, world, r, "contiguous") for r in range(world)]
    assert torch.equal(torch.cat(shards).index_select(0, pk.index), whole)


# ---- real processes over gloo: the torch.distributed exchange and the autograd function ----------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_rank(rank, world, port, causal, layout, packed, results, method="ring"):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        q, k, v, dout, cu = _problem(7, world, layout, packed)
        ql, kl, vl, dol = (_local(x, cu, world, rank, layout).requires_grad_(x is not dout)
                           for x in (q, k, v, dout))
        if method == "ring":
            spec = RingSpec(exchange=RingExchange(None), rows=_rows(ql, cu, world, layout), causal=causal,
                            layout=layout, scale=0.25, blocks=ReferenceBlocks)
            out, lse = RingAttention.apply(ql, kl, vl, spec)
        else:
            spec = UlyssesSpec(exchange=HeadExchange(None), packing=_packing(ql, cu, world) if packed else None,
                               causal=causal, scale=0.25, blocks=ReferenceBlocks)
            out, lse = UlyssesAttention.apply(ql, kl, vl, spec)
        out.backward(dol)
        results[rank] = (out.detach(), lse, (ql.grad, kl.grad, vl.grad))
    finally:
        dist.destroy_process_group()


def _gloo_main(rank, world, port, queue_, causal, layout, packed, method):
    results = {}
    _gloo_rank(rank, world, port, causal, layout, packed, results, method)
    buf = io.BytesIO()  # (bytes, not tensors: a tensor sent through a queue lives in this process)
    torch.save(results[rank], buf)
    queue_.put((rank, buf.getvalue()))


def _spawn_ranks(world, target, *args):
    """target(rank, world, port, queue, *args) in `world` processes; the results (rank order) each
    put on the queue as torch.save bytes."""
    ctx = mp.get_context("spawn")
    q_ = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, q_, *args)) for r in range(world)]
    for p in procs:
        p.start()
    got = {r: torch.load(io.BytesIO(b)) for r, b in (q_.get(timeout=180) for _ in range(world))}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return [got[r] for r in range(world)]


@pytest.mark.parametrize("world,causal,layout,packed,method", [(2, True, "zigzag", False, "ring"),
                                                               (3, True, "zigzag", True, "ring"),
                                                               (3, False, "contiguous", False, "ring"),
                                                               (2, True, "contiguous", False, "ulysses"),
                                                               (2, False, "contiguous", True, "ulysses")])
def test_gloo_with_autograd(world, causal, layout, packed, method):
    res = _spawn_ranks(world, _gloo_main, causal, layout, packed, method)
    q, k, v, dout, cu = _problem(7, world, layout, packed)
    _check_against_reference([o for o, _, _ in res], [l for _, l, _ in res], [g for _, _, g in res],
                             q, k, v, dout, cu, causal, 0.0, layout, 0.25)


def test_public_functions_check_their_arguments():
    import fa3
    from fa3.distributed.blocks import Fa3Blocks
    assert fa3.distributed is cp  # (loaded on first use, as fa3.sdpa)
    # The layers' specs run fa3's operators unless a stand-in is passed.
    assert RingSpec(exchange=None, rows=None, layout="zigzag", causal=False, scale=1.0).blocks is Fa3Blocks
    assert UlyssesSpec(exchange=None, causal=False, scale=1.0).blocks is Fa3Blocks
    bf16 = dict(dtype=torch.bfloat16)
    q = torch.zeros(1, 8, 2, 8, **bf16)
    with pytest.raises(ValueError, match="same length"):
        cp.ring_attn_func(q, torch.zeros(1, 4, 2, 8, **bf16), torch.zeros(1, 4, 2, 8, **bf16))
    with pytest.raises(ValueError, match="must be even"):
        cp.ring_attn_func(*(torch.zeros(1, 7, 2, 8, **bf16) for _ in range(3)))
    for dtype in (torch.float32, torch.float8_e4m3fn):  # fp16 / bf16 only (an e4m3 ring would re-quantise O)
        with pytest.raises(ValueError, match="float16 or bfloat16"):
            cp.ring_attn_func(*(torch.zeros(1, 8, 2, 16, dtype=dtype) for _ in range(3)))
        with pytest.raises(ValueError, match="float16 or bfloat16"):
            cp.ulysses_attn_func(*(torch.zeros(1, 8, 2, 16, dtype=dtype) for _ in range(3)))
    with pytest.raises(ValueError, match="layout"):
        cp.ring_attn_func(q, q, q, layout="striped")
    with pytest.raises(ValueError, match="int32"):
        cp.ring_attn_varlen_func(q[0], q[0], q[0], torch.tensor([0, 8]), 8)
    with pytest.raises(ValueError, match="int32"):
        cp.ulysses_attn_varlen_func(q[0], q[0], q[0], torch.tensor([0, 8]), 8)
    with pytest.raises(ValueError, match="layout"):
        cp.hybrid_attn_func(q, q, q, None, None, layout="striped")
    with pytest.raises(ValueError, match="softmax_scale"):
        cp.ring_attn_func(q, q, q, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="sm_margin"):
        cp.ring_attn_func(q, q, q, sm_margin=-1)
    with pytest.raises(ValueError, match="sm_margin"):
        cp.hybrid_attn_func(q, q, q, None, None, sm_margin=-2)


def test_fa3_blocks_backward_reads_like_flash_attn_func(monkeypatch):
    # The ring's block backward treats its tensors as fa3's own autograd does: copies what TMA cannot
    # read in place (a head dim that is not contiguous), and honours torch's global determinism flag.
    from types import SimpleNamespace

    from fa3 import _ops
    from fa3.distributed.blocks import Fa3Blocks
    seen = {}

    def fake_bwd(dout, q, k, v, out, lse, **kw):
        seen.update(kw, q=q)
        return q, k, v, None

    monkeypatch.setattr(_ops, "bwd", fake_bwd)
    x = torch.zeros(1, 4, 2, 16, dtype=torch.bfloat16)
    q = torch.zeros(1, 4, 16, 2, dtype=torch.bfloat16).transpose(2, 3)  # head-dim stride 2
    rows = SimpleNamespace(packed=False)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        Fa3Blocks.backward(x, q, x, x, x, None, rows, rows, causal=True, scale=0.25, softcap=0.0,
                           deterministic=False)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert seen["deterministic"] is True and seen["q"].stride(-1) == 1


def _non_member_main(rank, world, port, queue_):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        group = dist.new_group([0, 1])  # (every rank takes part in creating it)
        message = ""
        if rank == 2:
            try:
                RingExchange(group)
            except ValueError as e:
                message = str(e)
            try:
                HeadExchange(group)
            except ValueError as e:
                message += " | " + str(e)
    finally:
        dist.destroy_process_group()
    buf = io.BytesIO()
    torch.save(message, buf)
    queue_.put((rank, buf.getvalue()))


def test_a_process_outside_the_group_is_told_so():
    messages = _spawn_ranks(3, _non_member_main)
    assert messages[0] == messages[1] == ""
    assert messages[2].count("not a member of the group") == 2, messages[2]


# ---- the grid of rings x head groups (hybrid.py) --------------------------------------------------
def _check_grid(results, ring_world, head_world, q, k, v, dout, causal, softcap, layout, scale, cu=None):
    """results[rank] = (out, lse, grads) with rank = ring_rank * W_h + head_rank."""
    def whole(pick):
        return unshard_2d([[pick(results[r * head_world + h]) for h in range(head_world)]
                           for r in range(ring_world)], layout, cu_seqlens=cu)

    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref_out, ref_lse = attention_reference(qr, kr, vr, causal=causal, scale=scale, softcap=softcap, cu_seqlens=cu)
    ref_out.backward(dout)
    assert rel_err(whole(lambda x: x[0]), ref_out) < 1e-6
    if cu is None:  # LSE: BSHD [b, h, s], packed [h, total]: the parts join along the sequence
        assert rel_err(whole(lambda x: x[1].transpose(1, 2)).transpose(1, 2), ref_lse) < 1e-6
    else:
        assert rel_err(whole(lambda x: x[1].t()).t(), ref_lse) < 1e-6
    for i, want in enumerate((qr.grad, kr.grad, vr.grad)):
        assert rel_err(whole(lambda x: x[2][i]), want) < 1e-6


def test_shard_2d_round_trip():
    x = torch.arange(2 * 48).reshape(2, 48)
    parts = [[shard_2d(x, 3, r, 2, h, "zigzag") for h in range(2)] for r in range(3)]
    assert torch.equal(unshard_2d(parts, "zigzag"), x)
    # Rank (r, h) holds half h of ring rank r's zigzag shard.
    assert torch.equal(torch.cat(parts[1], dim=1), cp.shard(x, 3, 1, "zigzag"))


def _grid_spec(ql, cu, ring_world, head_world, layout, ring_exchange, head_exchange, **options):
    """grid_spec on the float64 blocks; cu: the global cu_seqlens (packed) or None."""
    packed = {}
    if cu is not None:
        local = cp.local_cu_seqlens_2d(cu, ring_world, head_world, layout)
        packed = dict(cu_seqlens=local, max_seqlen=int((local[1:] - local[:-1]).max()))
    return grid_spec(ring_exchange, head_exchange, ql, layout=layout, blocks=ReferenceBlocks, **packed, **options)


@pytest.mark.parametrize("packed", [False, True], ids=["bshd", "packed"])
@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("ring_world,head_world", [(1, 2), (2, 1), (2, 2), (3, 2)])
def test_thread_grid_matches_whole_sequence_attention(ring_world, head_world, causal, layout, packed):
    world = ring_world * head_world
    q, k, v, dout, cu = _problem(world * 10 + causal + 3, world, layout, packed, heads=8, heads_kv=4)
    softcap = 5.0 if ring_world == 3 else 0.0
    rings = [ThreadRing(ring_world) for _ in range(head_world)]       # rings[h]: the ranks holding heads h
    groups = [ThreadGroup(head_world) for _ in range(ring_world)]     # groups[r]: ring rank r's head group

    def rank_fn(rank):
        r, h = divmod(rank, head_world)
        ql, kl, vl, dol = (shard_2d(x, ring_world, r, head_world, h, layout, cu_seqlens=cu) for x in (q, k, v, dout))
        spec = _grid_spec(ql, cu, ring_world, head_world, layout, rings[h].exchange(r), groups[r].exchange(h),
                          causal=causal, scale=0.3, softcap=softcap)
        out, lse, saved = hybrid_forward(ql, kl, vl, spec)
        return out, lse, hybrid_backward(dol, saved, spec)

    results = ThreadRing(world).run(rank_fn)
    _check_grid(results, ring_world, head_world, q, k, v, dout, causal, softcap, layout, 0.3, cu)


def _gloo_grid_main(rank, world, port, queue_, head_world, heads_inner, packed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        head_group, ring_group, r, h = cp.grid_groups(head_world, heads_inner)
        ring_world = world // head_world
        assert dist.get_world_size(head_group) == head_world and dist.get_rank(head_group) == h
        assert dist.get_world_size(ring_group) == ring_world and dist.get_rank(ring_group) == r
        q, k, v, dout, cu = _problem(11, world, "zigzag", packed, heads=8, heads_kv=4)
        ql, kl, vl = (shard_2d(x, ring_world, r, head_world, h, cu_seqlens=cu).requires_grad_() for x in (q, k, v))
        dol = shard_2d(dout, ring_world, r, head_world, h, cu_seqlens=cu)
        spec = _grid_spec(ql, cu, ring_world, head_world, "zigzag", RingExchange(ring_group), HeadExchange(head_group),
                          causal=True, scale=0.25)
        out, lse = HybridAttention.apply(ql, kl, vl, spec)
        out.backward(dol)
        buf = io.BytesIO()
        torch.save((out.detach(), lse, (ql.grad, kl.grad, vl.grad)), buf)
        queue_.put((rank, buf.getvalue()))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("heads_inner,packed", [(True, False), (False, True)], ids=["heads-inner", "ring-inner-packed"])
def test_gloo_grid_with_autograd(heads_inner, packed):
    world, head_world = 4, 2
    res = _spawn_ranks(world, _gloo_grid_main, head_world, heads_inner, packed)
    # Results by grid position: rank (r, h) is r * W_h + h with heads inner, h * W_r + r otherwise.
    ring_world = world // head_world
    order = [r * head_world + h if heads_inner else h * ring_world + r for r in range(ring_world)
             for h in range(head_world)]
    q, k, v, dout, cu = _problem(11, world, "zigzag", packed, heads=8, heads_kv=4)
    _check_grid([res[i] for i in order], ring_world, head_world, q, k, v, dout, True, 0.0, "zigzag", 0.25, cu)
