#!/usr/bin/env python3
"""Reads the files tests/tools/checkpoint_writer wrote with the Python `safetensors`
package (Hugging Face's reader, independent of locus) and checks names, dtypes, shapes,
values and metadata. With PyTorch installed it also loads the checkpoint into an
nn.Sequential of the same shape. Exit 77 (CTest: skipped) when safetensors is missing."""
import sys

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
    assert f.metadata() == {"writer": "locus"}, f.metadata()
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
    assert m["format"] == "locus-checkpoint-1" and m["epoch"] == "2" and m["optimizer"] == "adamw", m
    assert m["optimizer_steps"] == "5", m
    shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["0.weight"] == (32, 16) and shapes["0.bias"] == (32,), shapes
    assert shapes["2.weight"] == (3, 32) and shapes["2.bias"] == (3,), shapes
    assert shapes["optimizer.exp_avg.0.weight"] == (32, 16), shapes
    assert shapes["optimizer.step"] == (1,), shapes
    assert int(f.get_tensor("optimizer.step")[0]) == 5
    w = f.get_tensor("0.weight")
    assert np.isfinite(w).all() and np.abs(w).max() < 1.0

try:
    import torch
    from safetensors.torch import load_file as load_torch
except ImportError:
    print("PyTorch not installed: the nn.Sequential load was not tried")
else:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    state = {k: t for k, t in load_torch(f"{d}/trainer.safetensors").items() if not k.startswith("optimizer.")}
    model.load_state_dict(state)
    print("PyTorch nn.Sequential loaded the checkpoint")
print("safetensors read every file as written")
