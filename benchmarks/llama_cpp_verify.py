"""llama.cpp's verify pass beside moespec's engine: the same model, the same depth, n = 1..9 (issue 13, item 5).

Physics. A verification pass of n tokens at context depth d is memory-bound: its time is the bytes it reads over
the bandwidth it reads them at, so no engine can beat bytes / ceiling, where the ceiling is the measured
streaming-read bandwidth of this machine (moespec.measure.timing). The bytes (moespec.model.spec) are
- D: the dense weights read once per pass (attention, norms, routers, the output head, n embedding rows);
- the experts: a per-slot kernel reads n m W (m experts per token, W = the bytes of one expert in every MoE
  layer), a deduplicating kernel reads each distinct expert once, U(n) W per layer, where under uniform iid
  routing (trace-free) U(n) = N (1 - (1 - m/N)^n) of the N experts;
- kv: the cached keys and values of the d + n positions, kv(k = n - 1) at depth d.
llama.cpp's CPU expert product (ggml's mul_mat_id) groups a batch's rows by expert and reads each selected expert
once, so its bytes are of the deduplicating kind; moespec runs both of its kernels ("slot" and "dedup"). The
table puts each engine's measured time beside the limit its kind of bytes allows, and their ratio.

What it does.
1. llama.cpp, where it can: the llama-bench binary given by --llama-bench, else WORK/build/bin/llama-bench, else
   built there from llama.cpp's source (--llama-src, or the tree vendored in the llama-cpp-python sdist, which
   `pip download` fetches into WORK/src; cmake and a C++ compiler needed; about 10 minutes on 2 cores). Where
   none can be had, or it cannot time a pass at a depth (no -d/--n-depth), one line says
   "llama.cpp comparison skipped: ..." and moespec is still timed.
2. The engine's model exported to GGUF (bf16), cached in WORK: moespec.model.load builds the preset with random
   weights (seed --seed, --layers of its decoder layers, vocabulary 32768) and moespec.model.gguf_export writes it
   (its tensors equal, byte for byte, those of llama.cpp's own convert_hf_to_gguf.py --outtype bf16 on the same
   model; its vocabulary is the constructed byte-level one that module describes). moespec's rounds build the
   same weights from the same seed, so both engines run one model.
3. Rounds, interleaved (--rounds): a round runs llama-bench for every n (`-p n -n 0 -d DEPTH -r REPS -t THREADS`:
   each sample is one llama_decode of n tokens after a DEPTH-token context, which llama-bench prefills once and
   restores before every sample; one warm-up pass of n tokens first, at depth 0) and moespec's engine for every n
   (moespec.measure.run.run_engine with throughput=False: one prefill of DEPTH tokens, the cache cropped back
   before each timed pass of n tokens, slot and dedup interleaved), the two engines' order alternating from
   round to round (A B, B A, ...) so drift hits both alike. The ceiling is measured before the first round,
   between every two engine blocks and after the last.
4. Per engine and n: the median of all rounds' samples with a distribution-free 95% interval (order statistics
   of the median: [x_(j), x_(k-j+1)] with the largest j whose binomial coverage is >= 95%; with fewer than 6
   samples no such j exists and [min, max] is given with its coverage); the ratio moespec / llama.cpp of the
   medians with a 95% bootstrap interval; the bytes of a pass and bytes / ceiling.

Caveats.
- llama-bench's prompt pass computes the logits of the last token only; a verify pass (and moespec's) needs all
  n. The output head's bytes are read once either way, so the byte model is the same; the extra n - 1 rows of
  the head's product are compute that llama.cpp's number leaves out.
- Caches: llama-bench times its samples back to back, while moespec's engine reads a buffer larger than the
  last-level cache before every timed pass; what survives in llama.cpp's cache between samples (the KV cache of
  a 512-token context is ~8 MB, this CPU's L3 32 MiB) is not read from memory, so it can come out a few percent
  above the limit.
- Routing: both engines' routers decide (random weights, random token ids); the dedup bytes use the uniform
  expectation U(n), not the realized unions.
- Threads: llama-bench -t THREADS and torch.set_num_threads(THREADS) (default: torch's, i.e. this machine's
  cores); the ceiling reads on torch's threads too.
- On a shared or busy machine the times are noisy; run it when the machine is quiet.

    .venv/bin/python benchmarks/llama_cpp_verify.py --out out/llama-cpp-verify.json [--work DIR]
        [--llama-bench PATH] [--rounds 4] [--reps 7] [--depth 512] [--layers 2] [--n 1-9]

It prints the ceiling, then the table, and ends with one JSON line; --out receives the whole result (device,
dtype, versions of moespec, torch and llama.cpp, the timestamp, the exact command, every sample).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp_api  # benchmarks/ is the script's folder, first on sys.path
import numpy as np
import torch
from llama_cpp_build import (
    FORMAT,
    LLAMA_CPP_PYTHON,
    Skip,
    changelog_commit,
    export_gguf,
    llama_bench,
    llama_source,
    say,
)

from moespec import MoespecError
from moespec.cli.args import parse_ints
from moespec.defaults import DEPTH, MODEL, N_MAX
from moespec.formats.files import provenance, write_json
from moespec.measure.level import WAIT_S
from moespec.measure.run import RunConfig, run_engine
from moespec.measure.timing import median_iqr, timer_for
from moespec.model.load import PRESET_VOCAB, preset_config
from moespec.model.spec import ModelSpec

POLICIES = ("slot", "dedup")  # moespec's kernels as the engine runs them
ENGINES = ["llama.cpp", "llama.cpp api", "moespec"]  # the blocks of a round: llama-bench, the C API, the engine
CONFIDENCE = 0.95
BOOTSTRAP = 2000  # resamples of the ratio's interval
BENCH_TIMEOUT_S = 3600  # one llama-bench call (all n of one round)

# ---- statistics ----------------------------------------------------------------------------------------------
def median_interval(samples: list[float]) -> dict:
    """The median with its distribution-free interval [x_(j), x_(k-j+1)] (1-based order statistics): the largest
    j whose coverage 1 - 2 P(Binomial(k, 1/2) <= j - 1) is >= 95%; [min, max] with its coverage below 6 samples."""
    x, k = sorted(samples), len(samples)
    coverage = lambda j: 1 - 2 * sum(math.comb(k, i) for i in range(j)) / 2 ** k
    j = 1
    while j + 1 <= (k + 1) // 2 and coverage(j + 1) >= CONFIDENCE:
        j += 1
    return {"median": float(np.median(x)), "lo": x[j - 1], "hi": x[k - j], "coverage": coverage(j), "k": k}


def ratio_interval(num: list[float], den: list[float], rng: np.random.Generator) -> dict:
    """median(num) / median(den) with its 95% percentile-bootstrap interval (both sample sets resampled)."""
    a, b = np.asarray(num), np.asarray(den)
    r = (np.median(rng.choice(a, size=(BOOTSTRAP, a.size)), axis=1)
         / np.median(rng.choice(b, size=(BOOTSTRAP, b.size)), axis=1))
    lo, hi = np.quantile(r, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return {"ratio": float(np.median(a) / np.median(b)), "lo": float(lo), "hi": float(hi)}


# ---- the bytes of a pass -------------------------------------------------------------------------------------
def pass_bytes(spec: ModelSpec, n: int, depth: int) -> dict:
    """D, kv and the experts of an n-token pass at depth d: per slot n m w_l, deduplicated U(n) w_l per MoE layer
    with the uniform iid union U(n) = N (1 - (1 - m/N)^n)."""
    union = spec.N * (1 - (1 - spec.m / spec.N) ** n)
    dense, kv = spec.dense_bytes(FORMAT, tokens=n), spec.kv_bytes(k=n - 1, depth=depth)
    slot = n * spec.m * spec.W(FORMAT)
    dedup = round(sum(union * spec.expert_bytes(layer, FORMAT) for layer in range(spec.L)))
    return {"dense": dense, "kv": kv, "experts_slot": slot, "experts_dedup": dedup, "union": union,
            "slot": dense + kv + slot, "dedup": dense + kv + dedup}


# ---- the two engines' rounds ---------------------------------------------------------------------------------
def llama_round(binary: Path, gguf: Path, ns: list[int], args: argparse.Namespace, threads: int,
                raw: Path) -> tuple[dict[int, list[float]], list[dict]]:
    """One llama-bench call: every n, reps samples each, at the depth; seconds per n and llama-bench's rows."""
    cmd = [str(binary), "-m", str(gguf), "-p", ",".join(map(str, ns)), "-n", "0", "-d", str(args.depth),
           "-t", str(threads), "-r", str(args.reps), "-o", "jsonl"]
    try:
        got = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Skip(f"llama-bench ran past {BENCH_TIMEOUT_S} s") from None
    raw.write_text(got.stdout)
    if got.returncode:
        tail = got.stderr.strip().splitlines()[-1:] or ["no output"]
        raise Skip(f"llama-bench failed (exit {got.returncode}): {tail[0]}")
    rows = [json.loads(line) for line in got.stdout.splitlines() if line.strip().startswith("{")]
    samples = {}
    for row in rows:
        if row.get("n_gen") == 0 and row.get("n_depth") == args.depth and row.get("n_prompt") in ns:
            samples[row["n_prompt"]] = [t / 1e9 for t in row["samples_ns"]]
    if sorted(samples) != ns:
        raise Skip(f"llama-bench reported n = {sorted(samples)} at depth {args.depth}, asked for {ns}")
    return samples, rows


