#!/usr/bin/env python3
"""The main job as 2 MPI ranks (CTest "main job: ... 2 ranks ..." test).

    main_job_dist.py FASHION_MNIST_BINARY WORK_DIR MPIRUN [MPIRUN_ARG ...]

On a 1200/300-sample slice of Fashion-MNIST (main_job.py's), checks what a user of
`scripts/run-main --ranks 2` relies on:
  * the job prints one set of epoch lines (rank 0's), says it is data-parallel, trains
    (the loss falls, accuracy well above chance) and writes --log and the checkpoints
    once;
  * the same 2-rank run twice gives the same figures (a 1-rank run with twice the batch
    is not compared here: each rank's shard is a contiguous block of the epoch's order,
    so a step's samples differ and the runs differ as two seeds do, 0.53-0.65 accuracy
    after 3 epochs on this slice; tests/dist/test_dist.cpp checks 2 x B against 1 x 2B
    on the same samples to 1e-5);
  * resuming the 2-rank run from its epoch-2 checkpoint prints the same epoch 3 as the
    run without a stop (to the printed digits);
  * an error on the ranks (a missing --data directory) ends the job with exit status 1
    and the message, not a hang.
Skipped (77) without the dataset.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import main_job  # noqa: E402  (its slice writer and line parser)

fail = main_job.fail


def mpi(mpirun, binary, *args, expect=0):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    p = subprocess.run([*mpirun, "-x", "OMP_NUM_THREADS", "-x", "OMP_WAIT_POLICY", binary, *args],
                       capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != expect:
        fail(f"mpirun {' '.join(args)}: exit status {p.returncode}, expected {expect}\n"
             f"--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    return p.stdout, p.stderr


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    binary, work, mpirun = sys.argv[1], sys.argv[2], sys.argv[3:]
    src = os.environ.get("LOCUS_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    if not os.path.exists(os.path.join(src, "t10k-labels-idx1-ubyte.gz")) and \
            not os.path.exists(os.path.join(src, "t10k-labels-idx1-ubyte")):
        print(f"SKIPPED: no Fashion-MNIST in {src}")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    data = os.path.join(work, "data")
    os.makedirs(data)
    main_job.write_slice(src, data, "train", 1200)
    main_job.write_slice(src, data, "t10k", 300)
    common = ["--data", data, "--device", "cpu", "--hidden", "32,16", "--seed", "5", "--lr", "0.005"]

    log = os.path.join(work, "two.csv")
    ck = os.path.join(work, "ck")
    out, _ = mpi(mpirun, binary, *common, "--batch-size", "50", "--epochs", "3", "--log", log, "--checkpoint-dir", ck)
    if "data-parallel: 2 ranks, batch 50 per rank (100 in all)" not in out:
        fail("no data-parallel line in:\n" + out)
    two = main_job.epochs_of(out)
    if [r["epoch"] for r in two] != [1, 2, 3]:
        fail("expected one set of epoch lines 1, 2, 3 (rank 0's) in:\n" + out)
    if float(two[2]["train_loss"]) >= float(two[0]["train_loss"]) or float(two[2]["test_accuracy"]) < 0.5:
        fail(f"2 ranks did not train: {two}")
    with open(log) as f:
        rows = f.read().splitlines()
    if len(rows) != 4:
        fail(f"--log should hold a header and 3 rows (rank 0 writes it), got {rows}")
    for name in ("epoch-1.safetensors", "epoch-2.safetensors", "epoch-3.safetensors", "last.safetensors"):
        if not os.path.exists(os.path.join(ck, name)):
            fail(f"no checkpoint {name} in {ck}")

    # The same 2-rank run again: the same figures to the printed digits (the ranks' shards,
    # the averaged gradients and the combined metrics are deterministic).
    out2, _ = mpi(mpirun, binary, *common, "--batch-size", "50", "--epochs", "3")
    rerun = main_job.epochs_of(out2)
    for a, b in zip(two, rerun):
        for k in ("train_loss", "test_loss", "test_accuracy"):
            if a[k] != b[k]:
                fail(f"a second identical 2-rank run differs at epoch {a['epoch']} {k}: {a[k]} against {b[k]}")

    # Resume on 2 ranks from rank 0's epoch-2 checkpoint: epoch 3 as without a stop.
    out, _ = mpi(mpirun, binary, *common, "--batch-size", "50", "--epochs", "3",
                 "--resume", os.path.join(ck, "epoch-2.safetensors"))
    again = main_job.epochs_of(out)
    if [r["epoch"] for r in again] != [3]:
        fail("the resumed run should train epoch 3 only:\n" + out)
    for k in ("train_loss", "test_loss", "test_accuracy"):
        if again[0][k] != two[2][k]:
            fail(f"resumed epoch 3 {k} {again[0][k]} differs from the run without a stop ({two[2][k]})")

    # An error on the ranks ends the job with its message and status 1.
    _, err = mpi(mpirun, binary, "--data", os.path.join(work, "missing"), "--device", "cpu", "--epochs", "1", expect=1)
    if "fashion_mnist:" not in err or "missing" not in err:
        fail("the failing job's stderr lacks the rank's message:\n" + err)
    print("main job on 2 ranks: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
