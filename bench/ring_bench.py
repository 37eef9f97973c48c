#!/usr/bin/env python3
"""Ring attention (fa3.distributed) against fa3 on one GPU: forward + backward, bf16, causal by
default, 128k tokens, 16 heads, d128 (the issue's case); TFLOP/s count visible pairs (backward 2.5x).

One process, one GPU (no second GPU needed):
  whole      fa3.flash_attn_func on the whole sequence, forward + backward;
  ring W=1   fa3.distributed.ring_attn_func on a one-rank NCCL group: the ring's own cost
             (merge, float32 accumulators) with no transfer;
  rank r/W   the steps rank r of a W-rank zigzag ring computes, run alone with the shards it would
             receive already here (transfers replaced by handing over the next shard): the
             compute-bound time of one rank, so whole / max_r(rank r/W) is the speedup W GPUs
             reach when the transfers hide under the steps; each step's K/V bytes and time give the
             link bandwidth that hiding needs (docs/context-parallel.md).

Several GPUs (a real ring over NCCL; the ranks' output is compared with rank 0's whole run):
  torchrun --nproc-per-node 2 bench/ring_bench.py --distributed

  python3 bench/ring_bench.py [--seqlen 131072] [--heads 16] [--head-dim 128] [--simulate 2,4,8]
                              [--no-causal] [--rep 3] [--json out.json]
"""
import argparse
import json
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_timing import time_ms  # noqa: E402


def flops(seqlen, heads, head_dim, causal):
    pairs = seqlen * (seqlen + 1) / 2 if causal else seqlen * seqlen
    return 4 * heads * head_dim * pairs * 3.5  # forward + backward (2.5x)


class ReplayExchange:
    """Rank r's exchange with the transfers replaced: the i-th K/V hand-over gives the shard of rank
    r - i - 1; float32 accumulators come back as sent (their values do not matter for timing)."""

    def __init__(self, rank, world, kv_shards):
        self.rank, self.world, self._kv, self._step = rank, world, kv_shards, 0

    def reset(self):
        self._step = 0

    def start(self, tensors):
        import torch
        if tensors[0].dtype == torch.float32:
            return _Ready(tensors)
        self._step += 1
        return _Ready(self._kv[(self.rank - self._step) % self.world])


