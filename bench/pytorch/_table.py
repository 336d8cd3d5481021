#!/usr/bin/env python3
"""The tables of bench/run (cpu) and bench/gpu-check (gpu): reads the raw results that
those scripts leave in one folder and prints a Markdown table of figures and ratios.
Standard library only (it runs with the system python3, not the PyTorch venv).

  _table.py cpu --dir DIR [--write bench/RESULTS.md] [metadata options]
  _table.py gpu --dir DIR

cpu: DIR holds, per round R, Google Benchmark JSON r{R}.kernels.json and
r{R}.matmul.json, the peer scripts' JSON lines r{R}.elementwise.jsonl, r{R}.reduce.jsonl,
r{R}.matmul_pt.jsonl, r{R}.train_pt.jsonl, bench_train's r{R}.train_locus.jsonl, and
r{R}.NAME.failed / NAME.skip notes. A ratio is the median over rounds of peer time /
locus time measured in that round (above 1: locus faster); figures are medians of all
repetitions of all rounds.

gpu: DIR holds peer.NAME.jsonl (PyTorch with --device cuda) and locus.train_PREC.jsonl
(bench_train --device cuda); prints PyTorch's figures and locus / PyTorch where locus
has the same measurement.
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import time

BEGIN, END = "<!-- bench/run begin -->", "<!-- bench/run end -->"
UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def median(xs):
    return statistics.median(xs) if xs else None


def read_text(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def load_gb(path):
    """{run_name: {"t": [seconds per iteration, one per repetition], "err": msg, "counters": {...}}}"""
    out = {}
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return out
    for b in data.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        name = b.get("run_name", b.get("name", "?"))
        if name.endswith("/real_time"):
            name = name[:-len("/real_time")]
        e = out.setdefault(name, {"t": [], "err": "", "counters": {}})
        if b.get("error_occurred"):
            e["err"] = b.get("error_message", "error")
            continue
        e["t"].append(b["real_time"] * UNIT.get(b.get("time_unit", "ns"), 1e-9))
        for k in ("abs_error", "FLOP/s"):
            if k in b:
                e["counters"].setdefault(k, []).append(b[k])
        if b.get("label"):
            e["label"] = b["label"]
    return out


def load_jsonl(path):
    recs = []
    try:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return recs


class Side:
    """One side of a comparison: per round, the cost (seconds per unit of work) and the
    samples; smaller is better."""

    def __init__(self, label):
        self.label = label
        self.round = {}    # round -> cost of that round (median of its repetitions)
        self.samples = []  # every repetition's cost
        self.extra = {}    # e.g. abs_error, final_loss
        self.why = ""      # why there is nothing

    def add(self, r, samples):
        if samples:
            self.round[r] = median(samples)
            self.samples.extend(samples)

    @property
    def cost(self):
        return median(self.samples)


# ---- cpu --------------------------------------------------------------------------------------
def fmt_ms(s):
    ms = s * 1e3
    return f"{ms:.3g} ms" if ms < 1000 else f"{ms:,.0f} ms"


def load_counter(path, name, counter):
    """A user counter of one Google Benchmark run (first repetition), or None."""
    try:
        with open(path) as fh:
            for b in json.load(fh).get("benchmarks", []):
                n = b.get("run_name", b.get("name", ""))
                if n.endswith("/real_time"):
                    n = n[:-len("/real_time")]
                if n == name and counter in b:
                    return b[counter]
    except (OSError, ValueError):
        pass
    return None


def cpu_rows(d, rounds, torch_ver, batch_sizes=(128,)):
    def failed(name):
        notes = [f"round {r}: {read_text(os.path.join(d, f'r{r}.{name}.failed'))}"
                 for r in rounds if os.path.exists(os.path.join(d, f"r{r}.{name}.failed"))]
        return "; ".join(notes)

    pt_skip = read_text(os.path.join(d, "pytorch.skip"))
    gb = {k: {r: load_gb(os.path.join(d, f"r{r}.{k}.json")) for r in rounds}
          for k in ("kernels", "matmul", "gemm_libs")}
    jl = {k: {r: load_jsonl(os.path.join(d, f"r{r}.{k}.jsonl")) for r in rounds}
          for k in ("elementwise", "reduce", "matmul_pt")}
    for k in ("train_pt", "train_locus"):  # one file per batch size and model a round
        jl[k] = {r: [x for f in sorted(glob.glob(os.path.join(d, f"r{r}.{k}_*.jsonl"))) for x in load_jsonl(f)]
                 for r in rounds}

    def gb_side(kind, name, label):
        s = Side(label)
        for r in rounds:
            e = gb[kind][r].get(name)
            if e:
                s.add(r, e["t"])
                for k, v in e["counters"].items():
                    s.extra.setdefault(k, []).extend(v)
                if e["err"]:
                    s.why = e["err"]
        if not s.samples and not s.why:
            s.why = failed(kind) or f"no result for {name}"
        return s

    def pt_side(kind, match, label):
        """The fastest PyTorch variant among the records that match."""
        by_variant = {}
        for r in rounds:
            for rec in jl[kind][r]:
                if all(rec.get(k) == v for k, v in match.items()):
                    by_variant.setdefault(rec.get("variant", ""), []).append((r, rec))
        if not by_variant:
            s = Side(label)
            s.why = pt_skip or failed(kind) or "no result"
            return s
        best = None
        for variant, recs in by_variant.items():
            s = Side(f"{label} ({variant})" if variant else label)
            for r, rec in recs:
                s.add(r, rec.get("rep_seconds") or [rec["seconds"]])
                if "abs_error" in rec:
                    s.extra.setdefault("abs_error", []).append(rec["abs_error"])
            if best is None or s.cost < best.cost:
                best = s
        return best

    def train_side(kind, label, why_missing, batch, hidden):
        s = Side(label)
        for r in rounds:
            recs = [x for x in jl[kind][r] if "samples_per_s" in x and x.get("batch_size") == batch
                    and x.get("hidden", "256,128") == hidden]
            if recs:
                s.add(r, [1.0 / recs[-1]["samples_per_s"]])
                s.extra.setdefault("final_loss", []).append(recs[-1].get("final_loss"))
        if not s.samples:
            s.why = why_missing or failed(kind) or "no result"
        return s

    tv = f"PyTorch {torch_ver}" if torch_ver else "PyTorch"
    rows = []
    n26 = 1 << 26

    def err_txt(s):
        e = s.extra.get("abs_error")
        return f", abs. error {median(e):.2g}" if e else ""

    # Fused elementwise
    loc = gb_side("kernels", "BM_fused_relu_axpb_locus", "locus")
    rows.append(("fused `relu(a*x+b)`, 2^26 f32", "locus / hand-written OpenMP simd loop", loc,
                 gb_side("kernels", "BM_fused_relu_axpb_omp_loop", "OpenMP loop"), fmt_ms, 0.9))
    rows.append(("fused `relu(a*x+b)`, 2^26 f32", "locus / PyTorch", loc,
                 pt_side("elementwise", {"n": n26}, tv), fmt_ms, None))
    # Reduction
    loc = gb_side("kernels", "BM_sum_locus", "locus")
    rows.append(("`sum`, 2^26 f32", "locus / hand-written OpenMP simd reduction", loc,
                 gb_side("kernels", "BM_sum_omp_simd_loop", "OpenMP reduction"), fmt_ms, 0.9))
    rows.append(("`sum`, 2^26 f32", "locus / PyTorch", loc,
                 pt_side("reduce", {"n": n26}, tv), fmt_ms, None))
    # Matmul
    for n in (512, 1024, 2048):
        def f_mm(s, n=n):
            return f"{fmt_ms(s)}, {2.0 * n ** 3 / s / 1e9:.1f} GFLOP/s"
        loc = gb_side("matmul", f"BM_locus_matmul_into/{n}", "locus `matmul_into`")
        rows.append((f"f32 GEMM {n}³", "locus / direct `cblas_sgemm`", loc,
                     gb_side("matmul", f"BM_cblas_sgemm/{n}", "cblas_sgemm"), f_mm, 0.95))
        rows.append((f"f32 GEMM {n}³", "locus / PyTorch", loc,
                     pt_side("matmul_pt", {"n": n, "dtype": "float32"}, tv), f_mm, None))
    # Training, and the floor of its step: the step's GEMMs alone (same BLAS, same
    # shapes) plus AdamW's 28 bytes a parameter at the triad's bandwidth, per round.
    skip = read_text(os.path.join(d, "train_locus.skip"))
    f_tr = lambda s: f"{1.0 / s:,.0f} samples/s"  # noqa: E731
    bw = {}
    for r in rounds:
        e = gb["matmul"][r].get("BM_stream_triad")
        if e and e["t"]:
            bw[r] = 12.0 * (1 << 24) / median(e["t"])  # bytes/s
    for b in batch_sizes:
        for model, hidden in ((0, "256,128"), (1, "512,256")):
            name = f"784-{hidden.replace(',', '-')}-10"
            loc = train_side("train_locus", "locus `bench_train`", skip, b, hidden)
            pt = train_side("train_pt", tv, pt_skip, b, hidden)
            rows.append((f"MLP training epoch {name}, batch {b}, AdamW", "locus / PyTorch", loc, pt, f_tr,
                         1.2 if b >= 512 else 1.5))
            floor = Side("floor")
            params = None
            fastest = {}  # library -> rounds in which it was the fastest
            for r in rounds:
                e = gb["matmul"][r].get(f"BM_mlp_step_gemms/batch:{b}/model:{model}")
                if not e or not e["t"] or r not in bw:
                    continue
                if params is None:
                    params = (load_counter(os.path.join(d, f"r{r}.matmul.json"),
                                           f"BM_mlp_step_gemms/batch:{b}/model:{model}", "params"))
                if not params:
                    continue
                # The fastest library on these GEMMs in this round: OpenBLAS through
                # BM_mlp_step_gemms, and OpenBLAS, BLIS and oneDNN through bench_gemm_libs.
                libs = [("OpenBLAS", median(e["t"]))]
                for lib_name, bm in (("OpenBLAS", "BM_openblas"), ("BLIS", "BM_blis"), ("oneDNN", "BM_onednn")):
                    o = gb["gemm_libs"][r].get(f"{bm}/batch:{b}/model:{model}")
                    if o and o["t"] and not o["err"]:
                        libs.append((lib_name, median(o["t"])))
                lib_name, gemm_s = min(libs, key=lambda x: x[1])
                fastest[lib_name] = fastest.get(lib_name, 0) + 1
                opt_s = 28.0 * params / bw[r]
                floor.add(r, [(gemm_s + opt_s) / b])  # seconds per sample
                floor.extra.setdefault("gemm_s", []).append(gemm_s)
                floor.extra.setdefault("opt_s", []).append(opt_s)
            if not floor.samples:
                floor.why = failed("matmul") or "BM_mlp_step_gemms / BM_stream_triad not measured"
            floor.label = "floor (fastest GEMMs + AdamW bytes)"
            if fastest:
                won = ", ".join(f"{k} in {v}/{sum(fastest.values())} rounds"
                                for k, v in sorted(fastest.items(), key=lambda x: -x[1]))
                floor.label = f"floor (fastest GEMMs: {won}; + AdamW bytes)"
            if floor.samples:
                g, o = median(floor.extra["gemm_s"]), median(floor.extra["opt_s"])
                floor.label += f" {g * 1e3:.3g} + {o * 1e3:.2g} ms a step"
            pt_frac = ""
            if pt.samples and floor.samples:
                pt_frac = f" (PyTorch: {pt.cost / floor.cost:.2f}× the floor)"
            rows.append((f"MLP step floor {name}, batch {b}", "floor / locus (1 = at the floor)" + pt_frac,
                         loc, floor, f_tr, round(1 / 1.3, 2)))
            # The same step GEMMs through other libraries (a ratio above 1: faster than OpenBLAS).
            ob = gb_side("gemm_libs", f"BM_openblas/batch:{b}/model:{model}", "OpenBLAS")
            for lib_name, bm in (("BLIS", "BM_blis"), ("oneDNN", "BM_onednn")):
                other = gb_side("gemm_libs", f"{bm}/batch:{b}/model:{model}", lib_name)
                rows.append((f"step GEMMs {name}, batch {b}", f"OpenBLAS / {lib_name} (above 1: {lib_name} slower)",
                             ob, other, fmt_ms, None))
    # The main job as users build and run it (scripts/run-main's build), epoch by epoch.
    main_skip = read_text(os.path.join(d, "main_job.skip"))
    main_epochs = {r: load_epoch_lines(os.path.join(d, f"r{r}.main_job.txt")) for r in rounds}
    pt_epochs = {}
    for r in rounds:
        recs = [x for x in load_jsonl(os.path.join(d, f"r{r}.main_job_pt.jsonl")) if x.get("epochs")]
        if recs:
            pt_epochs[r] = [(e["epoch"], e["samples_per_s"], e.get("train_loss")) for e in recs[-1]["epochs"]]

    def epochs_side(label, per_round, why, which):
        s = Side(label)
        for r in rounds:
            eps = per_round.get(r) or []
            if not eps:
                continue
            steady = [1.0 / sps for _, sps, _ in (eps[1:] if len(eps) > 1 else eps)]
            every = [1.0 / sps for _, sps, _ in eps]
            if which == "steady":
                s.add(r, steady)
            elif which == "median":
                s.add(r, [median(every)])
            else:  # the slowest epoch of the round
                s.add(r, [max(every)])
            s.extra.setdefault("final_loss", []).append(eps[-1][2])
        if not s.samples:
            s.why = why or failed("main_job" if "PyTorch" not in label else "main_job_pt") or "no result"
        return s

    mj = "main job 784-512-256-10 as scripts/run-main builds it, batch 128, cpu (median of epochs 2 on)"
    loc = epochs_side("locus `fashion_mnist`", main_epochs, main_skip, "steady")
    rows.append((mj, "main job / `bench_train` (same model and batch)", loc,
                 train_side("train_locus", "locus `bench_train`", skip, 128, "512,256"), f_tr, 0.85))
    rows.append((mj, "main job / the same job in PyTorch (`main_job.py`)", loc,
                 epochs_side(f"{tv} `main_job.py`", pt_epochs, pt_skip, "steady"), f_tr, 1.5))
    rows.append(("main job, every epoch (the first included)", "slowest epoch / median epoch, speed",
                 epochs_side("slowest epoch", main_epochs, main_skip, "slowest"),
                 epochs_side("median epoch", main_epochs, main_skip, "median"), f_tr, 0.9))
    return rows, err_txt


def load_epoch_lines(path):
    """The main job's epoch lines: [(epoch, samples/s, train loss)]."""
    out = []
    for line in read_text(path).splitlines():
        m = re.match(r"epoch\s+(\d+)\s+train loss\s+(\S+).*?([0-9.]+) samples/s", line)
        if m:
            out.append((int(m.group(1)), float(m.group(3)), float(m.group(2))))
    return out


