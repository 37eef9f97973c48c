"""Helpers for the fa3.distributed tests: a float64 stand-in for fa3's block operators, an in-process
ring of threads (one per virtual rank), and whole-sequence reference attention."""

import queue
import threading

import torch

from fa3.distributed.rows import Rows


def _expand_heads(x, heads):
    return x.repeat_interleave(heads // x.shape[-2], dim=-2)


def _scores(q, k, scale, softcap, causal):
    """q [s_q, h, d], k [s_k, h, d] (float64) -> (scores [h, s_q, s_k] after softcap and mask, raw)."""
    raw = torch.einsum("qhd,khd->hqk", q, k) * scale
    s = softcap * torch.tanh(raw / softcap) if softcap > 0 else raw
    if causal:  # bottom-right aligned, as fa3
        sq, sk = q.shape[0], k.shape[0]
        rows, cols = torch.arange(sq, device=q.device), torch.arange(sk, device=q.device)
        visible = cols[None, :] <= rows[:, None] + (sk - sq)
        s = s.masked_fill(~visible, float("-inf"))
    return s, raw


def _sequences(q_rows: Rows, kv_rows: Rows, batch: int, packed_len_q: int, packed_len_k: int):
    """(q slice, k slice) per sequence: packed rows by cu_seqlens, else one per batch entry."""
    if not q_rows.packed:
        return [(b, slice(None), slice(None)) for b in range(batch)]
    cq, ck = q_rows.cu_seqlens.tolist(), kv_rows.cu_seqlens.tolist()
    return [(None, slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])) for i in range(len(cq) - 1)]


class ReferenceBlocks:
    """fa3.distributed.blocks.Fa3Blocks' two methods in float64 PyTorch (CPU or GPU)."""

    @staticmethod
    def forward(q, k, v, q_rows, kv_rows, *, causal, scale, softcap, sm_margin=0):
        packed = q_rows.packed
        out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=torch.float64, device=q.device)
        lse = torch.full((q.shape[-2], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1]),
                         float("-inf"), dtype=torch.float64, device=q.device)
        for b, sq, sk in _sequences(q_rows, kv_rows, 1 if packed else q.shape[0], 0, 0):
            qq = (q[sq] if packed else q[b]).double()
            kk = _expand_heads((k[sk] if packed else k[b]).double(), q.shape[-2])
            vv = _expand_heads((v[sk] if packed else v[b]).double(), q.shape[-2])
            if qq.shape[0] == 0:
                continue
            s, _ = _scores(qq, kk, scale, softcap, causal)
            l = torch.logsumexp(s, dim=-1)                                  # [h, s_q]
            p = torch.exp(s - torch.where(torch.isneginf(l), 0, l)[..., None])
            o = torch.einsum("hqk,khd->qhd", p, vv)
            if packed:
                out[sq], lse[:, sq] = o, l
            else:
                out[b], lse[b] = o, l
        return out.to(q.dtype), lse.float()

    @staticmethod
    def backward(dout, q, k, v, out, lse, q_rows, kv_rows, *, causal, scale, softcap, deterministic):
        packed = q_rows.packed
        dq = torch.zeros_like(q, dtype=torch.float64)
        dk = torch.zeros_like(k, dtype=torch.float64)
        dv = torch.zeros_like(v, dtype=torch.float64)
        h, hk = q.shape[-2], k.shape[-2]
        for b, sq, sk in _sequences(q_rows, kv_rows, 1 if packed else q.shape[0], 0, 0):
            pick = (lambda x, s: x[s]) if packed else (lambda x, s: x[b])
            qq, do, oo = pick(q, sq).double(), pick(dout, sq).double(), pick(out, sq).double()
            kk = _expand_heads(pick(k, sk).double(), h)
            vv = _expand_heads(pick(v, sk).double(), h)
            ll = (lse[:, sq] if packed else lse[b]).double()                # [h, s_q]
            if qq.shape[0] == 0 or kk.shape[0] == 0:
                continue
            s, raw = _scores(qq, kk, scale, softcap, causal)
            p = torch.exp(s - torch.where(torch.isneginf(ll), 0, ll)[..., None])
            dvv = torch.einsum("hqk,qhd->khd", p, do)
            dp = torch.einsum("qhd,khd->hqk", do, vv)
            delta = (do * oo).sum(-1).transpose(0, 1)                       # [h, s_q]
            ds = p * (dp - delta[..., None])
            if softcap > 0:
                ds = ds * (1 - torch.tanh(raw / softcap) ** 2)
            dqq = torch.einsum("hqk,khd->qhd", ds, kk) * scale
            dkk = torch.einsum("hqk,qhd->khd", ds, qq) * scale
            g = h // hk  # GQA: a kv head's gradient sums its query heads'
            dkk = dkk.reshape(dkk.shape[0], hk, g, -1).sum(2)
            dvv = dvv.reshape(dvv.shape[0], hk, g, -1).sum(2)
            if packed:
                dq[sq] += dqq
                dk[sk] += dkk
                dv[sk] += dvv
            else:
                dq[b] += dqq
                dk[b] += dkk
                dv[b] += dvv
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _Handle:
    def __init__(self, box):
        self._box = box

    def wait(self):
        return self._box.get(timeout=120)


