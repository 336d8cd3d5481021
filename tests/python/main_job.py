#!/usr/bin/env python3
"""The main job's command line, end to end (CTest "main job: ..." test).

    main_job.py FASHION_MNIST_BINARY WORK_DIR

Writes a small IDX directory (the first 1200 training and 300 test samples of
Fashion-MNIST, uncompressed, so --data with plain IDX files is exercised too), then runs
the trainer on the CPU and checks what a user relies on:
  * every epoch prints a line with train loss, test loss, test accuracy, samples/s and
    peak memory; --log writes the same figures as CSV, and the learning rate of each
    epoch's last step (checked against the cosine schedule's formula);
  * --plot renders the log to a PNG (and scripts/plot-metrics alone does too): decoded
    here with zlib, it is 1200 x 400, not blank, and each series (train and test loss,
    test accuracy, learning rate) has pixels of its colour in its panel only; a log
    without rows is refused; --plot without --log is refused naming --plot;
  * 3 epochs with --checkpoint-dir; resuming from the epoch-2 checkpoint prints the
    same epoch 3 (to the printed digits) as the run without a stop, and the CSV continues;
  * --resume (last.safetensors) with --epochs already reached evaluates and trains nothing;
  * a last.safetensors with one exponent bit flipped is refused naming the tensor and the
    newest good checkpoint (epoch-3), and --resume newest-good resumes from that one;
  * --accumulate 2 and --precision bf16 train (finite loss, accuracy above chance);
    --clip-grad-norm 0.05 and --clip-grad-value 0.001 train too, differently from the
    unclipped run; a negative bound, or both clippings at once, is refused naming the option;
  * --batch-size auto with --memory-limit picks a batch below the cap, and a limit too
    small for anything fails with a message and exit status 1; on the whole dataset under
    64 MiB the chosen batch leaves room for evaluation (the epoch and its evaluation finish);
  * --model cnn trains (accuracy above chance), resumes from its epoch-1 checkpoint to
    the same epoch 2 as the run without a stop (augmentation and dropout included), and a
    resume with --model mlp is refused naming --model; --batch-size auto works for it;
  * a bad option (malformed, out of range, unknown) exits with status 2, names the option
    and prints nothing on stdout; --help exits 0 with the options on stdout.
The dataset comes from LOCUS_FASHION_MNIST_DIR or /usr/share/datasets/fashion-mnist
(the Debian package dataset-fashion-mnist); without it the test is skipped (exit 77).
"""
import csv
import gzip
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

EPOCH_LINE = re.compile(
    r"^epoch\s+(\d+)\s+train loss ([0-9.]+)\s+test loss ([0-9.]+)\s+test accuracy ([0-9.]+)\s+"
    r"([0-9.]+) samples/s\s+peak (.+)$")


def fail(msg):
    print("FAILED: " + msg)
    sys.exit(1)


