#!/usr/bin/env python3
"""PyTorch peer of bench_matmul: square n x n x n GEMM (default float32 at n = 512, 1024,
2048; inputs normally distributed), timed as two variants in alternation:
  mm_out  torch.mm(a, b, out=c)   (existing output, as locus::matmul_into)
  matmul  c = a @ b               (allocating, as locus::matmul)
Prints one JSON object per size and variant, e.g.
  {"name": "matmul", "n": 1024, "variant": "mm_out", "dtype": "float32", "seconds": ...,
   "gflops": ..., ...}
GFLOP/s count 2 n^3 per product. On cuda float32 runs in full precision unless
--allow-tf32 is given (PyTorch's default).
"""
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import _common  # noqa: E402


def main():
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", default="512,1024,2048", help="comma-separated n (default 512,1024,2048)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--allow-tf32", action="store_true", help="cuda: let float32 GEMMs use TF32")
    args = p.parse_args()
    torch, dev = _common.setup(args)
    torch.backends.cuda.matmul.allow_tf32 = args.allow_tf32
    dtype = getattr(torch, args.dtype)
    for n in (int(s) for s in args.sizes.split(",") if s):
        g = torch.Generator(device=dev).manual_seed(11)
        a = torch.randn(n, n, generator=g, device=dev).to(dtype)
        b = torch.randn(n, n, generator=g, device=dev).to(dtype)
        c = torch.empty(n, n, device=dev, dtype=dtype)

        def mm_out():
            torch.mm(a, b, out=c)

        def matmul():
            return a @ b

        res = _common.measure(torch, dev, {"mm_out": mm_out, "matmul": matmul}, args.reps, args.min_time)
        flops = 2.0 * n * n * n
        for variant, r in res.items():
            rec = {"name": "matmul", "n": n, "variant": variant, "dtype": args.dtype,
                   **_common.context(torch, dev, args), **r, "gflops": flops / r["seconds"] / 1e9}
            if dev.type == "cuda" and args.dtype == "float32":
                rec["tf32"] = args.allow_tf32
            _common.emit(rec, f"torch matmul {variant} {args.dtype}/{n}/{dev.type}",
                         items_per_iter=flops, label=f"{rec['gflops']:.1f} GFLOP/s (items = FLOP)")
        del a, b, c


if __name__ == "__main__":
    main()