def llama_api(args: argparse.Namespace, work: Path, binary: Path | None) -> object:
    """llama-cpp-python's low-level bindings for the all-logits column: from --llama-python/--llama-lib, else the
    installed package, else the sdist in WORK/src loading the libllama built beside the llama-bench binary."""
    lib = Path(args.llama_lib) if args.llama_lib else None
    if args.llama_python or lib:
        return llama_cpp_api.bindings(Path(args.llama_python) if args.llama_python else None, lib)
    try:
        return llama_cpp_api.bindings()
    except llama_cpp_api.Unavailable as installed:
        trees = [p for p in sorted((work / "src").glob("llama_cpp_python-*"), reverse=True)
                 if (p / "llama_cpp").is_dir()]
        built = binary.parent if binary is not None and (binary.parent / "libllama.so").exists() else None
        if not trees or built is None:
            raise installed from None
        return llama_cpp_api.bindings(trees[0], built)


def api_round(gguf: Path, ns: list[int], args: argparse.Namespace,
              rng: np.random.Generator) -> dict[int, list[float]]:
    """One block of llama.cpp through its C API: a fresh context, the prefill, reps passes per n (all logits)."""
    passes = llama_cpp_api.Passes(gguf, args.depth, max(ns), args.threads, args.seed)
    try:
        return passes.samples(ns, args.reps, rng)
    finally:
        passes.close()


