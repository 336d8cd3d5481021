#!/usr/bin/env python3
"""The main job's ResNet (examples/resnet.hpp) written in PyTorch, both ways: PyTorch's
numbers for tests/test_resnet_torch.cpp to compare against, and a locus-trained
checkpoint read back into PyTorch (the CTest "interop: the ResNet module against PyTorch
(f64 forward and backward, a locus checkpoint in PyTorch)").

    resnet_torch.py write DIR    PyTorch's side, in float64, with a fixed seed:
        DIR/weights.safetensors     the model's state_dict before the step (batch norm's
                                    affine parameters and running statistics randomised)
        DIR/reference.safetensors   x [N, 1, H, W], y [N] (i64), logits (training mode),
                                    loss (mean cross-entropy), grad.NAME for every
                                    parameter, after.NAME for every batch-norm buffer
                                    after that training forward, logits_eval (eval mode,
                                    after it)
    resnet_torch.py check DIR    reads DIR/locus_trained.safetensors (nn::save of a
                                    float32 locus ResNet the C++ case trained) into the same
                                    PyTorch model, strict, and compares its eval-mode
                                    logits on DIR/locus_io.safetensors's x with locus's
                                    logits there; exit 1 on a difference

The model (classes 10, width 4, blocks 2, 1, 1; 10 x 10 images) must stay the C++
case's. Exit 77 (CTest: skipped) without torch or safetensors."""
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"SKIPPED: this Python lacks PyTorch or safetensors ({e}); bench/run installs torch in "
          "~/.cache/locus-bench-venv")
    sys.exit(77)

nn = torch.nn
CLASSES, WIDTH, BLOCKS, N, H, W = 10, 4, (2, 1, 1), 6, 10, 10


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    def __init__(self, classes, width, blocks):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        cin = width
        for s in range(3):
            cout = width << s
            stage = []
            for b in range(blocks[s]):
                stage.append(BasicBlock(cin, cout, 2 if b == 0 and s > 0 else 1))
                cin = cout
            setattr(self, f"layer{s + 1}", nn.Sequential(*stage))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.layer3(self.layer2(self.layer1(y)))
        return self.fc(torch.flatten(self.avgpool(y), 1))


def write(d):
    torch.manual_seed(20261204)
    torch.set_default_dtype(torch.float64)
    m = ResNet(CLASSES, WIDTH, BLOCKS)
    with torch.no_grad():  # batch norm away from its identity start, so that a mix-up shows
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.weight.copy_(1 + 0.2 * torch.randn_like(mod.weight))
                mod.bias.copy_(0.2 * torch.randn_like(mod.bias))
                mod.running_mean.copy_(0.3 * torch.randn_like(mod.running_mean))
                mod.running_var.copy_(0.5 + torch.rand_like(mod.running_var))
                mod.num_batches_tracked.fill_(3)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, os.path.join(d, "weights.safetensors"))
    x = torch.randn(N, 1, H, W)
    y = torch.randint(0, CLASSES, (N,))
    m.train()
    logits = m(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    out = {"x": x, "y": y, "logits": logits.detach(), "loss": loss.detach().reshape(())}
    for k, p in m.named_parameters():
        out["grad." + k] = p.grad
    for k, b in m.named_buffers():
        out["after." + k] = b.clone()
    m.eval()
    with torch.no_grad():
        out["logits_eval"] = m(x)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(d, "reference.safetensors"))
    print(f"wrote {d}/weights.safetensors and reference.safetensors (torch {torch.__version__})")


def check(d):
    m = ResNet(CLASSES, WIDTH, BLOCKS).float()
    state = load_file(os.path.join(d, "locus_trained.safetensors"))
    m.load_state_dict(state, strict=True)  # every name and shape, buffers included
    io = load_file(os.path.join(d, "locus_io.safetensors"))
    m.eval()
    with torch.no_grad():
        logits = m(io["x"])
    diff = (logits - io["logits"]).abs()
    bound = 1e-4 + 1e-4 * io["logits"].abs()
    worst = (diff / bound).max().item()
    print(f"locus-trained ResNet in PyTorch: {logits.shape[0]} images, largest |PyTorch - locus| "
          f"{diff.max().item():.3g} ({worst:.3g} of the tolerance 1e-4 + 1e-4 |logit|); "
          f"argmax agrees on {int((logits.argmax(1) == io['logits'].argmax(1)).sum())} of {logits.shape[0]}")
    if worst > 1 or not torch.equal(logits.argmax(1), io["logits"].argmax(1)):
        print("FAILED: PyTorch's logits for the locus checkpoint differ from locus's")
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print("usage: resnet_torch.py write|check DIR", file=sys.stderr)
        sys.exit(2)
    os.makedirs(sys.argv[2], exist_ok=True)
    sys.exit(write(sys.argv[2]) if sys.argv[1] == "write" else check(sys.argv[2]))
