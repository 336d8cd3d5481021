"""Shared by the PyTorch peer scripts of bench/ (not a benchmark itself; gpu-check and
bench/run skip files whose name starts with an underscore).

Timing follows Google Benchmark: a calibration run (which is also the warm-up) finds how
many iterations make one repetition last at least --min-time seconds, then --reps
repetitions are timed and the median time per iteration is reported. Variants of one
measurement are timed in alternation, repetition by repetition, so drift on a shared
machine hits them alike. On cuda every timed span starts and ends with
torch.cuda.synchronize().

Each measurement is printed as ONE JSON object on its own stdout line. When the
environment variable LOCUS_BENCH_JSON names a file, the same measurements are also
written there in Google Benchmark's JSON shape ({"benchmarks": [{"name", "real_time",
"time_unit", "bytes_per_second" | "items_per_second", "label"}]}), which is what
bench/gpu-check merges into benchmarks.json.
"""

import argparse
import atexit
import json
import os
import statistics
import sys
import time

_gb_rows = []


def parser(description, timing=True):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads(N) (default 0: PyTorch's own choice)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    if timing:
        p.add_argument("--reps", type=int, default=5, help="timed repetitions (median reported)")
        p.add_argument("--min-time", type=float, default=0.5,
                       help="seconds one repetition lasts at least (as --benchmark_min_time)")
    return p


def setup(args):
    """Imports torch, applies --threads and checks --device; returns (torch, device)."""
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{os.path.basename(sys.argv[0])}: --device cuda, but torch "
                 f"{torch.__version__} sees no CUDA device")
    return torch, torch.device(args.device)


def context(torch, device, args):
    """Keys every record carries."""
    c = {"device": device.type, "threads": torch.get_num_threads(), "torch": torch.__version__}
    if device.type == "cuda":
        c["gpu"] = torch.cuda.get_device_name(device)
    return c


def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run(torch, device, fn, iters):
    _sync(torch, device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(torch, device)
    return time.perf_counter() - t0


def measure(torch, device, variants, reps, min_time):
    """variants: {name: callable}. Returns {name: {"seconds": median per iteration,
    "rep_seconds": [per-iteration time of each repetition], "iterations": per repetition}}."""
    iters = {}
    for name, fn in variants.items():
        fn()  # first call: allocations, lazy initialisation
        n = 1
        while True:
            t = _run(torch, device, fn, n)
            if t >= min_time or n >= 1_000_000_000:
                break
            # Google Benchmark's rule: aim 40% past min_time, grow at most 10x a step.
            n = max(n + 1, min(10 * n, int(n * 1.4 * min_time / max(t, 1e-9))))
        iters[name] = n
    times = {name: [] for name in variants}
    for _ in range(max(1, reps)):
        for name, fn in variants.items():
            times[name].append(_run(torch, device, fn, iters[name]) / iters[name])
    return {name: {"seconds": statistics.median(ts), "rep_seconds": ts, "iterations": iters[name]}
            for name, ts in times.items()}


def emit(record, gb_name=None, bytes_per_iter=None, items_per_iter=None, label=""):
    """Prints one measurement as a JSON line; remembers it for LOCUS_BENCH_JSON."""
    print(json.dumps(record), flush=True)
    if gb_name is None:
        return
    row = {"name": gb_name, "run_name": gb_name, "run_type": "iteration",
           "real_time": record["seconds"] * 1e3, "time_unit": "ms", "label": label}
    if bytes_per_iter:
        row["bytes_per_second"] = bytes_per_iter / record["seconds"]
    if items_per_iter:
        row["items_per_second"] = items_per_iter / record["seconds"]
    _gb_rows.append(row)


@atexit.register
def _write_gb_json():
    path = os.environ.get("LOCUS_BENCH_JSON")
    if path and _gb_rows:
        with open(path, "w") as fh:
            json.dump({"context": {"executable": sys.argv[0]}, "benchmarks": _gb_rows}, fh, indent=1)
