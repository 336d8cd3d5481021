#!/usr/bin/env python3
"""PyTorch peer of bench_train: an MLP trained on Fashion-MNIST, timed per epoch.

Model Linear(784,256) ReLU Linear(256,128) ReLU Linear(128,10) (--hidden A,B: 784-A-B-10), PyTorch's default init
after torch.manual_seed(--seed); loss CrossEntropyLoss (mean); optimizer
torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01). The 60,000
training images (IDX files, plain or .gz) are read once, scaled to [0, 1] float32 and
preloaded onto the device as one tensor; each epoch shuffles with torch.randperm and
indexes batches from that tensor (no DataLoader), dropping the last partial batch
(468 steps of 128). Before timing, 20 warm-up steps are run and then undone (the model
and optimizer state are restored), so the timed epochs start from the initial weights.
Only the epochs are timed, not the loading; on cuda with torch.cuda.synchronize().
--amp bf16|fp16 wraps the forward pass and loss in torch.autocast (fp16 with
torch.amp.GradScaler).

Prints ONE JSON object:
  {"name": "mlp_train", "device": "cpu", "amp": "none", "batch_size": 128,
   "samples_per_s": ..., "final_loss": ..., ...}
final_loss is the mean training loss over the batches of the last epoch.
"""
import copy
import gzip
import os
import struct
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import _common  # noqa: E402


def read_idx(torch, directory, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as fh:
                data = fh.read()
            break
    else:
        sys.exit(f"mlp_train.py: no {stem}[.gz] in {directory} (Debian package "
                 "dataset-fashion-mnist; on the GPU machine bench/gpu-stage --full-dataset)")
    zero, dtype_code, rank = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        sys.exit(f"mlp_train.py: {path} is not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    body = bytearray(data[4 + 4 * rank:])
    count = 1
    for d in dims:
        count *= d
    if len(body) != count:
        sys.exit(f"mlp_train.py: {path}: {len(body)} bytes of data for shape {dims}")
    return torch.frombuffer(body, dtype=torch.uint8).reshape(dims)


def main():
    p = _common.parser(__doc__.splitlines()[0], timing=False)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (compiled during the warm-up, not timed)")
    p.add_argument("--hidden", default="256,128",
                   help="the two hidden widths, e.g. 512,256 for the main job's model")
    p.add_argument("--data-dir", default=os.environ.get("LOCUS_FASHION_MNIST_DIR",
                                                        "/usr/share/datasets/fashion-mnist"))
    args = p.parse_args()
    torch, dev = _common.setup(args)
    nn = torch.nn

    images = read_idx(torch, args.data_dir, "train-images-idx3-ubyte")
    labels = read_idx(torch, args.data_dir, "train-labels-idx1-ubyte")
    x_all = (images.reshape(images.shape[0], -1).to(torch.float32) / 255.0).to(dev)
    y_all = labels.to(torch.int64).to(dev)
    n = x_all.shape[0]
    bs = args.batch_size
    steps = n // bs  # drop_last

    try:
        h0, h1 = (int(v) for v in args.hidden.split(","))
        assert h0 > 0 and h1 > 0
    except (ValueError, AssertionError):
        sys.exit("mlp_train.py: --hidden takes two positive widths, e.g. 512,256")
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(784, h0), nn.ReLU(), nn.Linear(h0, h1), nn.ReLU(),
                          nn.Linear(h1, 10)).to(dev)
    if args.compile:
        model = torch.compile(model)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    amp_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]

    def new_scaler():
        return torch.amp.GradScaler(dev.type) if args.amp == "fp16" else None

    def step(xb, yb, scaler):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_fn(model(xb), yb)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss.detach()

    gen = torch.Generator(device=dev).manual_seed(args.seed)

    # Warm-up (kernels, allocator, autocast caches), then back to the initial state.
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    scaler = new_scaler()
    warm = torch.randperm(n, device=dev, generator=torch.Generator(device=dev).manual_seed(12345))
    for i in range(min(args.warmup_steps, steps)):
        idx = warm[i * bs:(i + 1) * bs]
        step(x_all[idx], y_all[idx], scaler)
    _common._sync(torch, dev)
    model.load_state_dict(saved_model)
    opt.load_state_dict(saved_opt)
    scaler = new_scaler()

    _common._sync(torch, dev)
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(n, device=dev, generator=gen)
        loss_sum = torch.zeros((), device=dev)
        for i in range(steps):
            idx = perm[i * bs:(i + 1) * bs]
            loss_sum += step(x_all[idx], y_all[idx], scaler).float()
    _common._sync(torch, dev)
    seconds = time.perf_counter() - t0
    samples = steps * bs * args.epochs
    rec = {"name": "mlp_train", **_common.context(torch, dev, args), "amp": args.amp,
           "compiled": bool(args.compile),
           "batch_size": bs, "hidden": f"{h0},{h1}", "epochs": args.epochs, "steps_per_epoch": steps,
           "samples_per_s": samples / seconds, "seconds": seconds,
           "final_loss": loss_sum.item() / steps}
    _common.emit(rec, f"torch mlp_train {args.amp}/{bs}/{dev.type}",
                 label=f"samples/s {rec['samples_per_s']:.0f}, final_loss {rec['final_loss']:.4f}")


if __name__ == "__main__":
    main()
