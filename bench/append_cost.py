#!/usr/bin/env python3
"""What a decode step's KV-cache append with rotary costs in fa3, through the Python package:

  fused    flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin,
           cache_seqlens): the append and rotary in fa3's call (torch.ops.fa3.fwd_kvcache: one
           small kernel before the attention);
  torch    the same step as PyTorch operations (rotary of q and k_new, index_put into the cache),
           then flash_attn_with_kvcache without new keys: what fa3 did before the fused path;
  decode   flash_attn_with_kvcache on the cache alone (no append, no rotary): the floor.

bf16, GQA 32:8, d128, one new token per sequence, a contiguous cache; CUDA-event timing of
back-to-back calls (median of --rep), L2 not flushed (a decode step's K/V mostly is not in L2 at
these sizes anyway). TB/s = bytes of K and V read / time.

  python3 bench/append_cost.py [--batch 1,8,64] [--keys 4096,32768] [--json out.json]
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_timing import time_ms  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--keys", default="4096,32768")
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    import fa3
    from fa3.interface import _rotary

    hq, hkv, d, rd = 32, 8, 128, 64
    dev, dt = "cuda", torch.bfloat16
    rows = []
    print(f"# append cost, bf16 GQA {hq}:{hkv} d{d}, rotary dim {rd}, 1 new token; us per call and TB/s of K+V")
    print(f"{'batch':>5} {'keys':>6} | {'fused':>8} {'torch':>8} {'decode':>8} | {'fused TB/s':>10} "
          f"{'torch TB/s':>10} {'decode TB/s':>11}")
    for b in map(int, args.batch.split(",")):
        for keys in map(int, args.keys.split(",")):
            torch.manual_seed(0)
            k_cache = torch.randn(b, keys, hkv, d, device=dev, dtype=dt)
            v_cache = torch.randn_like(k_cache)
            lens = torch.full((b,), keys - 2, dtype=torch.int32, device=dev)  # room for the new token
            q = torch.randn(b, 1, hq, d, device=dev, dtype=dt)
            k_new, v_new = torch.randn(b, 1, hkv, d, device=dev, dtype=dt), torch.randn(b, 1, hkv, d, device=dev, dtype=dt)
            theta = torch.rand(keys, rd // 2, device=dev) * 6
            cos, sin = theta.cos().to(dt), theta.sin().to(dt)
            rows_idx = torch.arange(b, device=dev)

            def fused():
                return fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos,
                                                   rotary_sin=sin, cache_seqlens=lens, causal=True)

            def torch_ops():
                pos = lens.long()
                kr = _rotary(k_new, cos[pos][:, None], sin[pos][:, None], True)
                k_cache[rows_idx, pos] = kr[:, 0]
                v_cache[rows_idx, pos] = v_new[:, 0]
                qr = _rotary(q, cos[pos][:, None], sin[pos][:, None], True)
                return fa3.flash_attn_with_kvcache(qr, k_cache, v_cache, cache_seqlens=lens + 1, causal=True)

            def decode():
                return fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens + 1, causal=True)

            nbytes = 2 * b * (keys - 1) * hkv * d * 2
            ms = {name: time_ms(torch, fn, args.rep) for name, fn in
                  (("fused", fused), ("torch", torch_ops), ("decode", decode))}
            # The fused and the torch step give the same output (same rounding of the rotation).
            err = (fused().float() - torch_ops().float()).abs().max().item()
            row = {"batch": b, "keys": keys, **{f"{k}_us": v * 1e3 for k, v in ms.items()},
                   **{f"{k}_tbps": nbytes / (v * 1e-3) / 1e12 for k, v in ms.items()}, "max_diff": err}
            rows.append(row)
            print(f"{b:>5} {keys:>6} | {row['fused_us']:8.1f} {row['torch_us']:8.1f} {row['decode_us']:8.1f} | "
                  f"{row['fused_tbps']:10.2f} {row['torch_tbps']:10.2f} {row['decode_tbps']:11.2f}  "
                  f"(fused vs torch max diff {err:.1e})")
            del k_cache, v_cache
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    return 0 if all(math.isfinite(r["max_diff"]) and r["max_diff"] <= 2e-2 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
