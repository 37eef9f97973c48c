"""fa3_quantize_fp8's bandwidth (bytes read + written over time, TB/s) on large 16-bit tensors, for one
or more builds of libfa3 run alternately in one process, and whether they write the same bytes.

    python3 bench/quantize_bw.py --lib A=build/old/libfa3.so --lib B=build/ci/libfa3.so --rounds 3

Rows: head dim x block of tokens x (plain, rotated) x dtype; the tensor is [4, s, 16, d] with s chosen
so that it holds 128M elements (256 MiB in, 128 MiB out). Timing: a loop of --iters calls between two
CUDA events after 3 warm-up calls, the median of --rounds rounds; each round runs every build once."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fa3_ctypes  # noqa: E402

SEED = 12345


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", action="append", default=[], help="NAME=path of a libfa3.so (repeatable)")
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--blocks", default="64,128,256")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    import torch

    libs = []
    for spec in args.lib or ["fa3=" + (os.environ.get("FA3_LIB") or fa3_ctypes.DEFAULT_LIB)]:
        name, _, path = spec.partition("=")
        libs.append((name, fa3_ctypes.load(path)))
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    print(f"{'dtype':>5} {'d':>4} {'block':>5} {'rotated':>7} " + " ".join(f"{n:>14}" for n, _ in libs) + "  same bytes")
    for dname in args.dtypes.split(","):
        for d in map(int, args.hdims.split(",")):
            s = (128 << 20) // (4 * 16 * d)
            x = torch.randn(4, s, 16, d, device="cuda").to(dtypes[dname])
            nbytes = x.numel() * (x.element_size() + 1)  # 16-bit in, e4m3 out (descales: < 0.1%)
            for block in map(int, args.blocks.split(",")):
                for rotate in (False, True):
                    times = {n: [] for n, _ in libs}
                    outs = {}
                    for _ in range(args.rounds):
                        for n, lib in libs:
                            for _ in range(3):
                                out = fa3_ctypes.quantize_fp8(lib, x, block, hadamard=rotate, seed=SEED)
                            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            a.record()
                            for _ in range(args.iters):
                                fa3_ctypes.quantize_fp8(lib, x, block, hadamard=rotate, seed=SEED)
                            b.record()
                            b.synchronize()
                            times[n].append(a.elapsed_time(b) / args.iters)
                            outs[n] = out
                    med = [sorted(times[n])[len(times[n]) // 2] for n, _ in libs]
                    cells = [f"{nbytes / (t * 1e-3) / 1e12:.2f}" + (f" ({med[0] / t:.2f}x)" if i else "")
                             for i, t in enumerate(med)]
                    first = outs[libs[0][0]]
                    same = all(torch.equal(o[0].view(torch.uint8), first[0].view(torch.uint8)) and torch.equal(o[1], first[1])
                               for o in outs.values())
                    print(f"{dname:>5} {d:>4} {block:>5} {str(rotate):>7} " + " ".join(f"{c:>14}" for c in cells) +
                          f"  {'yes' if same else 'NO'}", flush=True)


if __name__ == "__main__":
    main()
