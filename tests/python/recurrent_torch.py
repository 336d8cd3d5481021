#!/usr/bin/env python3
"""Writes what PyTorch's nn.LSTM and nn.GRU compute, for tests/test_recurrent.cpp to
compare against (the CTest "interop: nn.LSTM and nn.GRU against PyTorch (weights by
name, outputs, gradients)").

    recurrent_torch.py OUTFILE

In float64, with a fixed seed, the file (safetensors) holds:

  the model of tests/test_recurrent.cpp's seq_net: nn.LSTM(3, 5, num_layers=2,
  batch_first=True), then nn.GRU(5, 4, batch_first=True), then nn.Linear(4, 2) over
  every step, from a zero state:
    w.NAME   every parameter under its state_dict name (lstm.weight_ih_l0, ...)
    x        the input [B, T, 3];  gy  the upstream gradient [B*T, 2]
    y        the output [B*T, 2];  g.NAME  dL/dparameter for L = sum(y * gy)

  one nn.LSTM(4, 6, num_layers=2) and one nn.GRU(4, 6) (time first) from a given state:
    s.lstm.NAME, s.gru.NAME   the parameters
    s.x [T, B, 4], s.h0 and s.c0 [2, B, 6] (the GRU takes s.h0's first layer)
    s.lstm.wy, .wh, .wc       weights of L = sum(y wy) + sum(h_n wh) + sum(c_n wc)
    s.lstm.y, .h, .c          the outputs;  s.lstm.gx, .gh0, .gc0, s.lstm.g.NAME the gradients
    s.gru.wy, .wh, s.gru.y, .h, .gx, .gh0, s.gru.g.NAME  the same for the GRU

Exit 77 (CTest: skipped) without torch or safetensors."""
import os
import sys

try:
    import torch
    from safetensors.torch import save_file
except ImportError as e:
    print(f"SKIPPED: this Python lacks PyTorch or safetensors ({e}); bench/run installs torch in "
          "~/.cache/locus-bench-venv")
    sys.exit(77)

if len(sys.argv) != 2:
    print("usage: recurrent_torch.py OUTFILE", file=sys.stderr)
    sys.exit(2)

torch.manual_seed(20261207)
torch.set_default_dtype(torch.float64)
out = {}


def put(key, t):
    out[key] = t.detach().clone().contiguous()


class SeqNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 5, num_layers=2, batch_first=True)
        self.gru = torch.nn.GRU(5, 4, batch_first=True)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        y, _ = self.lstm(x)
        y, _ = self.gru(y)
        return self.head(y.reshape(-1, 4))


B, T = 3, 7
net = SeqNet()
x = torch.randn(B, T, 3, requires_grad=True)
y = net(x)
gy = torch.randn(*y.shape)
(y * gy).sum().backward()
for name, p in net.named_parameters():
    put("w." + name, p)
    put("g." + name, p.grad)
put("x", x)
put("gy", gy)
put("y", y)

# from a given state, time first
T2, B2 = 5, 2
lstm = torch.nn.LSTM(4, 6, num_layers=2)
gru = torch.nn.GRU(4, 6)
sx = torch.randn(T2, B2, 4)
h0 = torch.randn(2, B2, 6)
c0 = torch.randn(2, B2, 6)
put("s.x", sx)
put("s.h0", h0)
put("s.c0", c0)
xs, hs, cs = sx.clone().requires_grad_(True), h0.clone().requires_grad_(True), c0.clone().requires_grad_(True)
y, (h, c) = lstm(xs, (hs, cs))
wy, wh, wc = torch.randn(*y.shape), torch.randn(*h.shape), torch.randn(*c.shape)
((y * wy).sum() + (h * wh).sum() + (c * wc).sum()).backward()
for key, t in (("wy", wy), ("wh", wh), ("wc", wc), ("y", y), ("h", h), ("c", c), ("gx", xs.grad), ("gh0", hs.grad),
               ("gc0", cs.grad)):
    put("s.lstm." + key, t)
for name, p in lstm.named_parameters():
    put("s.lstm." + name, p)
    put("s.lstm.g." + name, p.grad)
xs, hs = sx.clone().requires_grad_(True), h0[:1].clone().requires_grad_(True)
y, h = gru(xs, hs)
wy, wh = torch.randn(*y.shape), torch.randn(*h.shape)
((y * wy).sum() + (h * wh).sum()).backward()
for key, t in (("wy", wy), ("wh", wh), ("y", y), ("h", h), ("gx", xs.grad), ("gh0", hs.grad)):
    put("s.gru." + key, t)
for name, p in gru.named_parameters():
    put("s.gru." + name, p)
    put("s.gru.g." + name, p.grad)

assert all(v.dtype == torch.float64 for v in out.values())
path = sys.argv[1]
os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
save_file(out, path, metadata={"writer": "tests/python/recurrent_torch.py", "torch": torch.__version__})
print(f"wrote {len(out)} tensors (torch {torch.__version__}) to {path}")
