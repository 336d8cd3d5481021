#!/usr/bin/env python3
"""The PyTorch side of bench/bench_resnet.cpp: one training step (forward, cross-entropy,
backward, AdamW lr 1e-3 weight decay 1e-4) of the main job's ResNet (width 16, one basic
block per stage; the model of tests/python/resnet_torch.py, which is torchvision's
BasicBlock ResNet for 1-channel images) at batch --batch-size on random 1x28x28 images,
fp32 on the CPU. Prints one JSON line: the median ms per step over --rounds rounds of
--steps steps (after two warm-up steps), and samples/s.

    resnet_step.py [--batch-size 128] [--steps 10] [--rounds 5] [--threads N]"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from resnet_torch import ResNet  # noqa: E402

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--batch-size", type=int, default=128)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--threads", type=int, default=0)
a = p.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)
m = ResNet(10, 16, (1, 1, 1))
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=1e-4)
x = torch.rand(a.batch_size, 1, 28, 28)
y = torch.arange(a.batch_size) % 10


def step():
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(m(x), y).backward()
    opt.step()


m.train()
for _ in range(2):
    step()
ms = []
for _ in range(a.rounds):
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    ms.append(1e3 * (time.perf_counter() - t0) / a.steps)
med = statistics.median(ms)
print(json.dumps({"variant": "pytorch", "torch": torch.__version__, "batch": a.batch_size,
                  "threads": torch.get_num_threads(), "ms_per_step": round(med, 3),
                  "samples_per_s": round(1e3 * a.batch_size / med, 1)}))
