#!/usr/bin/env python3
"""Trains the main job's two models in PyTorch on Fashion-MNIST and writes them for
tests/test_torch_weights.cpp, which loads them into locus with nn::load and must get
PyTorch's test accuracy (the CTest "interop: a model trained in PyTorch loads into locus
with nn::load and gives PyTorch's test accuracy and logits").

    torch_to_locus.py OUTDIR [DATA_DIR]

The models are examples/fashion_mnist_job.hpp's, as torch nn.Sequential (so state_dict names
are locus's): the MLP 784-512-256-10 with relu, and the CNN (--model cnn): conv 3x3 1->32
(padding 1), batch norm, relu, max pool 2, conv 3x3 32->64, batch norm, relu, max pool 2,
flatten, linear 3136->128, relu, dropout 0.3, linear 128->10. AdamW (lr 1e-3, weight
decay 1e-4), batch 128; the MLP sees the 60000 training images twice, the CNN the first
200 batches (LOCUS_TORCH_CNN_STEPS) of one shuffled epoch: about a minute on 2 cores. Pixels are x / 255 in f32, as
locus's idx_dataset makes them.

OUTDIR/mlp.safetensors, cnn.safetensors   safetensors.torch.save_file(model.state_dict())
OUTDIR/reference.safetensors              per model M (f32 eval mode, torch.no_grad()):
    M.logits [10000, 10] f32   PyTorch's logits for every test image
    M.pred   [10000] i64       their argmax (the first maximum, as locus's)
    M.logits64 [K, 10] f64     the same model in f64 (weights and inputs widened exactly)
                               on the first K test images
    M.bound  [K, 10] f64       for those logits, a bound on |f32 result - exact| that any
                               f32 implementation meets, whatever its summation order (see
                               error_bound): locus and PyTorch may differ by twice it
OUTDIR/results.json   per model: correct predictions and accuracy on the 10000 test
                      images, training steps, samples and seconds; torch's version, the
                      data directory

Exit 77 (CTest: skipped) without torch, safetensors or the dataset."""
import copy
import gzip
import json
import os
import struct
import sys
import time

# On a shared machine spinning OpenMP workers fight other processes for the cores
# (docs/tour.md, "Threads"); set before torch loads its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
try:
    import numpy as np
    import torch
    from safetensors.torch import save_file
except ImportError as e:
    print(f"SKIPPED: this Python lacks PyTorch or safetensors ({e}); bench/run installs torch in "
          "~/.cache/locus-bench-venv")
    sys.exit(77)

if len(sys.argv) not in (2, 3):
    print("usage: torch_to_locus.py OUTDIR [DATA_DIR]", file=sys.stderr)
    sys.exit(2)
out = sys.argv[1]
data_dir = sys.argv[2] if len(sys.argv) == 3 else os.environ.get("LOCUS_FASHION_MNIST_DIR",
                                                                 "/usr/share/datasets/fashion-mnist")
CNN_STEPS = int(os.environ.get("LOCUS_TORCH_CNN_STEPS", "200"))
K = 1000  # test images with an f64 reference and an error bound
nn = torch.nn


def read_idx(stem):
    """An IDX file, plain or gzip-compressed, as a numpy array."""
    for path, opener in ((stem, open), (stem + ".gz", gzip.open)):
        if os.path.exists(path):
            with opener(path, "rb") as f:
                raw = f.read()
            break
    else:
        print(f"SKIPPED: no {stem}[.gz] (set LOCUS_FASHION_MNIST_DIR or pass DATA_DIR)")
        sys.exit(77)
    zero, kind, rank = struct.unpack(">HBB", raw[:4])
    assert zero == 0 and kind == 0x08, f"{stem}: not an IDX file of unsigned bytes"
    dims = struct.unpack(">" + "I" * rank, raw[4:4 + 4 * rank])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load(prefix):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"))
    x = images.astype(np.float32) / np.float32(255.0)  # correctly rounded, as locus's x / 255
    return torch.from_numpy(x.reshape(len(x), 1, 28, 28).copy()), torch.from_numpy(labels.astype(np.int64))


torch.manual_seed(20240613)
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
os.makedirs(out, exist_ok=True)
x_train, y_train = load("train")
x_test, y_test = load("t10k")


def mlp():
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 10))


def train(model, images, epochs, max_steps):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    model.train()
    steps = samples = 0
    t0 = time.time()
    for _ in range(epochs):
        order = torch.randperm(len(x_train))
        for b in range(0, len(order), 128):
            if steps == max_steps:
                break
            idx = order[b:b + 128]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(images(idx)), y_train[idx])
            loss.backward()
            opt.step()
            steps += 1
            samples += len(idx)
    return steps, samples, time.time() - t0


