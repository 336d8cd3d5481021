#!/usr/bin/env python3
"""Writes what PyTorch computes for locus's CNN layers, for tests/test_conv_torch.cpp to
compare against (the CTest "interop: conv2d, pooling and batch norm against PyTorch").

    conv_torch.py OUTFILE

In float64, with a fixed seed, each case below is one PyTorch layer on one input. The
file (safetensors, one for all cases) holds for case CASE:

    CASE.x                         the input [n, c, h, w]
    CASE.weight, CASE.bias         the layer's parameters (when it has them)
    CASE.gy                        a random upstream gradient of the output's shape
    CASE.y                         the forward output (training mode)
    CASE.gx                        dL/dx for L = sum(y * gy), by autograd
    CASE.gweight, CASE.gbias       dL/dweight, dL/dbias (when the layer has them)
    CASE.running_mean, .running_var, .y_eval
                                   batch norm only: the running statistics after the
                                   training forward (momentum 0.1) and the eval-mode
                                   output with them

The case names are read by the C++ test: keep them (and the layers' arguments there)
in step with this file. Exit 77 (CTest: skipped) without torch or safetensors."""
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
    print("usage: conv_torch.py OUTFILE", file=sys.stderr)
    sys.exit(2)

torch.manual_seed(20240611)
torch.set_default_dtype(torch.float64)
nn = torch.nn

# name: (layer, input shape); the same layers as the table in tests/test_conv_torch.cpp
cases = {
    "conv_plain": (nn.Conv2d(3, 4, 3), (2, 3, 7, 6)),
    "conv_stride2_pad1": (nn.Conv2d(2, 3, 3, stride=2, padding=1), (3, 2, 9, 8)),
    "conv_dilation2_pad2_nobias": (nn.Conv2d(2, 2, 3, padding=2, dilation=2, bias=False), (2, 2, 9, 9)),
    "conv_groups2": (nn.Conv2d(4, 6, 3, padding=1, groups=2), (2, 4, 6, 6)),
    "conv_k5_stride3_nonsquare": (nn.Conv2d(3, 2, 5, stride=3, padding=2), (2, 3, 11, 8)),
    "conv_64x64_pad1": (nn.Conv2d(64, 64, 3, padding=1), (4, 64, 8, 8)),
    "max_pool_k2": (nn.MaxPool2d(2), (2, 3, 6, 7)),
    "max_pool_k3_stride2_pad1": (nn.MaxPool2d(3, stride=2, padding=1), (2, 2, 7, 6)),
    "avg_pool_k3_stride2_pad1_include_pad": (nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=True), (2, 2, 7, 6)),
    "avg_pool_k3_stride2_pad1_exclude_pad": (nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), (2, 2, 7, 6)),
    "adaptive_avg_pool_3x2": (nn.AdaptiveAvgPool2d((3, 2)), (2, 2, 7, 5)),
    "batch_norm_c4": (nn.BatchNorm2d(4), (3, 4, 5, 6)),
}

out = {}
for name, (layer, shape) in cases.items():
    layer = layer.double().train()
    x = torch.randn(*shape)
    if isinstance(layer, nn.BatchNorm2d):
        with torch.no_grad():  # affine parameters other than 1 and 0; channels off centre, scaled
            layer.weight.copy_(1.0 + 0.5 * torch.randn(layer.num_features))
            layer.bias.copy_(0.5 * torch.randn(layer.num_features))
        x = x * (1.0 + torch.rand(1, shape[1], 1, 1) * 2.0) + torch.randn(1, shape[1], 1, 1) * 2.0
    elif isinstance(layer, nn.Conv2d):
        with torch.no_grad():  # PyTorch's own initialisation, drawn again from the seed
            layer.reset_parameters()
    x = x.contiguous().requires_grad_(True)
    params = dict(layer.named_parameters())
    out[f"{name}.x"] = x.detach().clone()
    for p, t in params.items():
        out[f"{name}.{p}"] = t.detach().clone()
    y = layer(x)
    gy = torch.randn(*y.shape)
    out[f"{name}.gy"] = gy
    out[f"{name}.y"] = y.detach().clone()
    (y * gy).sum().backward()
    out[f"{name}.gx"] = x.grad.detach().clone()
    for p, t in params.items():
        out[f"{name}.g{p}"] = t.grad.detach().clone()
    if isinstance(layer, nn.BatchNorm2d):
        out[f"{name}.running_mean"] = layer.running_mean.detach().clone()
        out[f"{name}.running_var"] = layer.running_var.detach().clone()
        layer.eval()
        with torch.no_grad():
            out[f"{name}.y_eval"] = layer(x.detach()).clone()

out = {k: v.contiguous() for k, v in out.items()}
assert all(v.dtype == torch.float64 for v in out.values())
path = sys.argv[1]
os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
save_file(out, path, metadata={"writer": "tests/python/conv_torch.py", "torch": torch.__version__})
print(f"wrote {len(cases)} cases ({len(out)} tensors, torch {torch.__version__}) to {path}")