def ratio(loc, peer):
    rs = [peer.round[r] / loc.round[r] for r in sorted(loc.round) if r in peer.round and loc.round[r] > 0]
    return median(rs), rs


def cpu_table(rows, err_txt):
    lines = ["| work | comparison | locus | peer | ratio (median) | each round (min–max) | target | met? |",
             "|---|---|---:|---:|---:|---|---|---|"]
    missed, notrun = [], []
    for work, comp, loc, peer, fmt, target in rows:
        def cell(s):
            if not s.samples:
                return f"not run: {s.why}"
            txt = fmt(s.cost)
            if "final_loss" in s.extra and s.extra["final_loss"] and s.extra["final_loss"][-1] is not None:
                txt += f", final loss {median([x for x in s.extra['final_loss'] if x is not None]):.3f}"
            return txt + err_txt(s)
        rt, rs = ratio(loc, peer)
        rounds_txt = (", ".join(f"{x:.2f}" for x in rs) + f" ({min(rs):.2f}–{max(rs):.2f})") if rs else "—"
        tgt = f"≥ {target}" if target else "— (measured)"
        if rt is None:
            r_txt, met = "—", ("not run" if target else "—")
            if target:
                notrun.append(f"{work}: {comp}")
        else:
            r_txt = f"{rt:.2f}"
            if target is None:
                met = "—"
            elif rt >= target:
                met = "yes"
            else:
                met = "**NO**"
                missed.append(f"{work}: {comp} = {rt:.2f}, target ≥ {target}")
        peer_cell = cell(peer)
        if peer.samples:
            peer_cell = f"{peer.label}: {peer_cell}"
        lines.append(f"| {work} | {comp} | {cell(loc)} | {peer_cell} | {r_txt} | {rounds_txt} | {tgt} | {met} |")
    tail = []
    if missed:
        tail.append("**Targets missed in this run:** " + "; ".join(missed) + ".")
    if notrun:
        tail.append("Not measured in this run (no ratio): " + "; ".join(notrun) + ".")
    if not missed and not notrun:
        tail.append("Every target was met in this run.")
    return "\n".join(lines), "\n\n".join(tail)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _above(x, limit):
    try:
        return float(x) > float(limit)
    except ValueError:
        return False


