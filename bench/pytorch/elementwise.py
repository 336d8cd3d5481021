#!/usr/bin/env python3
"""PyTorch peer of bench_kernels' BM_fused_relu_axpb_*: y = relu(a*x + b) over 2^26
float32 elements (a, x, b normally distributed), timed as two variants in alternation:
  eager  y = torch.relu(a * x + b)                      (idiomatic; makes temporaries)
  out    torch.addcmul(b, a, x, out=y); torch.relu_(y)  (no allocation, two passes)
Prints one JSON object per variant, e.g.
  {"name": "elementwise", "op": "relu(a*x+b)", "variant": "out", "n": 67108864,
   "seconds": ..., "gbytes_per_s": ..., ...}
Bytes count a, x, b read and y written (16 bytes an element), as bench_kernels does.
"""
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import _common  # noqa: E402


def main():
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 26, help="elements (default 2^26)")
    args = p.parse_args()
    torch, dev = _common.setup(args)
    g = torch.Generator(device=dev).manual_seed(1)
    a, x, b = (torch.randn(args.n, generator=g, device=dev, dtype=torch.float32) for _ in range(3))
    y = torch.empty_like(a)

    def eager():
        nonlocal y
        y = torch.relu(a * x + b)

    def out():
        torch.addcmul(b, a, x, out=y)
        torch.relu_(y)

    res = _common.measure(torch, dev, {"eager": eager, "out": out}, args.reps, args.min_time)
    nbytes = 16 * args.n
    for variant, r in res.items():
        rec = {"name": "elementwise", "op": "relu(a*x+b)", "variant": variant, "n": args.n,
               "dtype": "float32", **_common.context(torch, dev, args), **r,
               "gbytes_per_s": nbytes / r["seconds"] / 1e9}
        _common.emit(rec, f"torch relu(a*x+b) {variant}/{args.n}/{dev.type}",
                     bytes_per_iter=nbytes, label=f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