class _Ready:
    def __init__(self, tensors):
        self._t = list(tensors)

    def wait(self):
        return self._t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--simulate", default="2,4,8")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--rep", type=int, default=3)
    ap.add_argument("--distributed", action="store_true")
    ap.add_argument("--step-sizes", default="",
                    help="also time one zigzag step off the diagonal (n queries x n/2 keys, no mask) "
                         "for these shard sizes n: forward, forward + backward")
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

    import torch
    import torch.distributed as dist
    import fa3
    import fa3.distributed as cp
    from fa3.distributed.blocks import Fa3Blocks
    from fa3.distributed.ring import RingSpec, ring_backward, ring_forward
    from fa3.distributed.rows import ShardRows

    causal = not a.no_causal
    s, h, d = a.seqlen, a.heads, a.head_dim
    total = flops(s, h, d, causal)
    rows = []

    if a.distributed:
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        rank, world = 0, 1
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, dout = (torch.randn(1, s, h, d, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(4))

    def whole():
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        fa3.flash_attn_func(qq, kk, vv, causal=causal).backward(dout)
        return qq.grad

    t_whole = time_ms(torch, whole, a.rep, warmup=1) if rank == 0 else float("nan")
    if rank == 0:
        rows.append(("whole (fa3, one GPU)", t_whole, total / t_whole / 1e9, 1.0))

    def ring_call(ql, kl, vl, dl):
        ql, kl, vl = (x.detach().requires_grad_() for x in (ql, kl, vl))
        out = cp.ring_attn_func(ql, kl, vl, causal=causal)
        out.backward(dl)
        return out

    shard = [cp.shard(x, world, rank) for x in (q, k, v, dout)]
    t_ring = time_ms(torch, lambda: ring_call(*shard), a.rep, warmup=1)
    if a.distributed:
        # Every rank's time is the ring's; throughput over the whole problem.
        t = torch.tensor([t_ring], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t_ring = t.item()
        out_local = ring_call(*shard).detach()
        gathered = [torch.empty_like(out_local) for _ in range(world)]
        dist.all_gather(gathered, out_local)
        if rank == 0:
            ref = fa3.flash_attn_func(q, k, v, causal=causal)
            err = ((cp.unshard(gathered).double() - ref.double()).norm() / ref.double().norm()).item()
            rows.append((f"ring, {world} GPUs (NCCL)", t_ring, total / t_ring / 1e9, t_whole / t_ring))
            print(f"ring output vs whole: relative error {err:.2e}")
    else:
        rows.append(("ring W=1 (one-rank group)", t_ring, total / t_ring / 1e9, t_whole / t_ring))
        for w in [int(x) for x in a.simulate.split(",") if x]:
            shards = [[cp.shard(x, w, r) for x in (q, k, v, dout)] for r in range(w)]
            kv = [(sh[1], sh[2]) for sh in shards]
            per_rank, fwd_rank = [], []
            for r in range(w):
                ex = ReplayExchange(r, w, kv)
                spec = RingSpec(exchange=ex, rows=ShardRows(seqlen=s // w), causal=causal, layout="zigzag",
                                scale=d ** -0.5, blocks=Fa3Blocks)
                ql, kl, vl, dl = shards[r]

                def steps():
                    ex.reset()
                    out, lse = ring_forward(ql, kl, vl, spec)
                    ex.reset()
                    return ring_backward(dl, ql, kl, vl, out, lse, spec)

                def forward_steps():
                    ex.reset()
                    return ring_forward(ql, kl, vl, spec)

                per_rank.append(time_ms(torch, steps, a.rep, warmup=1))
                fwd_rank.append(time_ms(torch, forward_steps, a.rep, warmup=1))
            worst = max(per_rank)
            fwd = max(fwd_rank)
            bwd = worst - fwd
            # A hop carries the K/V shard (bf16) forward; backward the K/V shard and then float32
            # dK/dV accumulators, three times the bytes.
            kv_bytes = 2 * (s // w) * k.shape[2] * d * 2
            rows.append((f"rank compute, W={w} (max of {w})", worst, total / worst / 1e9, t_whole / worst))
            print(f"W={w}: per-rank ms {', '.join(f'{t:.1f}' for t in per_rank)} (forward {fwd:.1f}); "
                  f"K/V shard {kv_bytes / 1e6:.0f} MB; per step {fwd / w:.2f} ms forward, {bwd / w:.2f} ms backward "
                  f"-> hiding the hops needs {kv_bytes / (fwd / w * 1e-3) / 1e9:.0f} GB/s forward, "
                  f"{3 * kv_bytes / (bwd / w * 1e-3) / 1e9:.0f} GB/s backward")
    if rank == 0 and a.step_sizes:
        print("\none ring step off the diagonal (n queries of a shard x the n/2 keys of another, no mask):")
        print(f"{'n':>8s} {'fwd ms':>9s} {'fwd+bwd ms':>11s} {'TFLOP/s':>8s} {'K/V MB':>8s}")
        for n in [int(x) for x in a.step_sizes.split(",") if x]:
            qs, dos = (torch.randn(1, n, h, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
            ks, vs = (torch.randn(1, n // 2, h, d, device=dev, dtype=torch.bfloat16) for _ in range(2))

            def step_fwd():
                return fa3.flash_attn_func(qs, ks, vs)

            def step_both():
                qq, kk, vv = (x.detach().requires_grad_() for x in (qs, ks, vs))
                fa3.flash_attn_func(qq, kk, vv).backward(dos)

            tf, tb = time_ms(torch, step_fwd, a.rep, warmup=1), time_ms(torch, step_both, a.rep, warmup=1)
            fl = 4 * h * d * n * (n // 2) * 3.5
            print(f"{n:8d} {tf:9.3f} {tb:11.3f} {fl / tb / 1e9:8.1f} {2 * n * h * d * 2 / 1e6:8.1f}")
            rows.append((f"step n={n}", tb, fl / tb / 1e9, float("nan")))
    if rank == 0:
        print(f"\nseqlen {s}, heads {h}, d {d}, {'causal' if causal else 'full'}, bf16, forward + backward")
        print(f"{'what':36s} {'ms':>9s} {'TFLOP/s':>8s} {'x whole':>8s}")
        for name, ms, tf, x in rows:
            print(f"{name:36s} {ms:9.2f} {tf:8.1f} {x:8.2f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump([dict(what=n, ms=m, tflops=t, speedup=x) for n, m, t, x in rows], f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
