#!/usr/bin/env python3
"""Reads the files tests/tools/checkpoint_writer wrote with the Python `safetensors`
package (Hugging Face's reader, independent of locus) and checks names, dtypes, shapes,
values and metadata.

    read_safetensors.py DIR            the safetensors package reads every file
    read_safetensors.py --torch DIR    PyTorch loads the trainer checkpoint into an
                                       nn.Sequential of the same shape and computes with it

Exit 77 (CTest: skipped) when the package the mode needs is missing."""
import sys

if sys.argv[1] == "--torch":
    try:
        import numpy as np
        import torch
        from safetensors.torch import load_file as load_torch
    except ImportError as e:
        print(f"SKIPPED: this Python lacks PyTorch or safetensors ({e}); bench/run installs torch in "
              "~/.cache/locus-bench-venv")
        sys.exit(77)
    d = sys.argv[2]
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    state = {k: t for k, t in load_torch(f"{d}/trainer.safetensors").items() if not k.startswith("optimizer.")}
    model.load_state_dict(state)  # strict: every name and shape must match
    # The loaded weights are the file's, and the model computes with them.
    w0 = state["0.weight"].numpy()
    assert np.array_equal(model[0].weight.detach().numpy(), w0)
    x = torch.ones(2, 16)
    ref = np.maximum(np.ones((2, 16), np.float64) @ w0.astype(np.float64).T + state["0.bias"].numpy(), 0)
    ref = ref @ state["2.weight"].numpy().astype(np.float64).T + state["2.bias"].numpy()
    got = model(x).detach().numpy()
    assert np.allclose(got, ref, rtol=1e-5, atol=1e-5), (got, ref)
    print("PyTorch nn.Sequential loaded the checkpoint and computes with its weights")
    # The CNN: conv, batch norm (weights and running statistics), relu, pooling, flatten,
    # linear; strict load_state_dict, then eval-mode output equal to locus's infer().
    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3))
    cstate = {k: t for k, t in load_torch(f"{d}/cnn.safetensors").items() if not k.startswith("optimizer.")}
    assert cstate["1.num_batches_tracked"].shape == torch.Size([]) and int(cstate["1.num_batches_tracked"]) == 4, \
        cstate["1.num_batches_tracked"]
    assert not torch.equal(cstate["1.running_var"], torch.ones(4)), "running statistics were not trained"
    cnn.load_state_dict(cstate)  # strict: parameters and buffers, names and shapes
    cnn.eval()
    io = load_torch(f"{d}/cnn_io.safetensors")
    with torch.no_grad():
        got = cnn(io["x"])
    assert torch.allclose(got, io["y"], rtol=1e-5, atol=1e-5), (got, io["y"])
    print("PyTorch nn.Sequential loaded the CNN checkpoint (batch norm's running statistics included) and "
          "computes locus's inference output")
    sys.exit(0)

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file
except ImportError as e:
    print(f"SKIPPED: the Python safetensors package is not installed ({e}); "
          "scripts/install-deps puts it in ~/.cache/locus-test-venv")
    sys.exit(77)

d = sys.argv[1]

with safe_open(f"{d}/values.safetensors", framework="numpy") as f:
    meta = f.metadata()
    assert {k: v for k, v in meta.items()
            if not k.startswith("locus.crc32c.") and k != "locus.header_crc32c"} == {"writer": "locus"}, meta
    assert sorted(f.keys()) == ["values.bf16", "values.f16", "values.f32", "values.i64"], list(f.keys())
    a = f.get_tensor("values.f32")
    assert a.dtype == np.float32 and a.shape == (3, 4), (a.dtype, a.shape)
    assert (a.reshape(-1) == np.arange(12, dtype=np.float32)).all(), a
    h = f.get_tensor("values.f16")
    assert h.dtype == np.float16 and (h == np.float16(0.5)).all(), h
    i = f.get_tensor("values.i64")
    assert i.dtype == np.int64 and list(i) == [7, -9], i
    assert f.get_slice("values.bf16").get_dtype() == "BF16"
    assert f.get_slice("values.bf16").get_shape() == [2]

with safe_open(f"{d}/trainer.safetensors", framework="numpy") as f:
    m = f.metadata()
    assert m["format"] == "locus-checkpoint-2" and m["epoch"] == "2" and m["optimizer"] == "adamw", m
    assert m["optimizer_steps"] == "5", m
    shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["0.weight"] == (32, 16) and shapes["0.bias"] == (32,), shapes
    assert shapes["2.weight"] == (3, 32) and shapes["2.bias"] == (3,), shapes
    assert shapes["optimizer.exp_avg.0.weight"] == (32, 16), shapes
    assert shapes["optimizer.step"] == (1,), shapes
    assert int(f.get_tensor("optimizer.step")[0]) == 5
    w = f.get_tensor("0.weight")
    assert np.isfinite(w).all() and np.abs(w).max() < 1.0

# Every tensor's CRC32C in the metadata, checked with an independent implementation
# (the crc32c package from PyPI) over the bytes this script reads from the file itself.
def check_checksums(path):
    import json
    import struct
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    sums = {k[len("locus.crc32c."):]: v for k, v in meta.items() if k.startswith("locus.crc32c.")}
    assert set(sums) == set(header), (sorted(sums), sorted(header))
    try:
        import crc32c
    except ImportError:
        print("note: no crc32c package; checksums present but not recomputed")
        return 0
    for name, info in header.items():
        b, e = info["data_offsets"]
        got = "%08x" % crc32c.crc32c(data[b:e])
        assert got == sums[name], (path, name, got, sums[name])
    # The header's CRC32C, as locus documents it: the other metadata sorted by key, then
    # the tensors sorted by name as name, dtype and shape, each field ended by a NUL.
    text = b""
    for k in sorted(meta):
        if k.startswith("locus.crc32c.") or k == "locus.header_crc32c":
            continue
        text += k.encode() + b"\0" + meta[k].encode() + b"\0"
    text += b"\1"
    for name in sorted(header):
        info = header[name]
        text += name.encode() + b"\0" + info["dtype"].encode() + b"\0"
        text += b"".join(str(e).encode() + b"," for e in info["shape"]) + b"\0"
    got = "%08x" % crc32c.crc32c(text)
    assert got == meta["locus.header_crc32c"], (path, "header", got, meta["locus.header_crc32c"])
    return len(header) + 1

checked = check_checksums(f"{d}/values.safetensors") + check_checksums(f"{d}/trainer.safetensors")
print(f"safetensors read every file as written ({checked} CRC32C checksums recomputed in Python)")