def cpu_main(a):
    rounds = list(range(1, a.rounds + 1))
    torch_ver = read_text(os.path.join(a.dir, "torch_version"))
    batch_sizes = [int(x) for x in a.batch_sizes.split(",") if x.strip()]
    rows, err_txt = cpu_rows(a.dir, rounds, torch_ver, batch_sizes)
    table, verdict = cpu_table(rows, err_txt)
    load_end = " ".join(read_text("/proc/loadavg").split()[:3]) or "?"
    blas = ""
    for r in rounds:
        try:
            with open(os.path.join(a.dir, f"r{r}.matmul.json")) as fh:
                blas = json.load(fh).get("context", {}).get("locus_host_gemm", "")
            break
        except (OSError, ValueError):
            continue
    commit = git("rev-parse", "--short", "HEAD") or "?"
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    commands = read_text(os.path.join(a.dir, "commands.txt")).splitlines()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = [
        f"## CPU side by side: locus against hand-written loops, BLAS and PyTorch (bench/run) — {when}",
        "",
        f"- Machine: {cpu_model()}, {os.cpu_count()} CPUs; load average at the start {a.load_start}, "
        f"at the end {load_end}",
        f"- Threads: {a.threads} on both sides (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS "
        f"for both, torch.set_num_threads for PyTorch), OMP_WAIT_POLICY={a.wait_policy} for both; locus host "
        f"GEMM: {blas or '?'}",
        f"- Other processes used {a.foreign_load} cores on average during the rounds (limit "
        f"{a.max_foreign_load}; above it the table is not recorded without --force-write)"
        + (" — **above the limit: these figures were taken on a busy machine**"
           if _above(a.foreign_load, a.max_foreign_load) else ""),
        f"- PyTorch: {torch_ver or 'not available'} (run on the CPU; virtual environment {a.venv})",
        f"- Commit {commit}{dirty}; command: `{a.command.strip()}`, which ran {a.rounds} rounds of "
        f"{a.reps} repetitions of at least {a.min_time} s, locus and its peer back to back "
        "(alternating which goes first); in round 1:",
    ]
    head += [f"  - `{c}`" for c in commands]
    head += [
        "- Ratio: median over the rounds of peer time / locus time within the round (above 1: "
        "locus is faster), every round's ratio and their spread beside it; figures: medians of all "
        "repetitions. Floor rows: the step's GEMMs alone through the fastest library in that round "
        "(`BM_mlp_step_gemms` through OpenBLAS, and OpenBLAS, BLIS and oneDNN in `bench_gemm_libs`; same shapes) "
        "plus AdamW's 28 bytes a parameter at the triad's bandwidth (`BM_stream_triad`), per round; "
        "the ratio is floor / locus step time (target: within 1.3× of the floor). PyTorch's figure is its faster "
        "variant (named in brackets: `out` = `addcmul(out=)` + `relu_`, `eager` = `relu(a*x+b)`, "
        "`mm_out` = `mm(out=)`, `matmul` = `a @ b`).",
        "- This machine may be shared: absolute times drift; ratios measured in one run are what count.",
        "",
    ]
    section = "\n".join(head) + "\n" + table + "\n\n" + verdict + "\n"
    print()
    print(section)
    if a.write:
        path = a.write
        old = read_text(path) + "\n" if os.path.exists(path) else ""
        block = f"{BEGIN}\n{section}{END}"
        if BEGIN in old and END in old and old.index(BEGIN) < old.index(END):
            # The table it replaces goes to the history beside RESULTS.md.
            replaced = old[old.index(BEGIN) + len(BEGIN):old.index(END)].strip("\n")
            history = os.path.join(os.path.dirname(os.path.abspath(path)), "HISTORY.md")
            with open(history, "a") as fh:
                fh.write("\n" + replaced + "\n")
            new = old[:old.index(BEGIN)] + block + old[old.index(END) + len(END):]
        else:
            new = old.rstrip("\n") + "\n\n" + block + "\n"
        with open(path, "w") as fh:
            fh.write(new if new.endswith("\n") else new + "\n")
        print(f"bench/run: wrote this section to {os.path.relpath(path)} "
              f"(between {BEGIN} and {END})", file=sys.stderr)


