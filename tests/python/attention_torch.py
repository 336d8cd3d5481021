#!/usr/bin/env python3
"""Writes what PyTorch's torch.nn.functional.scaled_dot_product_attention computes, for
tests/test_attention.cpp to compare against (the CTest "interop: scaled dot-product
attention against PyTorch (forward and backward)").

    attention_torch.py OUTFILE

In float64, with a fixed seed, the file (safetensors) holds for case CASE:

    CASE.q, CASE.k, CASE.v    the inputs [B, H, Tq, E], [B, H, Tk, E], [B, H, Tk, Ev]
    CASE.gy                   a random upstream gradient of the output's shape
    CASE.y                    the output
    CASE.gq, CASE.gk, CASE.gv dL/dq, dL/dk, dL/dv for L = sum(y * gy), by autograd

and rms_norm.x, .w, .gy, .y, .gx, .gw for torch.nn.functional.rms_norm over the last
axis with a gain (eps 1e-5), and layer_norm.x, .w, .b, .gy, .y, .gx, .gw, .gb for
torch.nn.functional.layer_norm with weight and bias (eps 1e-5).

And for tests/test_attention_module.cpp, nn.MultiheadAttention as its self_net and
cross_net (the input through a zero "shift" parameter, so its gradient is the input's):
mha_self (batch_first, causal mask, width 12, 3 heads, x [2, 6, 12]) and mha_cross (time
first, width 8, 2 heads, query [4, 2, 8], key and value [7, 2, 8] parameters), each
with .x, .gy, .y, .w.NAME and .g.NAME for every parameter under named_parameters()'s
names (attn.in_proj_weight, ...).

The case names and their options (causal, scale) are read by the C++ test: keep them in
step with the table there. Exit 77 (CTest: skipped) without torch or safetensors."""
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
    print("usage: attention_torch.py OUTFILE", file=sys.stderr)
    sys.exit(2)

torch.manual_seed(20261206)
torch.set_default_dtype(torch.float64)

# name: (B, H, Tq, Tk, E, Ev, causal, scale or None)
cases = {
    "plain": (2, 3, 5, 5, 8, 8, False, None),
    "causal": (2, 4, 17, 17, 8, 8, True, None),
    "causal_long_keys": (1, 2, 40, 70, 16, 16, True, None),
    "causal_short_keys": (1, 2, 9, 4, 4, 6, True, None),
    "scaled": (1, 1, 33, 33, 32, 16, False, 0.3),
    "one_head_64": (1, 1, 64, 64, 64, 64, True, None),
}

out = {}
for name, (b, h, tq, tk, e, ev, causal, scale) in cases.items():
    q = torch.randn(b, h, tq, e, requires_grad=True)
    k = torch.randn(b, h, tk, e, requires_grad=True)
    v = torch.randn(b, h, tk, ev, requires_grad=True)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    gy = torch.randn(*y.shape)
    (y * gy).sum().backward()
    for key, t in (("q", q), ("k", k), ("v", v), ("gy", gy), ("y", y), ("gq", q.grad), ("gk", k.grad), ("gv", v.grad)):
        out[f"{name}.{key}"] = t.detach().clone().contiguous()

# RMS normalisation over the last axis, with a gain (nn.RMSNorm's weight), eps 1e-5.
x = torch.randn(3, 4, 24, requires_grad=True)
w = (1.0 + 0.5 * torch.randn(24)).requires_grad_(True)
y = F.rms_norm(x, (24,), w, 1e-5)
gy = torch.randn(*y.shape)
(y * gy).sum().backward()
for key, t in (("x", x), ("w", w), ("gy", gy), ("y", y), ("gx", x.grad), ("gw", w.grad)):
    out[f"rms_norm.{key}"] = t.detach().clone().contiguous()

# Layer normalisation over the last axis with weight and bias (nn.LayerNorm's), eps 1e-5.
x = (torch.randn(3, 5, 20) * 2.0 + 1.5).requires_grad_(True)
w = (1.0 + 0.5 * torch.randn(20)).requires_grad_(True)
b = (0.3 * torch.randn(20)).requires_grad_(True)
y = F.layer_norm(x, (20,), w, b, 1e-5)
gy = torch.randn(*y.shape)
(y * gy).sum().backward()
for key, t in (("x", x), ("w", w), ("b", b), ("gy", gy), ("y", y), ("gx", x.grad), ("gw", w.grad), ("gb", b.grad)):
    out[f"layer_norm.{key}"] = t.detach().clone().contiguous()



class SelfNet(torch.nn.Module):  # tests/test_attention_module.cpp's self_net, batch first and causal
    def __init__(self, shape, e, h):
        super().__init__()
        self.shift = torch.nn.Parameter(torch.zeros(*shape))
        self.attn = torch.nn.MultiheadAttention(e, h, batch_first=True)

    def forward(self, x):
        z = x + self.shift
        t = z.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)  # True: not attended
        return self.attn(z, z, z, attn_mask=mask, need_weights=False)[0]


class CrossNet(torch.nn.Module):  # its cross_net, time first, no mask
    def __init__(self, shape, kv, e, h):
        super().__init__()
        self.shift = torch.nn.Parameter(torch.zeros(*shape))
        self.key = torch.nn.Parameter(torch.rand(*kv) * 2 - 1)
        self.val = torch.nn.Parameter(torch.rand(*kv) * 2 - 1)
        self.attn = torch.nn.MultiheadAttention(e, h)

    def forward(self, x):
        return self.attn(x + self.shift, self.key, self.val, need_weights=False)[0]


for name, net, xshape in (("mha_self", SelfNet((2, 6, 12), 12, 3), (2, 6, 12)),
                          ("mha_cross", CrossNet((4, 2, 8), (7, 2, 8), 8, 2), (4, 2, 8))):
    with torch.no_grad():  # biases away from PyTorch's zeros, so that their gradients matter
        net.attn.in_proj_bias.copy_(0.3 * torch.randn(*net.attn.in_proj_bias.shape))
        net.attn.out_proj.bias.copy_(0.3 * torch.randn(*net.attn.out_proj.bias.shape))
    x = torch.randn(*xshape)
    y = net(x)
    gy = torch.randn(*y.shape)
    (y * gy).sum().backward()
    out[f"{name}.x"], out[f"{name}.gy"], out[f"{name}.y"] = x.clone(), gy.clone(), y.detach().clone().contiguous()
    for n, p_ in net.named_parameters():
        out[f"{name}.w.{n}"] = p_.detach().clone().contiguous()
        out[f"{name}.g.{n}"] = p_.grad.detach().clone().contiguous()

assert all(v.dtype == torch.float64 for v in out.values())
path = sys.argv[1]
os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
save_file(out, path, metadata={"writer": "tests/python/attention_torch.py", "torch": torch.__version__})
print(f"wrote {len(cases)} cases ({len(out)} tensors, torch {torch.__version__}) to {path}")
