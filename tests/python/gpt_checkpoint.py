#!/usr/bin/env python3
"""A checkpoint of the second main job (examples/gpt.cpp) loads into the same model
written in PyTorch (bench/pytorch/gpt_text.py) and gives the job's validation loss
(CTest "interop: a checkpoint of the GPT job loads into PyTorch ...").

    gpt_checkpoint.py GPT_BINARY GPT_TEXT_PY WORK_DIR

gpt trains 30 steps on a small corpus this script writes (4 heads, 2 blocks) and logs
its validation loss; gpt_text.py --evaluate loads last.safetensors by PyTorch's names,
strictly, and computes the loss over the same windows in float64 with PyTorch's own
layers (LayerNorm, scaled_dot_product_attention, GELU, the tied projection). The two
must agree to the log's six digits. Needs torch and safetensors in this Python: exit 77
(CTest: skipped) without them."""
import csv
import os
import subprocess
import sys

try:
    import safetensors  # noqa: F401
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: this Python lacks PyTorch or safetensors ({e})")
    sys.exit(77)

if len(sys.argv) != 4:
    print("usage: gpt_checkpoint.py GPT_BINARY GPT_TEXT_PY WORK_DIR", file=sys.stderr)
    sys.exit(2)
exe, gpt_text, work = sys.argv[1:]
os.makedirs(work, exist_ok=True)
corpus = os.path.join(work, "corpus.txt")
with open(corpus, "w") as f:  # a deterministic text with some structure to learn
    for i in range(500):
        f.write(["a stitch in time saves nine", f"{i * 13 % 97} bottles of {['tea', 'ink', 'oil'][i % 3]}",
                 "every good boy deserves fudge", "THE END? not quite."][i % 4] + "\n")
config = ["--corpus", corpus, "--context", "16", "--width", "32", "--heads", "4", "--layers", "2", "--batch", "4",
          "--eval-batches", "3"]
ck, log = os.path.join(work, "ckpt"), os.path.join(work, "log.csv")
env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
p = subprocess.run([exe, *config, "--steps", "30", "--eval-every", "30", "--warmup", "5", "--lr", "1e-2", "--sample", "0",
                    "--checkpoint-dir", ck, "--log", log], capture_output=True, text=True, env=env, timeout=600)
print(p.stdout, p.stderr)
if p.returncode != 0:
    sys.exit(f"FAILED: gpt exited {p.returncode}")
locus_loss = float(list(csv.DictReader(open(log)))[-1]["val_loss"])
q = subprocess.run([sys.executable, gpt_text, *config, "--evaluate", os.path.join(ck, "last.safetensors")],
                   capture_output=True, text=True, timeout=600)
print(q.stdout, q.stderr)
if q.returncode != 0:
    sys.exit(f"FAILED: gpt_text.py --evaluate exited {q.returncode}")
torch_loss = float(q.stdout.rsplit("val loss", 1)[1])
print(f"validation loss after 30 steps: locus {locus_loss}, PyTorch on locus's checkpoint {torch_loss:.10f}")
if not abs(locus_loss - torch_loss) <= 2e-5 * max(1.0, abs(torch_loss)):
    sys.exit("FAILED: PyTorch's validation loss for the locus checkpoint differs from locus's")
print("gpt_checkpoint: the locus checkpoint gives PyTorch the job's validation loss")
