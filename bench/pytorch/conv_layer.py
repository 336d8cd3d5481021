#!/usr/bin/env python3
"""PyTorch peer of bench_cnn --mode conv: forward + backward of one Conv2d(64, 64, 3, padding=1).

Input [B, 64, S, S] float32 NCHW with requires_grad (so backward computes the input
gradient, as locus's backward(gy, true) does, besides the weight and bias gradients), for
each S of --sizes (default 28,14), B = --batch-size (default 128). One iteration:
zero_grad(set_to_none=True), y = conv(x), y.backward(gy). Timing as _common.measure (a
calibration run that is also the warm-up, then --reps repetitions of at least --min-time
s, median per iteration); forward and backward are also timed apart inside the same
iterations. PyTorch's CPU convolution here is oneDNN's (mkldnn_convolution); --profile
prints torch.autograd.profiler's table of a few iterations to stderr, which names the
kernels.

Prints one JSON object per size:
  {"name": "conv_layer", "impl": "pytorch", "size": 28, "seconds": ..., "fwd_seconds": ...}
"""
import statistics
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import _common  # noqa: E402


def main():
    p = _common.parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--sizes", default="28,14", help="spatial sizes S, comma-separated")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    torch, dev = _common.setup(args)
    nn = torch.nn
    ch, k = 64, 3
    bs = args.batch_size
    for s in (int(v) for v in args.sizes.split(",")):
        torch.manual_seed(0)
        conv = nn.Conv2d(ch, ch, k, padding=1).to(dev)
        x = (torch.rand(bs, ch, s, s, device=dev) * 2 - 1).requires_grad_(True)
        gy = torch.rand(bs, ch, s, s, device=dev) * 2 - 1
        acc = {"fwd": 0.0, "bwd": 0.0}

        def iteration():
            conv.zero_grad(set_to_none=True)
            x.grad = None
            t0 = time.perf_counter()
            y = conv(x)
            _common._sync(torch, dev)
            t1 = time.perf_counter()
            y.backward(gy)
            _common._sync(torch, dev)
            t2 = time.perf_counter()
            acc["fwd"] += t1 - t0
            acc["bwd"] += t2 - t1

        if args.profile:
            for _ in range(3):
                iteration()
            with torch.autograd.profiler.profile() as prof:
                for _ in range(5):
                    iteration()
            print(f"conv_layer.py: S={s}", file=sys.stderr)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), file=sys.stderr)
            continue

        # _common.measure's calibration (the first call is the warm-up), then the
        # repetitions, with the forward / backward split recorded
        iteration()
        iters = 1
        while True:
            t = _common._run(torch, dev, iteration, iters)
            if t >= args.min_time or iters >= 1_000_000:
                break
            iters = max(iters + 1, min(10 * iters, int(iters * 1.4 * args.min_time / max(t, 1e-9))))
        total, fwd, bwd = [], [], []
        for _ in range(max(1, args.reps)):
            acc["fwd"] = acc["bwd"] = 0.0
            t = _common._run(torch, dev, iteration, iters)
            total.append(t / iters)
            fwd.append(acc["fwd"] / iters)
            bwd.append(acc["bwd"] / iters)
        med = statistics.median(total)
        flop_fwd = 2.0 * bs * ch * ch * k * k * s * s
        rec = {"name": "conv_layer", "impl": "pytorch", **_common.context(torch, dev, args),
               "batch_size": bs, "channels": ch, "kernel": k, "padding": 1, "size": s,
               "iterations": iters, "reps": args.reps, "seconds": med,
               "fwd_seconds": statistics.median(fwd), "bwd_seconds": statistics.median(bwd),
               "gflop_per_s": 3 * flop_fwd / med * 1e-9, "rep_ms": [round(v * 1e3, 4) for v in total],
               "mkldnn": torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled}
        _common.emit(rec, f"torch conv_layer 64x64x3/{bs}/{s}/{dev.type}")


if __name__ == "__main__":
    main()