def read_png(path):
    """(width, height, rows of RGB tuples) of an 8-bit, non-interlaced RGB or RGBA PNG,
    decoded here with zlib alone (independent of the matplotlib that wrote it)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path} is not a PNG file")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            header = (int.from_bytes(body[0:4], "big"), int.from_bytes(body[4:8], "big"), body[8], body[9], body[12])
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    w, h, depth, colour, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace != 0:
        fail(f"{path}: a PNG of depth {depth}, colour type {colour}, interlace {interlace} (8, 2 or 6, 0 expected)")
    bpp = 4 if colour == 6 else 3
    raw, stride = zlib.decompress(idat), w * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        ft, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if ft == 1:
                line[x] = (line[x] + a) & 255
            elif ft == 2:
                line[x] = (line[x] + b) & 255
            elif ft == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return w, h, rows


# scripts/plot_metrics.py's colours: series -> (RGB, panel 0..2 of three side by side)
PLOT_SERIES = {"train loss": ((0x1f, 0x77, 0xb4), 0), "test loss": ((0xff, 0x7f, 0x0e), 0),
               "test accuracy": ((0x2c, 0xa0, 0x2c), 1), "learning rate": ((0xd6, 0x27, 0x28), 2)}


def check_plot(path, what, series=None):
    """The PNG is 1200 x 400, not blank, and every series' curve (PLOT_SERIES unless
    `series` is given) is drawn in its panel."""
    w, h, rows = read_png(path)
    if (w, h) != (1200, 400):
        fail(f"{what}: {path} is {w} x {h}, 1200 x 400 expected")
    inked = sum(1 for row in rows for px in row if px != (255, 255, 255))
    if inked < 0.02 * w * h:
        fail(f"{what}: {path} is nearly blank ({inked} of {w * h} pixels not white)")
    for name, (rgb, panel) in (series or PLOT_SERIES).items():
        xs = [x for row in rows for x, px in enumerate(row) if px == rgb]
        inside = [x for x in xs if panel * w // 3 <= x < (panel + 1) * w // 3]
        if len(inside) < 100:
            fail(f"{what}: no {name} curve in panel {panel + 1} of {path} ({len(inside)} pixels of its colour)")
        if len(inside) != len(xs):
            fail(f"{what}: {name}'s colour outside its panel in {path}")


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return data[:4], dims, data[4 + 4 * ndim:]


def write_slice(src_dir, dst_dir, prefix, n):
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        stem = f"{prefix}-{kind}"
        src = os.path.join(src_dir, stem + ".gz")
        if not os.path.exists(src):
            src = os.path.join(src_dir, stem)
        magic, dims, body = read_idx(src)
        per = 1
        for d in dims[1:]:
            per *= d
        out = magic + b"".join(d.to_bytes(4, "big") for d in [n] + dims[1:]) + body[:n * per]
        with open(os.path.join(dst_dir, stem), "wb") as f:
            f.write(out)


def run(binary, *args, expect=0):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    p = subprocess.run([binary, *args], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != expect:
        fail(f"{' '.join(args)}: exit status {p.returncode}, expected {expect}\n"
             f"--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    return p.stdout, p.stderr


def epochs_of(out):
    rows = []
    for line in out.splitlines():
        m = EPOCH_LINE.match(line.strip())
        if m:
            rows.append({"epoch": int(m[1]), "train_loss": m[2], "test_loss": m[3],
                         "test_accuracy": m[4], "samples_per_s": float(m[5])})
    return rows


def final_accuracy(out):
    m = re.search(r"^final test accuracy ([0-9.]+)$", out, re.M)
    if not m:
        fail("no 'final test accuracy' line in:\n" + out)
    return m[1]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, work = sys.argv[1], sys.argv[2]
    src = os.environ.get("LOCUS_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    if not os.path.exists(os.path.join(src, "t10k-labels-idx1-ubyte.gz")) and \
            not os.path.exists(os.path.join(src, "t10k-labels-idx1-ubyte")):
        print(f"SKIPPED: no Fashion-MNIST in {src} (scripts/install-deps installs dataset-fashion-mnist)")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    data = os.path.join(work, "data")
    os.makedirs(data)
    write_slice(src, data, "train", 1200)
    write_slice(src, data, "t10k", 300)
    common = ["--data", data, "--device", "cpu", "--hidden", "32,16", "--batch-size", "100", "--seed", "5", "--lr", "0.005"]

    # Three epochs with checkpoints after each.
    a_log = os.path.join(work, "a.csv")
    ck = os.path.join(work, "ck")
    # --plot renders the log at the end (scripts/plot-metrics, matplotlib from the test venv;
    # exit status 77 when matplotlib cannot be had: then the plot checks are skipped, visibly)
    plot_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "plot-metrics")
    plots = subprocess.run([plot_script, "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if plots.returncode not in (0, 77):
        fail(f"scripts/plot-metrics --help: status {plots.returncode}\n{plots.stderr}")
    a_png = os.path.join(work, "a.png")
    plot_args = ["--plot", a_png] if plots.returncode == 0 else []
    if not plot_args:
        print("SKIPPED: the --plot checks (scripts/plot-metrics: matplotlib is not available)")
    out, _ = run(binary, *common, "--epochs", "3", "--log", a_log, "--checkpoint-dir", ck, *plot_args)
    a = epochs_of(out)
    if [r["epoch"] for r in a] != [1, 2, 3]:
        fail("expected epoch lines 1, 2, 3 in:\n" + out)
    for r in a:
        if not (math.isfinite(float(r["train_loss"])) and r["samples_per_s"] > 0):
            fail(f"bad epoch line {r}")
    if float(a[2]["train_loss"]) >= float(a[0]["train_loss"]):
        fail(f"training loss did not fall over 3 epochs: {a}")
    if float(a[2]["test_accuracy"]) < 0.5:
        fail(f"test accuracy {a[2]['test_accuracy']} after 3 epochs (chance is 0.1)")
    if final_accuracy(out) != a[2]["test_accuracy"]:
        fail("final accuracy differs from the last epoch line")
    with open(a_log) as f:
        a_csv = list(csv.DictReader(f))
    if [row["epoch"] for row in a_csv] != ["1", "2", "3"]:
        fail(f"--log rows {a_csv}")
    for row, line in zip(a_csv, a):
        if abs(float(row["test_accuracy"]) - float(line["test_accuracy"])) > 5e-5 or \
                abs(float(row["train_loss"]) - float(line["train_loss"])) > 5e-5:
            fail(f"CSV row {row} does not match the printed line {line}")
    # the lr column: the cosine schedule's value at each epoch's last optimizer step
    # (12 steps an epoch, 36 in all, from 0.005 to 0.005 * 0.01)
    for row in a_csv:
        step = int(row["epoch"]) * 12 - 1
        want = 5e-5 + (0.005 - 5e-5) * 0.5 * (1 + math.cos(math.pi * step / 36))
        if abs(float(row["lr"]) - want) > 1e-5 * want:
            fail(f"CSV row {row}: lr {row['lr']}, the schedule gives {want}")
    if plot_args:
        check_plot(a_png, "--plot")
        b_png = os.path.join(work, "standalone.png")
        r = subprocess.run([plot_script, a_log, b_png], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"scripts/plot-metrics {a_log} {b_png}: status {r.returncode}\n{r.stdout}{r.stderr}")
        check_plot(b_png, "scripts/plot-metrics")
        empty = os.path.join(work, "empty.csv")
        with open(empty, "w") as f:
            f.write("epoch,train_loss\n")
        r = subprocess.run([plot_script, empty, os.path.join(work, "empty.png")], capture_output=True, text=True)
        if r.returncode != 2 or "no rows" not in r.stderr:
            fail(f"scripts/plot-metrics on a log without rows: status {r.returncode}\n{r.stderr}")
    for name in ("epoch-1.safetensors", "epoch-2.safetensors", "epoch-3.safetensors", "last.safetensors"):
        if not os.path.exists(os.path.join(ck, name)):
            fail(f"--checkpoint-dir did not write {name}: {os.listdir(ck)}")
    leftovers = [n for n in os.listdir(ck) if not n.endswith(".safetensors")]
    if leftovers:
        fail(f"temporary files left in the checkpoint directory: {leftovers}")

    # As if that run had stopped after epoch 2: resume from epoch-2's checkpoint with the
    # same options. Epoch 3 must print the same figures, and the CSV must continue.
    b_log = os.path.join(work, "b.csv")
    with open(a_log) as f:
        head = f.read().splitlines()[:3]
    with open(b_log, "w") as f:
        f.write("\n".join(head) + "\n")
    out, _ = run(binary, *common, "--epochs", "3", "--resume", os.path.join(ck, "epoch-2.safetensors"),
                 "--log", b_log)
    if not re.search(r"^resumed from .*epoch-2\.safetensors after epoch 2$", out, re.M):
        fail("no 'resumed from ... after epoch 2' line in:\n" + out)
    c = epochs_of(out)
    if [r["epoch"] for r in c] != [3]:
        fail(f"the resumed run printed epochs {[r['epoch'] for r in c]}, expected [3]")
    if (a[2]["train_loss"], a[2]["test_loss"], a[2]["test_accuracy"]) != \
            (c[0]["train_loss"], c[0]["test_loss"], c[0]["test_accuracy"]):
        fail(f"resumed epoch 3 differs from the run without a stop: {a[2]} vs {c[0]}")
    with open(b_log) as f:
        if [row["epoch"] for row in csv.DictReader(f)] != ["1", "2", "3"]:
            fail("--log after --resume does not continue the CSV")
    # Resuming with options that differ from the first run's is refused, naming them.
    _, err = run(binary, *common, "--epochs", "4", "--resume", os.path.join(ck, "epoch-2.safetensors"), expect=2)
    if "--epochs 3 (this run: 4)" not in err:
        fail("--resume with another --epochs should be refused naming both values:\n" + err)
    # Resuming from epoch 2 with the whole 3-epoch CSV: epoch 3's row is replaced, not repeated.
    d_log = os.path.join(work, "d.csv")
    shutil.copyfile(a_log, d_log)
    run(binary, *common, "--epochs", "3", "--resume", os.path.join(ck, "epoch-2.safetensors"), "--log", d_log)
    with open(d_log) as f:
        if [row["epoch"] for row in csv.DictReader(f)] != ["1", "2", "3"]:
            fail("--log after resuming from an earlier epoch repeats rows:\n" + open(d_log).read())

    # --resume without a file takes last.safetensors (after epoch 3): nothing to train,
    # the evaluation of the saved model gives the accuracy the run printed.
    out, _ = run(binary, *common, "--epochs", "3", "--checkpoint-dir", ck, "--resume")
    if "nothing to train" not in out or epochs_of(out):
        fail("resume with --epochs reached should train nothing:\n" + out)
    if final_accuracy(out) != a[2]["test_accuracy"]:
        fail(f"last.safetensors evaluates to {final_accuracy(out)}, the run said {a[2]['test_accuracy']}")

    # A corrupt last checkpoint (one exponent bit of a weight flipped, as a disk error
    # would): --resume refuses it naming the tensor and the newest good checkpoint, and
    # --resume newest-good resumes from that one (epoch-3, a copy of the same state).
    last = os.path.join(ck, "last.safetensors")
    with open(last, "rb") as f:
        good_last = f.read()
    (hlen,) = struct.unpack("<Q", good_last[:8])
    header = json.loads(good_last[8:8 + hlen])
    begin = header["0.weight"]["data_offsets"][0]
    at = 8 + hlen + begin + 3  # the high byte of the first f32: sign and exponent bits
    with open(last, "wb") as f:
        f.write(good_last[:at] + bytes([good_last[at] ^ 0x40]) + good_last[at + 1:])
    _, err = run(binary, *common, "--epochs", "3", "--checkpoint-dir", ck, "--resume", expect=1)
    if "tensor '0.weight' does not match its CRC32C checksum" not in err:
        fail("--resume of a corrupt last.safetensors should name the tensor:\n" + err)
    if not re.search(r"the newest good checkpoint is .*epoch-3\.safetensors: resume from it with --resume", err):
        fail("--resume of a corrupt last.safetensors should name epoch-3.safetensors:\n" + err)
    out, _ = run(binary, *common, "--epochs", "3", "--checkpoint-dir", ck, "--resume", "newest-good")
    if not re.search(r"^--resume newest-good: .*epoch-3\.safetensors$", out, re.M) or "nothing to train" not in out:
        fail("--resume newest-good should take epoch-3.safetensors:\n" + out)
    if final_accuracy(out) != a[2]["test_accuracy"]:
        fail(f"epoch-3.safetensors evaluates to {final_accuracy(out)}, the run said {a[2]['test_accuracy']}")
    with open(last, "wb") as f:
        f.write(good_last)

    # Accumulation and bf16.
    out, _ = run(binary, *common, "--epochs", "3", "--accumulate", "2", "--precision", "bf16")
    r = epochs_of(out)
    if len(r) != 3 or not math.isfinite(float(r[-1]["train_loss"])) or float(r[-1]["test_accuracy"]) < 0.3:
        fail("--accumulate 2 --precision bf16:\n" + out)
    if "bf16 on cpu, batch 100 x 2" not in out:
        fail("the model line does not show bf16 and accumulation 2:\n" + out)

    # Gradient clipping: trains, and not as the unclipped run does.
    out, _ = run(binary, *common, "--epochs", "3", "--clip-grad-norm", "0.05")
    r = epochs_of(out)
    if len(r) != 3 or not math.isfinite(float(r[-1]["train_loss"])) or float(r[-1]["test_accuracy"]) < 0.3:
        fail("--clip-grad-norm 0.05:\n" + out)
    if r[0]["train_loss"] == a[0]["train_loss"]:
        fail(f"--clip-grad-norm 0.05 trained exactly as without clipping: {r[0]} vs {a[0]}")
    out, _ = run(binary, *common, "--epochs", "3", "--clip-grad-value", "0.001")
    r = epochs_of(out)
    if len(r) != 3 or not math.isfinite(float(r[-1]["train_loss"])) or float(r[-1]["test_accuracy"]) < 0.3:
        fail("--clip-grad-value 0.001:\n" + out)
    if r[0]["train_loss"] == a[0]["train_loss"]:
        fail(f"--clip-grad-value 0.001 trained exactly as without clipping: {r[0]} vs {a[0]}")

    # --batch-size auto under a memory limit, and a limit that fits nothing.
    args = [x for x in common if x not in ("--batch-size", "100")]
    out, _ = run(binary, *args, "--epochs", "1", "--batch-size", "auto", "--memory-limit", "12M")
    m = re.search(r"^batch size auto: (\d+) ", out, re.M)
    if not m or not (1 <= int(m[1]) < 1200):
        fail("--batch-size auto under a 12 MiB limit:\n" + out)
    _, err = run(binary, *args, "--epochs", "1", "--batch-size", "auto", "--memory-limit", "64K", expect=1)
    if "fashion_mnist:" not in err:
        fail("a memory limit that fits nothing should fail with a message:\n" + err)

    # On the whole dataset under 64 MiB (the datasets themselves hold 55 MiB): the batch
    # auto picks must also leave room for evaluation, which runs while training's buffers
    # are held, so the epoch and its evaluation finish.
    out, _ = run(binary, "--data", src, "--device", "cpu", "--epochs", "1", "--batch-size", "auto",
                 "--memory-limit", "64M")
    if len(epochs_of(out)) != 1:
        fail("--batch-size auto --memory-limit 64M on the whole dataset did not finish its epoch:\n" + out)

    # The CNN: trains, resumes bit-identically (to the printed digits), refuses another --model.
    cnn = ["--data", data, "--device", "cpu", "--model", "cnn", "--batch-size", "100", "--seed", "3", "--lr", "0.003"]
    ck_cnn = os.path.join(work, "ck-cnn")
    out, _ = run(binary, *cnn, "--epochs", "2", "--checkpoint-dir", ck_cnn)
    c = epochs_of(out)
    if len(c) != 2 or "model: CNN" not in out:
        fail("--model cnn --epochs 2 should print a CNN model line and two epoch lines:\n" + out)
    if not (float(c[1]["test_accuracy"]) > 0.3 and math.isfinite(float(c[1]["train_loss"]))):
        fail(f"--model cnn did not train: {c}")
    out, _ = run(binary, *cnn, "--epochs", "2", "--resume", os.path.join(ck_cnn, "epoch-1.safetensors"))
    c2 = epochs_of(out)
    same = ("epoch", "train_loss", "test_loss", "test_accuracy")
    if len(c2) != 1 or any(c2[0][k] != c[1][k] for k in same):
        fail(f"--model cnn resumed from epoch 1 should print the same epoch 2: {c2} vs {c[1]}")
    _, err = run(binary, *[x if x != "cnn" else "mlp" for x in cnn], "--epochs", "2", "--resume",
                 os.path.join(ck_cnn, "epoch-1.safetensors"), expect=2)
    if "--model cnn (this run: mlp)" not in err:
        fail("--resume of a CNN checkpoint with --model mlp should be refused naming --model:\n" + err)
    out, _ = run(binary, *[x for x in cnn if x not in ("--batch-size", "100")], "--epochs", "1", "--batch-size",
                 "auto", "--memory-limit", "40M")
    m = re.search(r"^batch size auto: (\d+) ", out, re.M)
    if not m or len(epochs_of(out)) != 1:
        fail("--model cnn --batch-size auto under a 40 MiB limit:\n" + out)

    # A bad option: usage and status 2, the option named, before anything else is printed.
    _, err = run(binary, "--epochs", "0", expect=2)
    if "usage:" not in err:
        fail("no usage text for a bad option:\n" + err)
    for bad, option in ((["--epochs", "2x"], "--epochs"), (["--lr", "-1"], "--lr"), (["--lr", "abc"], "--lr"),
                        (["--seed", "-3"], "--seed"), (["--batch-size", "0"], "--batch-size"),
                        (["--hidden", "512"], "--hidden"), (["--memory-limit", "0"], "--memory-limit"),
                        (["--accumulate", "1.5"], "--accumulate"), (["--device", "gpu"], "--device"),
                        (["--clip-grad-norm", "-1"], "--clip-grad-norm"), (["--model", "rnn"], "--model"),
                        (["--clip-grad-value", "-1"], "--clip-grad-value"),
                        (["--plot", "x.png"], "--plot"), (["--log", "", "--plot", "x.png"], "--plot"),
                        (["--clip-grad-value", "1", "--clip-grad-norm", "1"], "--clip-grad-norm"),
                        (["--clip-grad-value", "1e-45"], "--clip-grad-value"),
                        (["--augment", "maybe"], "--augment")):
        out, err = run(binary, *bad, expect=2)
        if option not in err or out:
            fail(f"{' '.join(bad)}: expected an error naming {option} and nothing on stdout:\n"
                 f"--- stdout\n{out}\n--- stderr\n{err}")
    # --help succeeds, on stdout
    out, err = run(binary, "--help", expect=0)
    if "--batch-size" not in out or err:
        fail("--help should list the options on stdout:\n" + out + err)
    print("main job: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