def moespec_round(ns: list[int], args: argparse.Namespace, path: Path) -> tuple[dict[str, dict[int, list[float]]],
                                                                                   dict | None]:
    """One engine run of the verify times (both kernels, every n, exactly --reps kept samples each: an engine that
    adds rounds until its intervals are narrow is held to the same count as llama-bench); its runs.json is kept at
    `path`. Returns the samples and the engine's own noise record (None where it keeps none)."""
    wanted = {"out": str(path), "preset": MODEL, "layers": args.layers, "dtype": FORMAT, "device": "cpu",
              "depth": args.depth, "n": tuple(ns), "reps": args.reps, "throughput": False, "seed": args.seed,
              "max_reps": args.reps, "outside": False,  # these two only where the engine has them
              "level_wait_s": WAIT_S}  # pinned, as this comparison always was: pinning is opt-in
    known = {f.name for f in dataclasses.fields(RunConfig)}
    runs = run_engine(RunConfig(**{k: v for k, v in wanted.items() if k in known}))
    samples = {p: {n: list(runs["verify_samples_s"][p][str(n)]) for n in ns} for p in POLICIES}
    gc.collect()  # the round's model goes before the next block starts
    return samples, runs.get("noise")


# ---- output --------------------------------------------------------------------------------------------------
def ms(stat: dict | None) -> str:
    if stat is None:
        return "-"
    return f"{stat['median'] * 1e3:7.2f} [{stat['lo'] * 1e3:.2f}, {stat['hi'] * 1e3:.2f}]"