class ThreadRing:
    """W virtual ranks in one process: ``exchange(r)`` is rank r's exchange object (rank, world,
    start(tensors) -> handle; transfers are copies handed to the next rank's queue, in order)."""

    def __init__(self, world):
        self.world = world
        self._boxes = [queue.Queue() for _ in range(world)]

    def exchange(self, rank):
        ring = self

        class Exchange:
            def __init__(self):
                self.rank, self.world = rank, ring.world

            def start(self, tensors):
                ring._boxes[(rank + 1) % ring.world].put([t.clone() for t in tensors])
                return _Handle(ring._boxes[rank])

        return Exchange()

    def run(self, fn):
        """fn(rank) on every rank, each on a thread; returns the results in rank order."""
        results, errors = [None] * self.world, []

        def body(r):
            try:
                results[r] = fn(r)
            except BaseException as e:  # noqa: BLE001 (re-raised below)
                errors.append(e)

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        if errors:
            raise errors[0]
        return results


def attention_reference(q, k, v, *, causal, scale, softcap=0.0, cu_seqlens=None):
    """Whole-sequence attention in float64 with autograd (torch.softmax, written apart from
    ReferenceBlocks): BSHD, or packed [total, h, d] with cu_seqlens. Returns (out, lse)."""
    def one(qq, kk, vv):
        kk, vv = _expand_heads(kk, qq.shape[-2]), _expand_heads(vv, qq.shape[-2])
        s, _ = _scores(qq, kk, scale, softcap, causal)
        return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv), torch.logsumexp(s, dim=-1)

    if cu_seqlens is None:
        outs = [one(q[b], k[b], v[b]) for b in range(q.shape[0])]
        return torch.stack([o for o, _ in outs]), torch.stack([l for _, l in outs])
    c = cu_seqlens.tolist()
    outs = [one(q[c[i]:c[i + 1]], k[c[i]:c[i + 1]], v[c[i]:c[i + 1]]) for i in range(len(c) - 1)]
    return torch.cat([o for o, _ in outs]), torch.cat([l for _, l in outs], dim=1)


class ThreadGroup:
    """W virtual ranks in one process for the head-parallel layer: ``exchange(r)`` has rank, world
    and all_to_all(x [W, ...]) (chunk i to rank i; every rank must call it, as a collective)."""

    def __init__(self, world):
        self.world = world
        self._slots = [None] * world
        self._barrier = threading.Barrier(world)

    def exchange(self, rank):
        group = self

        class Exchange:
            def __init__(self):
                self.rank, self.world = rank, group.world

            def all_to_all(self, x):
                group._slots[rank] = x.clone()
                group._barrier.wait()
                out = torch.stack([group._slots[src][rank] for src in range(group.world)])
                group._barrier.wait()  # (nobody overwrites a slot before everyone has read it)
                return out

        return Exchange()

    run = ThreadRing.run
