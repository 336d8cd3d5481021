#!/usr/bin/env python3
"""The PyTorch side of bench/bench_attention.cpp: torch.nn.functional.scaled_dot_product_attention
with is_causal=True, forward + backward (of the output's sum) for q, k and v of
[--batch, --heads, T, --dim] in fp32 on the CPU, at each T of --lengths. Prints one JSON line
per length: the median ms of one forward + backward over --rounds rounds of --steps calls
(after one warm-up call).

    attention.py [--lengths 128,512,2048] [--batch 4] [--heads 4] [--dim 32] [--steps 5] [--rounds 5] [--threads N]"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--lengths", default="128,512,2048")
p.add_argument("--batch", type=int, default=4)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--dim", type=int, default=32)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--threads", type=int, default=0)
a = p.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)
for t in (int(x) for x in a.lengths.split(",")):
    q, k, v = (torch.randn(a.batch, a.heads, t, a.dim, requires_grad=True) for _ in range(3))

    def call():
        for x in (q, k, v):
            x.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    call()
    ms = []
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            call()
        ms.append(1e3 * (time.perf_counter() - t0) / a.steps)
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "batch": a.batch, "heads": a.heads,
                      "length": t, "dim": a.dim, "threads": torch.get_num_threads(),
                      "ms_fwd_bwd": round(statistics.median(ms), 3)}), flush=True)
