#!/usr/bin/env python3
"""PyTorch peer of the main job (examples/fashion_mnist.cpp --model mlp): the same job, epoch by epoch.

What a PyTorch user writes for the main job's MLP: the Fashion-MNIST training and test
images read once (IDX files, plain or .gz), scaled to [0, 1] float32; a
torch.utils.data.DataLoader over a TensorDataset (shuffle=True, the last partial batch
kept, as locus's loader keeps it; num_workers=0: the tensors are in memory); the model
Linear(784,512) ReLU Linear(512,256) ReLU Linear(256,10) with PyTorch's default init
after torch.manual_seed(--seed); CrossEntropyLoss (mean); AdamW(lr=1e-3, weight_decay=1e-4)
with a cosine schedule per optimizer step over all epochs down to lr/100
(CosineAnnealingLR, as the main job's cosine_lr); and after each epoch an evaluation of
the 10,000 test images in batches of 1000 under torch.no_grad(). No warm-up is excluded:
the main job's first epoch has none either.

An epoch's samples/s is the training phase's (60,000 samples over the time from the first
batch to the end of the last optimizer step), as the main job's epoch line reports it; the
evaluation is timed apart. Prints ONE JSON object:
  {"name": "main_job", "epochs": [{"epoch": 1, "samples_per_s": ..., "train_loss": ...,
   "test_accuracy": ..., "eval_seconds": ...}, ...], "samples_per_s": (median of epochs
   2.. when there are several), ...}
"""
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import _common  # noqa: E402
from mlp_train import read_idx  # noqa: E402


def main():
    p = _common.parser(__doc__.splitlines()[0], timing=False)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=os.environ.get("LOCUS_FASHION_MNIST_DIR",
                                                        "/usr/share/datasets/fashion-mnist"))
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1:
        sys.exit("main_job.py: --epochs and --batch-size must be positive")
    torch, dev = _common.setup(args)
    nn = torch.nn
    from torch.utils.data import DataLoader, TensorDataset

    def load(stem):
        images = read_idx(torch, args.data_dir, f"{stem}-images-idx3-ubyte")
        labels = read_idx(torch, args.data_dir, f"{stem}-labels-idx1-ubyte")
        x = images.reshape(images.shape[0], -1).to(torch.float32) / 255.0
        return x, labels.to(torch.int64)

    x_train, y_train = load("train")
    x_test, y_test = load("t10k")
    torch.manual_seed(args.seed)
    train_loader = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(TensorDataset(x_test, y_test), batch_size=1000)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10)).to(dev)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(train_loader) * args.epochs,
                                                       eta_min=1e-5)
    epochs = []
    for e in range(args.epochs):
        model.train()
        _common._sync(torch, dev)
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=dev)
        n = 0
        for xb, yb in train_loader:
            xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.detach() * xb.shape[0]
            n += xb.shape[0]
        _common._sync(torch, dev)
        seconds = time.perf_counter() - t0
        model.eval()
        t1 = time.perf_counter()
        correct = 0
        with torch.no_grad():
            for xb, yb in test_loader:
                correct += (model(xb.to(dev)).argmax(1) == yb.to(dev)).sum().item()
        epochs.append({"epoch": e + 1, "samples_per_s": n / seconds, "seconds": seconds,
                       "train_loss": loss_sum.item() / n, "test_accuracy": correct / len(x_test),
                       "eval_seconds": time.perf_counter() - t1})
        print(f"epoch {e + 1}: {n / seconds:,.0f} samples/s, train loss {loss_sum.item() / n:.4f}, "
              f"test accuracy {correct / len(x_test):.4f}", file=sys.stderr)
    steady = [x["samples_per_s"] for x in (epochs[1:] if len(epochs) > 1 else epochs)]
    rec = {"name": "main_job", **_common.context(torch, dev, args), "batch_size": args.batch_size,
           "hidden": "512,256", "epochs": epochs,
           "samples_per_s": sorted(steady)[len(steady) // 2] if len(steady) % 2 else
           sum(sorted(steady)[len(steady) // 2 - 1:len(steady) // 2 + 1]) / 2}
    _common.emit(rec)


if __name__ == "__main__":
    main()
