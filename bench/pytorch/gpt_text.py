#!/usr/bin/env python3
"""The second main job (examples/gpt.cpp) written in PyTorch, for the learning target of
issue 32: the same corpus bytes and split, the same model (GPT-2's block, learned
positions, tied projection; width, heads, blocks, context as gpt's defaults), the same
initialisation rules (nn.Linear's default, embeddings N(0, 0.02), norms 1 and 0), AdamW
(betas 0.9, 0.95) with no decay on rank-1 parameters and embeddings, warm-up then cosine
to lr / 10, clipping at norm 1, the same batch and number of steps, and the validation
loss over the same windows (the first --eval-batches batches of consecutive windows of
the last 10% of the corpus). Training windows are drawn by torch's generator (seed), not
by locus's Philox: the same distribution, not the same windows.

    gpt_text.py [--corpus DIR] [--steps 600] [--eval-every 100] [--threads N] [--log CSV]
    gpt_text.py --evaluate CHECKPOINT [--corpus ... --context ... as gpt was run]

Prints one line per evaluation as gpt does (step, train loss, val loss, perplexity).
With --evaluate it trains nothing: it loads the model's weights from a checkpoint gpt
wrote (its tensors under PyTorch's names, strictly: every parameter, nothing else but
the optimizer's "optimizer.*" state) and prints "val loss X" over the same windows, in
float64 (tests/python/gpt_checkpoint.py compares it with gpt's own figure)."""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--corpus", default="/usr/share/games/fortunes")
p.add_argument("--steps", type=int, default=600)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--context", type=int, default=64)
p.add_argument("--width", type=int, default=96)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--weight-decay", type=float, default=0.1)
p.add_argument("--warmup", type=int, default=50)
p.add_argument("--eval-every", type=int, default=100)
p.add_argument("--eval-batches", type=int, default=16)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--threads", type=int, default=0)
p.add_argument("--log", default="")
p.add_argument("--evaluate", default="", help="a checkpoint gpt wrote: print its validation loss and stop")
a = p.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
torch.manual_seed(a.seed)

# the corpus as text_corpus reads it: regular files in name order, no .dat, no links
if os.path.isdir(a.corpus):
    names = sorted(n for n in os.listdir(a.corpus)
                   if not n.endswith(".dat") and not os.path.islink(os.path.join(a.corpus, n))
                   and os.path.isfile(os.path.join(a.corpus, n)))
    data = b"".join(open(os.path.join(a.corpus, n), "rb").read() for n in names)
else:
    data = open(a.corpus, "rb").read()
symbols = sorted(set(data))
index = {b: i for i, b in enumerate(symbols)}
ids = torch.tensor([index[b] for b in data], dtype=torch.long)
n_val = int(len(ids) * 0.1)
train, val = ids[: len(ids) - n_val], ids[len(ids) - n_val:]
V, T, C, H, L, B = len(symbols), a.context, a.width, a.heads, a.layers, a.batch


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.c_attn, self.c_proj = nn.LayerNorm(C), nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.ln_2, self.c_fc, self.mlp_proj = nn.LayerNorm(C), nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, x):
        e = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for blk in self.h:
            e = blk(e)
        return F.linear(self.ln_f(e), self.wte.weight).reshape(-1, V)


m = GPT()
no_decay = [p_ for n, p_ in m.named_parameters() if p_.dim() <= 1 or n.startswith(("wte", "wpe"))]
decay = [p_ for n, p_ in m.named_parameters() if not (p_.dim() <= 1 or n.startswith(("wte", "wpe")))]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=a.lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step):  # locus's warmup_lr<cosine_lr>{warmup, {steps - warmup, lr / 10}}
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    total = max(1, a.steps - a.warmup)
    s = step - a.warmup
    lo = a.lr / 10
    return lo if s >= total else lo + (a.lr - lo) * 0.5 * (1 + math.cos(math.pi * s / total))


windows = (len(val) - 1) // T
starts = [w * T for w in range(min(windows, a.eval_batches * B))]
val_x = torch.stack([val[s: s + T] for s in starts])
val_y = torch.stack([val[s + 1: s + 1 + T] for s in starts])


def val_loss():
    with torch.no_grad():
        return sum(F.cross_entropy(m(val_x[i: i + B]), val_y[i: i + B].reshape(-1), reduction="sum").item()
                   for i in range(0, len(val_x), B)) / val_y.numel()


if a.evaluate:
    from safetensors.torch import load_file

    state = {k: v for k, v in load_file(a.evaluate).items() if not k.startswith("optimizer.")}
    m.double().load_state_dict({k: v.double() for k, v in state.items()}, strict=True)
    print(f"{a.evaluate}: {len(state)} tensors loaded into the PyTorch GPT; val loss {val_loss():.10f}")
    sys.exit(0)
log = open(a.log, "w") if a.log else None
if log:
    log.write("step,train_loss,val_loss,val_perplexity,lr,seconds\n")
t0, run_loss, run_n = time.time(), 0.0, 0
for step in range(a.steps):
    for g in opt.param_groups:
        g["lr"] = lr_at(step)
    off = torch.randint(0, len(train) - T, (B,))
    x = torch.stack([train[o: o + T] for o in off])
    y = torch.stack([train[o + 1: o + 1 + T] for o in off])
    loss = F.cross_entropy(m(x), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    run_loss += loss.item()
    run_n += 1
    if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
        vl = val_loss()
        secs = time.time() - t0
        print(f"step {step + 1:6d}  train loss {run_loss / run_n:.4f}  val loss {vl:.4f}  perplexity {math.exp(vl):.3f}  "
              f"lr {lr_at(step):.2e}  {secs:.0f} s", flush=True)
        if log:
            log.write(f"{step + 1},{run_loss / run_n},{vl},{math.exp(vl)},{lr_at(step)},{secs}\n")
            log.flush()
        run_loss, run_n = 0.0, 0
