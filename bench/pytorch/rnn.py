#!/usr/bin/env python3
"""The PyTorch side of bench/bench_rnn.cpp: one torch.nn.LSTM layer and one torch.nn.GRU
layer, forward + backward (of the output's sum) over x [--seq, --batch, --input] (x
requires a gradient) with hidden size --hidden, fp32 on the CPU. Prints one JSON line per
kind: the median ms of one forward + backward over --rounds rounds of --calls calls (after
one warm-up call).

    rnn.py [--seq 64] [--batch 32] [--input 128] [--hidden 256] [--calls 5] [--rounds 5] [--threads N]"""
import argparse
import json
import statistics
import time

import torch

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--input", type=int, default=128)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--calls", type=int, default=5)
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--threads", type=int, default=0)
a = p.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)
for kind, cls in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU)):
    layer = cls(a.input, a.hidden)
    x = torch.randn(a.seq, a.batch, a.input, requires_grad=True)

    def call():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x)[0].sum().backward()

    call()
    ms = []
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        for _ in range(a.calls):
            call()
        ms.append(1e3 * (time.perf_counter() - t0) / a.calls)
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "kind": kind, "seq": a.seq, "batch": a.batch,
                      "input": a.input, "hidden": a.hidden, "threads": torch.get_num_threads(),
                      "ms_fwd_bwd": round(statistics.median(ms), 3)}), flush=True)
