#!/usr/bin/env python3
"""PyTorch peer of bench_cnn --mode train: the main job's CNN trained on Fashion-MNIST.

Model (make_cnn in examples/fashion_mnist_job.hpp): Conv2d(1,32,3,padding=1) BatchNorm2d(32)
ReLU MaxPool2d(2) Conv2d(32,64,3,padding=1) BatchNorm2d(64) ReLU MaxPool2d(2) Flatten
Linear(3136,128) ReLU Dropout(0.3) Linear(128,10), PyTorch's default init after
torch.manual_seed(--seed); loss CrossEntropyLoss (mean); optimizer
torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4); fp32,
NCHW (PyTorch's CPU convolutions go through oneDNN). The 60,000 training images (IDX,
plain or .gz) are read once, scaled to [0, 1] float32 and preloaded as one
[N, 1, 28, 28] tensor; each epoch shuffles with torch.randperm and indexes batches from
that tensor (no DataLoader), dropping the last partial batch (468 steps of 128).
Before timing, --warmup-steps steps (default 10) are run and undone (model, buffers and
optimizer state restored). --steps N times only the first N steps of the epoch.
--profile prints torch.autograd.profiler's table of --steps steps (to stderr) instead of
timing.

Prints ONE JSON object:
  {"name": "cnn_train", "impl": "pytorch", "device": "cpu", "batch_size": 128,
   "samples_per_s": ..., "final_loss": ..., ...}
final_loss is the mean training loss over the timed batches of the last epoch.
"""
import copy
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import _common  # noqa: E402
from mlp_train import read_idx  # noqa: E402


def make_cnn(nn, rows, cols, classes):
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * (rows // 4) * (cols // 4), 128), nn.ReLU(), nn.Dropout(0.3),
        nn.Linear(128, classes))


def main():
    p = _common.parser(__doc__.splitlines()[0], timing=False)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=0, help="time only N steps of the epoch (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--profile", action="store_true",
                   help="print torch.autograd.profiler's per-op table of --steps steps to stderr")
    p.add_argument("--data-dir", default=os.environ.get("LOCUS_FASHION_MNIST_DIR",
                                                        "/usr/share/datasets/fashion-mnist"))
    args = p.parse_args()
    torch, dev = _common.setup(args)
    nn = torch.nn

    images = read_idx(torch, args.data_dir, "train-images-idx3-ubyte")
    labels = read_idx(torch, args.data_dir, "train-labels-idx1-ubyte")
    n, rows, cols = images.shape
    x_all = (images.reshape(n, 1, rows, cols).to(torch.float32) / 255.0).to(dev).contiguous()
    y_all = labels.to(torch.int64).to(dev)
    bs = args.batch_size
    batches = n // bs  # drop_last
    steps = min(args.steps, batches) if args.steps > 0 else batches

    torch.manual_seed(args.seed)
    model = make_cnn(nn, rows, cols, int(y_all.max().item()) + 1).to(dev)
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=1e-4)

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        return loss.detach()

    gen = torch.Generator(device=dev).manual_seed(args.seed)

    # Warm-up (oneDNN primitives, allocator), then back to the initial state.
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    warm = torch.randperm(n, device=dev, generator=torch.Generator(device=dev).manual_seed(12345))
    for i in range(min(args.warmup_steps, batches)):
        idx = warm[i * bs:(i + 1) * bs]
        step(x_all[idx], y_all[idx])
    _common._sync(torch, dev)
    model.load_state_dict(saved_model)
    opt.load_state_dict(saved_opt)

    if args.profile:
        perm = torch.randperm(n, device=dev, generator=gen)
        with torch.autograd.profiler.profile() as prof:
            for i in range(steps):
                idx = perm[i * bs:(i + 1) * bs]
                step(x_all[idx], y_all[idx])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40), file=sys.stderr)
        return

    _common._sync(torch, dev)
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(n, device=dev, generator=gen)
        loss_sum = torch.zeros((), device=dev)
        for i in range(steps):
            idx = perm[i * bs:(i + 1) * bs]
            loss_sum += step(x_all[idx], y_all[idx])
        final_loss = loss_sum.item() / steps  # the one synchronisation per epoch
    _common._sync(torch, dev)
    seconds = time.perf_counter() - t0
    samples = steps * bs * args.epochs
    rec = {"name": "cnn_train", "impl": "pytorch", **_common.context(torch, dev, args), "amp": "none",
           "batch_size": bs, "epochs": args.epochs, "steps": steps, "steps_per_epoch": batches,
           "samples_per_s": samples / seconds, "seconds": seconds,
           "ms_per_step": 1e3 * seconds / (steps * args.epochs), "final_loss": final_loss,
           "mkldnn": torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled}
    _common.emit(rec, f"torch cnn_train none/{bs}/{dev.type}",
                 label=f"samples/s {rec['samples_per_s']:.0f}, final_loss {rec['final_loss']:.4f}")


if __name__ == "__main__":
    main()