def print_report(result: dict, ns: list[int]) -> None:
    c = result["ceiling"]
    gbps = lambda x: "-" if x is None else f"{x:.2f}"
    print(f"ceiling ({c['kind']}, {result['threads']} threads): {c['median_gbps']:.2f} GB/s, median of "
          f"{len(c['all_gbps'])} reads (IQR {c['iqr_gbps']:.2f}); before {gbps(c['before_median_gbps'])}, between "
          f"{gbps(c['between_median_gbps'])}, after {gbps(c['after_median_gbps'])} GB/s")
    rows = result["by_n"]
    print(f"\nverify time at depth {result['depth']}, ms: median [95% interval] over {result['rounds']} round(s) "
          f"x {result['reps']} reps")
    print("llama-bench: the last token's logits, samples back to back; llama.cpp api: every logit, the cache "
          "evicted before each pass (as moespec's)")
    print(f"{'n':>2}  {'llama-bench':<24}{'llama.cpp api':<24}{'moespec slot':<24}{'moespec dedup':<24}"
          f"{'dedup/bench':>12}{'dedup/api':>10}")
    for n in ns:
        row = rows[str(n)]
        ratio = lambda r: "-" if r is None else f"{r['ratio']:.2f}"
        print(f"{n:>2}  {ms(row['llama_cpp']):<24}{ms(row['llama_cpp_api']):<24}{ms(row['moespec']['slot']):<24}"
              f"{ms(row['moespec']['dedup']):<24}{ratio(row['ratio']['dedup']):>12}"
              f"{ratio(row['ratio_api']['dedup']):>10}")
    print(f"\nbytes per pass (MB = 1e6 B) and the physical limit bytes / {c['median_gbps']:.2f} GB/s; "
          "% of limit = limit / measured time (llama.cpp's bytes are of the dedup kind)")
    print(f"{'n':>2}{'dense':>9}{'kv':>7}{'U(n)':>7}{'slot MB':>9}{'dedup MB':>10}{'limit slot':>12}{'limit dedup':>13}"
          f"{'bench %':>9}{'api %':>7}{'slot %':>8}{'dedup %':>9}")
    for n in ns:
        row, b = rows[str(n)], rows[str(n)]["bytes"]
        share = lambda s, lim: "-" if s is None else f"{100 * lim / s['median']:.0f}"
        print(f"{n:>2}{b['dense'] / 1e6:9.1f}{b['kv'] / 1e6:7.1f}{b['union']:7.1f}{b['slot'] / 1e6:9.1f}"
              f"{b['dedup'] / 1e6:10.1f}{row['limit_s']['slot'] * 1e3:10.2f}ms{row['limit_s']['dedup'] * 1e3:11.2f}ms"
              f"{share(row['llama_cpp'], row['limit_s']['dedup']):>9}"
              f"{share(row['llama_cpp_api'], row['limit_s']['dedup']):>7}"
              f"{share(row['moespec']['slot'], row['limit_s']['slot']):>8}"
              f"{share(row['moespec']['dedup'], row['limit_s']['dedup']):>9}")