def error_bound(model, x):
    """Per logit: a bound on |f32 result - exact result| for any f32 implementation of
    the model in eval mode, whatever order it sums in, on inputs x that are exact in f32.
    A sum of n products and a bias computed in f32 in any order (or with FMAs) is within
    gamma(n + 1) * sum(|terms|) of the exact one (gamma(k) = k u / (1 - k u), u = 2^-24;
    Higham, Accuracy and Stability of Numerical Algorithms, 3.1); an error e of the inputs
    adds |W| e. relu and max pooling do not grow an error (1-Lipschitz); eval batch norm
    y = (x - mean) * s + beta, s = gamma / sqrt(var + eps), adds |s| e and, for the few
    roundings of any f32 evaluation (s, the products and sums; also of locus's, which
    runs in f64 and rounds once), 8 u (|x| |s| + |mean| |s| + |beta|). Returns the f64
    logits and the bound; everything here runs in f64."""
    u = 2.0**-24
    gamma = lambda k: k * u / (1 - k * u)  # noqa: E731
    h = x.double()
    e = torch.zeros_like(h)
    for layer in model:
        if isinstance(layer, nn.Linear):
            w, b = layer.weight.double(), layer.bias.double()
            a = (h.abs() + e) @ w.abs().T + b.abs()
            e = e @ w.abs().T + gamma(layer.in_features + 1) * a
            h = h @ w.T + b
        elif isinstance(layer, nn.Conv2d):
            w, b = layer.weight.double(), layer.bias.double()
            conv = lambda t, ww, bb=None: nn.functional.conv2d(t, ww, bb, layer.stride, layer.padding)  # noqa: E731
            n = w.shape[1] * w.shape[2] * w.shape[3]
            a = conv(h.abs() + e, w.abs(), b.abs())
            e = conv(e, w.abs()) + gamma(n + 1) * a
            h = conv(h, w, b)
        elif isinstance(layer, nn.BatchNorm2d):
            view = lambda t: t.double().view(1, -1, 1, 1)  # noqa: E731
            s = view(layer.weight) / torch.sqrt(view(layer.running_var) + layer.eps)
            mean, beta = view(layer.running_mean), view(layer.bias)
            e = s.abs() * e + 8 * u * ((h.abs() + e) * s.abs() + mean.abs() * s.abs() + beta.abs())
            h = (h - mean) * s + beta
        elif isinstance(layer, nn.ReLU):
            h = torch.relu(h)
        elif isinstance(layer, nn.MaxPool2d):
            e = nn.functional.max_pool2d(e, layer.kernel_size, layer.stride, layer.padding)
            h = nn.functional.max_pool2d(h, layer.kernel_size, layer.stride, layer.padding)
        elif isinstance(layer, nn.Flatten):
            h, e = layer(h), layer(e)
        elif isinstance(layer, nn.Dropout):
            pass  # eval: the identity
        else:
            raise TypeError(f"error_bound: no rule for {layer}")
    return h, e


results = {"torch": torch.__version__, "threads": torch.get_num_threads(), "data_dir": os.path.abspath(data_dir),
           "test_samples": len(y_test)}
reference = {}
for name, make, images, epochs, max_steps in (("mlp", mlp, lambda i: x_train[i].reshape(len(i), 784), 2, None),
                                              ("cnn", cnn, lambda i: x_train[i], 1, CNN_STEPS)):
    model = make()
    steps, samples, train_s = train(model, images, epochs, max_steps)
    model.eval()
    flat = (lambda t: t.reshape(len(t), 784)) if name == "mlp" else (lambda t: t)
    t0 = time.time()
    with torch.no_grad():
        logits = torch.cat([model(flat(x_test[b:b + 1000])) for b in range(0, len(x_test), 1000)])
    eval_s = time.time() - t0
    assert logits.dtype == torch.float32
    pred = logits.argmax(dim=1)  # the first maximum
    correct = int((pred == y_test).sum())
    with torch.no_grad():
        logits64, bound = error_bound(model, flat(x_test[:K]))
        exact_ref = copy.deepcopy(model).double()(flat(x_test[:K]).double())
    # the f64 reference is what the bound is about: the propagation's h and the f64
    # model agree (to f64 rounding), and PyTorch's own f32 logits are within the bound
    assert torch.allclose(logits64, exact_ref, rtol=1e-12, atol=1e-12)
    torch_err = ((logits[:K].double() - logits64).abs() / bound).max().item()
    assert torch_err <= 1.0, f"{name}: PyTorch's f32 logits exceed the f32 error bound ({torch_err} of it)"
    save_file(model.state_dict(), os.path.join(out, f"{name}.safetensors"))
    reference[f"{name}.logits"] = logits.contiguous()
    reference[f"{name}.pred"] = pred.contiguous()
    reference[f"{name}.logits64"] = logits64.contiguous()
    reference[f"{name}.bound"] = bound.contiguous()
    results[name] = {"weights": f"{name}.safetensors", "correct": correct, "accuracy": correct / len(y_test),
                     "train_steps": steps, "train_samples": samples, "train_seconds": round(train_s, 2),
                     "eval_seconds": round(eval_s, 2), "bound_images": K,
                     "torch_f32_vs_f64_max_abs": (logits[:K].double() - logits64).abs().max().item(),
                     "torch_f32_vs_f64_max_of_bound": torch_err, "bound_max": bound.max().item(),
                     "bound_median": bound.median().item()}
    print(f"{name}: {steps} steps ({samples} samples) in {train_s:.1f} s; test accuracy {correct / len(y_test):.4f} "
          f"({correct} of {len(y_test)}); |f32 - f64| logits up to {results[name]['torch_f32_vs_f64_max_abs']:.3g} "
          f"({torch_err:.3g} of the bound, which is up to {bound.max().item():.3g})", flush=True)
save_file(reference, os.path.join(out, "reference.safetensors"))
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
print(f"wrote {out}/mlp.safetensors, cnn.safetensors, reference.safetensors and results.json (torch {torch.__version__})")
