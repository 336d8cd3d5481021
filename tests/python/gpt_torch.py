#!/usr/bin/env python3
"""A small GPT (GPT-2's block: pre-norm, causal multi-head attention, GELU MLP; learned
positions; the output projection tied to the token embedding) in PyTorch, for
tests/test_gpt_torch.cpp, which writes the same model with locus's differentiable
operations (the CTest "interop: a small GPT against PyTorch (logits, loss, gradients)").

    gpt_torch.py OUTFILE

In float64, with a fixed seed, the file (safetensors) holds:

    w.NAME      every parameter (PyTorch's initialisation, biases and norms randomised so
                that no gradient is trivially zero), NAME as named_parameters() says
    ids, targets   token ids [B, T] and next-token targets [B, T] (int64)
    logits      [B * T, V]
    loss        the mean cross-entropy of logits against targets
    g.NAME      dL/dNAME for every parameter, by autograd

The sizes below must stay the C++ test's. Exit 77 (CTest: skipped) without torch or
safetensors."""
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
except ImportError as e:
    print(f"SKIPPED: this Python lacks PyTorch or safetensors ({e}); bench/run installs torch in "
          "~/.cache/locus-bench-venv")
    sys.exit(77)

if len(sys.argv) != 2:
    print("usage: gpt_torch.py OUTFILE", file=sys.stderr)
    sys.exit(2)

V, T, C, H, L, B = 11, 9, 12, 3, 2, 2
nn = torch.nn
torch.manual_seed(20261206)
torch.set_default_dtype(torch.float64)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):  # x [B, T, C]
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.c_proj(a)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(t))
        for blk in self.h:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight).reshape(-1, V)  # tied output projection


m = GPT()
with torch.no_grad():
    for name, p in m.named_parameters():
        if name.endswith(".bias") or "ln" in name:
            p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn(*p.shape))
ids = torch.randint(0, V, (B, T))
targets = torch.randint(0, V, (B, T))
logits = m(ids)
loss = F.cross_entropy(logits, targets.reshape(-1))
loss.backward()
out = {f"w.{n}": p.detach().clone().contiguous() for n, p in m.named_parameters()}
out.update({f"g.{n}": p.grad.detach().clone().contiguous() for n, p in m.named_parameters()})
out["ids"], out["targets"] = ids, targets
out["logits"] = logits.detach().clone().contiguous()
out["loss"] = loss.detach().reshape(1).clone()
path = sys.argv[1]
os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
save_file(out, path, metadata={"writer": "tests/python/gpt_torch.py", "torch": torch.__version__})
print(f"wrote a GPT of {sum(p.numel() for p in m.parameters())} parameters ({len(out)} tensors, "
      f"torch {torch.__version__}) to {path}")