# ---- gpu --------------------------------------------------------------------------------------
def gpu_main(a):
    d = a.dir
    order = ["elementwise", "reduce", "matmul", "matmul_bf16", "mlp_train_fp32", "mlp_train_bf16"]
    names = [os.path.basename(f)[5:-6] for f in glob.glob(os.path.join(d, "peer.*.jsonl"))]
    names.sort(key=lambda n: (order.index(n) if n in order else len(order), n))
    recs = {n: load_jsonl(os.path.join(d, f"peer.{n}.jsonl")) for n in names}
    locus_train = {}
    for f in sorted(glob.glob(os.path.join(d, "locus.train_*.jsonl"))):
        rs = [x for x in load_jsonl(f) if "samples_per_s" in x]
        if rs:
            locus_train[os.path.basename(f)[len("locus.train_"):-6]] = rs[-1]
    # locus's side of the same work on cuda: bench_cuda_kernels (Google Benchmark JSON;
    # run names carry /iterations:N/manual_time).
    kern = load_gb(os.path.join(d, "bench_cuda_kernels.json"))

    def kernel_side(prefix, n_expected, torch_seconds):
        """(locus text, ratio text) for the first run whose name starts with prefix."""
        for name, e in kern.items():
            if name.split("/")[0] != prefix:
                continue
            if e["err"]:
                return f"— ({e['err']})", ""
            if not e["t"]:
                return "", ""
            t = statistics.median(e["t"])
            return f"{t * 1e3:.3g} ms", (f"{torch_seconds / t:.2f}" if n_expected else "")
        return "", ""

    rows = []
    for name, rs in recs.items():
        for x in rs:
            n = x.get("name")
            if n == "elementwise":
                l_txt, r_txt = kernel_side("BM_fused_relu_axpb_cuda", x["n"] == 1 << 26, x["seconds"])
                rows.append((f"`relu(a*x+b)` {x['variant']}, {x['n']} f32",
                             f"{x['seconds'] * 1e3:.3g} ms, {x['gbytes_per_s']:.3g} GB/s", l_txt, r_txt))
            elif n == "reduce":
                l_txt, r_txt = kernel_side("BM_sum_cuda", x["n"] == 1 << 26, x["seconds"])
                rows.append((f"`sum`, {x['n']} f32",
                             f"{x['seconds'] * 1e3:.3g} ms, {x['gbytes_per_s']:.3g} GB/s", l_txt, r_txt))
            elif n == "matmul":
                tf = " (TF32)" if x.get("tf32") else ""
                rate = (f"{x['gflops'] / 1e3:.1f} TFLOP/s" if x["gflops"] >= 1000
                        else f"{x['gflops']:.1f} GFLOP/s")
                l_txt = r_txt = ""
                if x.get("dtype") == "bfloat16" and x.get("n") in (4096, 8192):
                    l_txt, r_txt = kernel_side(f"BM_matmul_bf16_{x['n']}_locus", True, x["seconds"])
                rows.append((f"GEMM {x['n']}³ {x['dtype']}{tf}, {x['variant']}",
                             f"{x['seconds'] * 1e3:.3g} ms, {rate}", l_txt, r_txt))
            elif n == "mlp_train":
                prec = {"none": "fp32"}.get(x["amp"], x["amp"])
                peer_name = "torch.compile" if x.get("compiled") else "eager"
                # locus's ordinary step and, where measured, its CUDA graph mode
                for key, mode in ((prec, "ordinary step"), (f"{prec}_graph", "CUDA graph mode")):
                    loc = locus_train.get(key)
                    if not loc and key != prec:
                        continue
                    l_txt = r_txt = ""
                    if loc:
                        l_txt = (f"{loc['samples_per_s']:,.0f} samples/s, loss "
                                 f"{loc.get('final_loss', float('nan')):.3f} ({mode})")
                        r_txt = f"{loc['samples_per_s'] / x['samples_per_s']:.2f}"
                    else:
                        l_txt = read_text(os.path.join(d, f"locus.train_{prec}.note")) or "bench_train not run"
                    rows.append((f"MLP epoch, batch {x['batch_size']}, {prec}, PyTorch {peer_name}",
                                 f"{x['samples_per_s']:,.0f} samples/s, loss {x['final_loss']:.3f}", l_txt, r_txt))
    if not rows:
        return
    torch_ver = next((x.get("torch") for rs in recs.values() for x in rs if x.get("torch")), "?")
    dev = next((x.get("device") for rs in recs.values() for x in rs if x.get("device")), "?")
    print(f"| PyTorch {torch_ver} peer ({dev}) | PyTorch | locus | locus / PyTorch |")
    print("|---|---:|---:|---:|")
    for w, p, l, r in rows:
        print(f"| {w} | {p} | {l or '— (no locus benchmark of this on cuda yet)'} | {r or '—'} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("cpu", "gpu"))
    p.add_argument("--dir", required=True)
    p.add_argument("--write", help="cpu: the RESULTS.md whose bench/run section is replaced")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--reps", type=int, default=0)
    p.add_argument("--min-time", default="?")
    p.add_argument("--command", default="bench/run")
    p.add_argument("--venv", default="?")
    p.add_argument("--load-start", default="?")
    p.add_argument("--batch-sizes", default="128")
    p.add_argument("--wait-policy", default="?")
    p.add_argument("--foreign-load", default="?")
    p.add_argument("--max-foreign-load", default="?")
    a = p.parse_args()
    (cpu_main if a.mode == "cpu" else gpu_main)(a)


if __name__ == "__main__":
    main()