def headline(result: dict, ns: list[int]) -> dict:
    """The one JSON line: medians in seconds per n, ratios, limits."""
    rows = result["by_n"]
    pick = lambda f: {str(n): f(rows[str(n)]) for n in ns}
    sig = lambda x: None if x is None else float(f"{x:.4g}")
    return {"program": "llama_cpp_verify", "out": result["out"], "depth": result["depth"],
            "ceiling_gbps": sig(result["ceiling"]["median_gbps"]),
            "llama_cpp_skipped": result["llama_cpp"].get("skipped"),
            "llama_cpp_s": pick(lambda r: sig(r["llama_cpp"] and r["llama_cpp"]["median"])),
            "llama_cpp_api_skipped": result["llama_cpp"]["api"]["skipped"],
            "llama_cpp_api_s": pick(lambda r: sig(r["llama_cpp_api"] and r["llama_cpp_api"]["median"])),
            "ratio_dedup_api": pick(lambda r: sig(r["ratio_api"]["dedup"] and r["ratio_api"]["dedup"]["ratio"])),
            "moespec_slot_s": pick(lambda r: sig(r["moespec"]["slot"]["median"])),
            "moespec_dedup_s": pick(lambda r: sig(r["moespec"]["dedup"]["median"])),
            "ratio_slot": pick(lambda r: sig(r["ratio"]["slot"] and r["ratio"]["slot"]["ratio"])),
            "ratio_dedup": pick(lambda r: sig(r["ratio"]["dedup"] and r["ratio"]["dedup"]["ratio"])),
            "limit_slot_s": pick(lambda r: sig(r["limit_s"]["slot"])),
            "limit_dedup_s": pick(lambda r: sig(r["limit_s"]["dedup"]))}


