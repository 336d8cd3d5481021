#!/usr/bin/env python3
"""The second main job (examples/gpt.cpp) end to end on a small corpus this test writes
(CTest "main job: the character-level GPT ...").

    gpt_job.py GPT_BINARY WORK_DIR

Checks what a user relies on:
  * evaluation lines with train loss, validation loss and perplexity (= exp(loss)); after
    40 steps the validation loss is below ln(vocabulary), what predicting every character
    as equally likely scores; --log writes the same figures as CSV;
  * resumed (--resume) from the step-20 checkpoint of a 40-step run, the run prints the
    same step-40 line as the run without a stop, and the log continues;
  * the sample holds only characters of the corpus, and the same seed gives the same text;
  * --plot renders the log to a 1200 x 400 PNG with the train and validation loss, the
    validation perplexity and the learning rate each in its panel (decoded with
    main_job.py's zlib reader; skipped, visibly, where scripts/plot-metrics cannot have
    matplotlib); --plot without --log is refused naming --log;
  * a missing corpus, a binary file, heads that do not divide the width and a context of
    zero are refused with a message and a non-zero exit status.
"""
import csv
import math
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import main_job  # noqa: E402 (its PNG reader and plot check)

if len(sys.argv) != 3:
    print("usage: gpt_job.py GPT_BINARY WORK_DIR", file=sys.stderr)
    sys.exit(2)
exe, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
corpus = os.path.join(work, "corpus.txt")
lines = []
for i in range(600):  # a deterministic text of a few kinds of lines
    lines.append(["the quick brown fox jumps over the lazy dog", "pack my box with five dozen liquor jugs",
                  f"line {i} of the corpus: {i * 7 % 101} apples", "how vexingly quick daft zebras jump"][i % 4])
with open(corpus, "w") as f:
    f.write("\n".join(lines) + "\n")
vocabulary = len(set(open(corpus).read()))
small = ["--corpus", corpus, "--context", "16", "--width", "32", "--heads", "2", "--layers", "1", "--batch", "8",
         "--eval-every", "20", "--eval-batches", "2", "--warmup", "5", "--lr", "1e-2"]


def run(*args, ok=True):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    p = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=600)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(f"FAILED: {' '.join(args)} exited {p.returncode}")
    return p


def steps(out):
    return {int(m.group(1)): m.group(0)[: m.group(0).rfind("lr")]  # the line without its time
            for m in re.finditer(r"step +(\d+) +train loss [0-9.]+ +val loss ([0-9.]+) +perplexity ([0-9.]+).*", out)}


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what)


full = run(*small, "--steps", "40", "--log", os.path.join(work, "full.csv"), "--sample", "80", "--seed", "3").stdout
print(full)
lines40 = steps(full)
check(sorted(lines40) == [20, 40], f"evaluation lines at steps 20 and 40, got {sorted(lines40)}")
m = re.search(r"step +40 .*val loss ([0-9.]+) +perplexity ([0-9.]+)", full)
check(m is not None, "a step-40 line")
if m:
    loss, ppl = float(m.group(1)), float(m.group(2))
    check(loss < math.log(vocabulary), f"validation loss {loss} below ln({vocabulary}) = {math.log(vocabulary):.3f}")
    check(abs(ppl - math.exp(loss)) <= 0.002 * ppl + 0.002, f"perplexity {ppl} is exp(loss {loss})")
rows = list(csv.DictReader(open(os.path.join(work, "full.csv"))))
check([int(r["step"]) for r in rows] == [20, 40], "the log has one row per evaluation")
if m and rows:
    check(abs(float(rows[-1]["val_loss"]) - loss) < 1e-3, "the log's validation loss is the printed one")
sample = full[full.find("a sample"):].split("\n", 1)[1] if "a sample" in full else ""
check(len(sample) >= 80 and set(sample) <= set(open(corpus).read()), "the sample has 80 characters of the corpus")
again = run(*small, "--steps", "40", "--sample", "80", "--seed", "3").stdout
check(again[again.find("a sample"):] == full[full.find("a sample"):], "the same seed gives the same sample")

# --plot: the log of a 60-step run (three evaluations) as scripts/plot_metrics.py draws it
plot_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "plot-metrics")
if subprocess.run([plot_script, "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
    png = os.path.join(work, "curves.png")
    run(*small, "--steps", "60", "--log", os.path.join(work, "plotted.csv"), "--plot", png, "--sample", "0")
    check(os.path.exists(png), "--plot writes the PNG")
    if os.path.exists(png):  # main_job.check_plot exits with FAILED on a bad image
        main_job.check_plot(png, "--plot", {"train loss": ((0x1f, 0x77, 0xb4), 0),
                                            "validation loss": ((0x94, 0x67, 0xbd), 0),
                                            "validation perplexity": ((0x8c, 0x56, 0x4b), 1),
                                            "learning rate": ((0xd6, 0x27, 0x28), 2)})
else:
    print("SKIPPED: the --plot checks (scripts/plot-metrics: matplotlib is not available)")
p = run(*small, "--steps", "1", "--plot", os.path.join(work, "nolog.png"), ok=False)
check(p.returncode == 2 and "--plot needs --log" in p.stderr and not os.path.exists(os.path.join(work, "nolog.png")),
      f"--plot without --log is refused: exit {p.returncode}, {p.stderr!r}")

ck = os.path.join(work, "ckpt")
first = run(*small, "--steps", "40", "--checkpoint-dir", ck, "--log", os.path.join(work, "resumed.csv"), "--sample", "0",
            "--seed", "3").stdout
check(steps(first).get(40) == lines40.get(40), "the same seed trains the same run")
check(os.path.exists(os.path.join(ck, "step-20.safetensors")) and os.path.exists(os.path.join(ck, "last.safetensors")),
      "--checkpoint-dir writes step-20, step-40 and last")
rows = list(csv.DictReader(open(os.path.join(work, "resumed.csv"))))
with open(os.path.join(work, "resumed.csv"), "w") as f:  # the log as a run stopped at step 20 left it
    f.write("step,train_loss,val_loss,val_perplexity,lr,seconds\n")
    f.write(",".join(rows[0][k] for k in ["step", "train_loss", "val_loss", "val_perplexity", "lr", "seconds"]) + "\n")
resumed = run(*small, "--steps", "40", "--resume", os.path.join(ck, "step-20.safetensors"), "--log",
              os.path.join(work, "resumed.csv"), "--sample", "0", "--seed", "3").stdout
check("resumed from" in resumed, "the resumed run says so")
check(steps(resumed).get(40) == lines40.get(40),
      f"the resumed step-40 line equals the run without a stop: {steps(resumed).get(40)!r} vs {lines40.get(40)!r}")
check([int(r["step"]) for r in csv.DictReader(open(os.path.join(work, "resumed.csv")))] == [20, 40],
      "the resumed log continues")

binary = os.path.join(work, "binary.dat.bin")
with open(binary, "wb") as f:
    f.write(b"ab\x00cd")
for args, want in [(["--corpus", os.path.join(work, "missing.txt")], "does not exist"),
                   (["--corpus", binary], "not text"),
                   (["--corpus", corpus, "--width", "32", "--heads", "3", "--steps", "1"], "do not divide the width"),
                   (["--corpus", corpus, "--context", "0"], "--context")]:
    p = run(*args, ok=False)
    check(p.returncode != 0 and want in p.stderr + p.stdout, f"{args}: exit {p.returncode}, message {want!r}: {p.stderr!r}")

if failures:
    sys.exit(f"{len(failures)} checks failed")
print("gpt_job: every check passed")
