#!/usr/bin/env python3
"""PyTorch peer of bench_kernels' BM_sum_*: torch.sum over 2^26 float32 elements (normally
distributed), with the absolute error of the float32 result against a float64 sum.
Prints one JSON object, e.g.
  {"name": "reduce", "op": "sum", "n": 67108864, "seconds": ..., "abs_error": ..., ...}
Bytes count the input read (4 bytes an element), as bench_kernels does.
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
    a = torch.randn(args.n, generator=g, device=dev, dtype=torch.float32)
    s = torch.sum(a)

    def run():
        nonlocal s
        s = torch.sum(a)

    r = _common.measure(torch, dev, {"sum": run}, args.reps, args.min_time)["sum"]
    exact = torch.sum(a.double()).item()
    nbytes = 4 * args.n
    rec = {"name": "reduce", "op": "sum", "n": args.n, "dtype": "float32",
           **_common.context(torch, dev, args), **r,
           "gbytes_per_s": nbytes / r["seconds"] / 1e9, "abs_error": abs(s.item() - exact)}
    _common.emit(rec, f"torch sum/{args.n}/{dev.type}", bytes_per_iter=nbytes,
                 label=f"abs_error {rec['abs_error']:.2g}")


if __name__ == "__main__":
    main()