# ---- main ----------------------------------------------------------------------------------------------------
def default_work() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moespec" / "llama-cpp"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/llama-cpp-verify.json", help="the result JSON (default %(default)s)")
    p.add_argument("--work", default=str(default_work()),
                   help="where llama.cpp's source, build and the GGUF live (default %(default)s)")
    p.add_argument("--llama-bench", help="a built llama-bench binary (default: WORK/build/bin/llama-bench, built "
                                         "there when missing)")
    p.add_argument("--llama-src", help="a llama.cpp source tree (default: found beside the binary or in WORK/src, "
                                       "else the llama-cpp-python sdist's, fetched with pip)")
    p.add_argument("--gguf", help="use this GGUF of the engine's model instead of exporting one to WORK")
    p.add_argument("--no-build", action="store_true", help="never fetch or build llama.cpp (skip it if absent)")
    p.add_argument("--llama-python", help="a llama-cpp-python source tree for the all-logits column when the package "
                                          "is not installed (default: the sdist in WORK/src, if there)")
    p.add_argument("--llama-lib", help="the folder of the libllama.so those bindings load (default: the "
                                       "llama-bench binary's folder)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds of both engines (default %(default)s)")
    p.add_argument("--reps", type=int, default=7, help="samples per engine, n and round (default %(default)s)")
    p.add_argument("--depth", type=int, default=DEPTH, help="context depth d (default %(default)s)")
    p.add_argument("--layers", type=int, default=2, help=f"decoder layers of {MODEL} (default %(default)s)")
    p.add_argument("--n", default=f"1-{N_MAX}", help="verify pass sizes (default %(default)s)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help="threads of both engines and the ceiling (default: torch's, %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the random weights' seed (default %(default)s)")
    args = p.parse_args(argv)
    for flag, value, least in (("--rounds", args.rounds, 1), ("--reps", args.reps, 2), ("--depth", args.depth, 1),
                               ("--layers", args.layers, 1), ("--threads", args.threads, 1)):
        if value < least:
            p.error(f"{flag} must be >= {least}, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ns = parse_ints(args.n, "--n", 1, N_MAX, "pass sizes")
    work, out = Path(args.work).expanduser(), Path(args.out)
    rounds_dir = out.parent / f"{out.stem}-rounds"
    work.mkdir(parents=True, exist_ok=True)
    rounds_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    _, spec = preset_config(ModelSpec.from_name(MODEL), args.layers, PRESET_VOCAB)
    started = provenance("cpu", FORMAT) | {"command": shlex.join(sys.argv), "python": sys.executable}

    binary = gguf = skipped = None
    try:
        binary = llama_bench(args, work, args.threads)
        gguf = export_gguf(args, work)
    except Skip as why:
        skipped = str(why)
        print(f"llama.cpp comparison skipped: {skipped}", flush=True)
    api_skipped = skipped
    if gguf is not None:
        try:
            llama_api(args, work, binary)  # the bindings loadable: installed, or the sdist beside a built libllama
        except llama_cpp_api.Unavailable as why:
            api_skipped = str(why)
            print(f"llama.cpp all-logits column skipped: {api_skipped}", flush=True)
    src = None
    if binary is not None:
        try:
            src = llama_source(args, work, binary, fetch=False)
        except Skip:
            pass

    timer = timer_for("cpu")
    ceilings: list[tuple[str, list[float]]] = [("before", timer.ceiling())]
    say(f"ceiling before: {median_iqr(ceilings[0][1])[0]:.2f} GB/s")
    llama_samples: dict[int, list[float]] = {n: [] for n in ns}
    api_samples: dict[int, list[float]] = {n: [] for n in ns}
    api_rng = np.random.default_rng(args.seed + 1)
    moe_samples = {p: {n: [] for n in ns} for p in POLICIES}
    llama_rows: list[dict] = []
    moe_noise: list[dict | None] = []
    order = []
    for r in range(args.rounds):
        blocks = ENGINES[r % len(ENGINES):] + ENGINES[:r % len(ENGINES)]  # rotated: drift hits every engine
        for block in blocks:
            if (block == "llama.cpp" and skipped) or (block == "llama.cpp api" and api_skipped):
                continue
            t0 = time.perf_counter()
            if block == "llama.cpp":
                try:
                    got, rows = llama_round(binary, gguf, ns, args, args.threads, rounds_dir / f"llama-round{r}.jsonl")
                except Skip as why:
                    skipped = str(why)
                    print(f"llama.cpp comparison skipped: {skipped}", flush=True)
                    continue
                llama_rows += rows
                for n in ns:
                    llama_samples[n] += got[n]
            elif block == "llama.cpp api":
                try:
                    got = api_round(gguf, ns, args, api_rng)
                except llama_cpp_api.Unavailable as why:
                    api_skipped = str(why)
                    print(f"llama.cpp all-logits column skipped: {api_skipped}", flush=True)
                    continue
                for n in ns:
                    api_samples[n] += got[n]
            else:
                got, noise = moespec_round(ns, args, rounds_dir / f"moespec-round{r}.json")
                moe_noise.append(noise)
                for p in POLICIES:
                    for n in ns:
                        moe_samples[p][n] += got[p][n]
            order.append(block)
            ceilings.append(("between", timer.ceiling()))
            say(f"round {r + 1}/{args.rounds}: {block} in {time.perf_counter() - t0:.0f} s; ceiling "
                f"{median_iqr(ceilings[-1][1])[0]:.2f} GB/s")
    if len(ceilings) > 1:
        ceilings[-1] = ("after", ceilings[-1][1])
    else:
        ceilings.append(("after", timer.ceiling()))

    if skipped:  # a failure mid-run drops llama.cpp's partial samples: the comparison needs every round
        llama_samples = {n: [] for n in ns}
    if api_skipped:
        api_samples = {n: [] for n in ns}
    every = [g for _, s in ceilings for g in s]
    phase = lambda name: [g for kind, s in ceilings if kind == name for g in s]
    ceiling = median_iqr(every)[0]
    rng = np.random.default_rng(args.seed)
    by_n = {}
    for n in ns:
        b = pass_bytes(spec, n, args.depth)
        ll = median_interval(llama_samples[n]) if llama_samples[n] else None
        la = median_interval(api_samples[n]) if api_samples[n] else None
        by_n[str(n)] = {
            "bytes": b,
            "limit_s": {p: b[p] / (ceiling * 1e9) for p in POLICIES},
            "llama_cpp": ll, "llama_cpp_samples_s": llama_samples[n],
            "moespec": {p: median_interval(moe_samples[p][n]) for p in POLICIES},
            "moespec_samples_s": {p: moe_samples[p][n] for p in POLICIES},
            "ratio": {p: ratio_interval(moe_samples[p][n], llama_samples[n], rng) if ll else None for p in POLICIES},
            "llama_cpp_api": la, "llama_cpp_api_samples_s": api_samples[n],
            "ratio_api": {p: ratio_interval(moe_samples[p][n], api_samples[n], rng) if la else None for p in POLICIES},
        }
    meta = llama_rows[0] if llama_rows else {}
    reported = meta.get("build_commit")
    versions = started["versions"] | {
        "llama.cpp": reported if reported not in (None, "unknown") else changelog_commit(src),
        "llama.cpp_build_commit": reported, "llama.cpp_build_number": meta.get("build_number"),
        "llama.cpp_sdist_changelog": changelog_commit(src),
        "llama-cpp-python_sdist": LLAMA_CPP_PYTHON if src and "llama_cpp_python" in str(src) else None}
    between = phase("between")
    result = {
        "format": "moespec-llama-cpp-verify", "format_version": 2, "out": str(out),
        "provenance": started | {"device": timer.name, "versions": versions},
        "model": spec.to_dict(), "dtype": FORMAT, "depth": args.depth, "n": ns, "rounds": args.rounds,
        "reps": args.reps, "threads": args.threads, "seed": args.seed, "block_order": order,
        "ceiling": {"kind": timer.ceiling_kind, "median_gbps": ceiling, "iqr_gbps": median_iqr(every)[1],
                    "all_gbps": every, "before_median_gbps": median_iqr(phase("before"))[0],
                    "between_median_gbps": median_iqr(between)[0] if between else None,
                    "after_median_gbps": median_iqr(phase("after"))[0], "phases": ceilings},
        "llama_cpp": {"skipped": skipped, "binary": None if binary is None else str(binary.resolve()),
                      "gguf": None if gguf is None else str(gguf.resolve()),
                      "gguf_bytes": None if gguf is None else gguf.stat().st_size,
                      "source": None if src is None else str(src),
                      "bench_fields": {k: meta.get(k) for k in ("build_commit", "build_number", "cpu_info",
                                                                "backends", "model_type", "model_size",
                                                                "model_n_params", "n_batch", "n_ubatch",
                                                                "n_threads", "type_k", "type_v", "flash_attn",
                                                                "repack")} if meta else None,
                      "timing": "llama-bench -p n -n 0 -d DEPTH: one llama_decode of n tokens after the restored "
                                "DEPTH-token context; the last token's logits only",
                      "api": {"skipped": api_skipped, "timing": "llama_cpp_api.Passes: one llama_decode of n tokens "
                              "after the DEPTH-token context, every logit, the last-level cache evicted first"}},
        "moespec": {"timing": "run_engine(throughput=False): one forward of n tokens after the prefilled context, "
                              "every logit", "noise_per_round": moe_noise,
                    "runs": [str(p) for p in sorted(rounds_dir.glob("moespec-round*.json"))]},
        "bytes_note": "dedup bytes: the uniform iid union U(n) = N (1 - (1 - m/N)^n) per MoE layer; llama.cpp's "
                      "mul_mat_id reads each selected expert once (dedup kind)",
        "by_n": by_n,
    }
    write_json(out, result)
    print_report(result, ns)
    print(json.dumps(headline(result, ns)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MoespecError as err:
        print(f"llama_cpp_verify: {err}", file=sys.stderr)
        sys.exit(2)
