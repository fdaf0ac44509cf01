"""The verify pass on a quiet and on a busy machine: moespec's engine with its threads fitted to the free cores,
the same engine on a fixed team of every core, and llama.cpp, side by side under the same load.

Physics. A verify pass splits its work over one OpenMP team, one thread per core, with a barrier at the end of
every parallel region (moespec.measure.contention). Another CPU-bound process on one of the cores gets a share
of that core, and every barrier waits for the team's thread there. So the same pass is timed in three states of
the machine:
- quiet: nothing else runs;
- 1 busy: one other process spins on a core (`python -c "while True: pass"`);
- 1 torch job: one other process runs torch on every core (small matrix products in a loop): another OpenMP
  team whose threads spin at its own barriers, as another moespec or PyTorch job on the machine does;
- 2 busy: two spinning processes, every core taken (`--states` chooses).
and three ways:
- fitted: the engine as `moespec run` runs it, its threads fitted to the free cores before each pass
  (moespec.measure.contention.Cores);
- fixed: the same engine on every core whatever else runs (Cores with fit=False, only watching);
- llama.cpp: the same model exported to GGUF, through its C API with every logit (benchmarks/llama_cpp_api.py),
  on every core (its threads are fixed when its context is made).
Every pass follows a 64 MiB streaming read that evicts the last-level cache, as in the engine. A round visits the
states in a rotated order and, within a state, times every n and way `--reps` times, interleaved, the ways in
every order in turn (llama.cpp's threads spin a while after its pass, slowing whichever pass follows); the busy
processes start half a second before a state's passes and stop after them.

Reported per way, state and n: the median with its 95% bootstrap interval; busy over quiet for each way, and
fitted over fixed in each state (paired by round); the streaming-read ceiling before and after, and the bytes of a
pass over it (the memory-bound limit).

    .venv/bin/python benchmarks/contention.py --out results/contention/contention.json [--rounds 6] [--reps 3]
        [--n 1-9] [--work DIR] [--no-llama] [--states "quiet,1 busy,1 torch job"]
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp_api  # benchmarks/ is the script's folder, first on sys.path
import numpy as np
import torch
from llama_cpp_build import FORMAT, Skip, export_gguf
from llama_cpp_verify import pass_bytes

from moespec.cli.args import parse_ints
from moespec.defaults import DEPTH, MODEL, N_MAX
from moespec.formats.files import provenance, write_json
from moespec.measure.contention import Cores
from moespec.measure.decoding import PREFILL_POLICY, prompts
from moespec.measure.rounds import bootstrap_median
from moespec.measure.timing import StreamRead, measure_stream_read, median_iqr
from moespec.model import speculative
from moespec.model.dense import set_dense, verify_pass
from moespec.model.load import load_model
from moespec.model.policies import set_policy

LOOP = "while True: pass"
TORCH_JOB = "import torch\na = torch.randn(256, 256)\nwhile True: a @ a"
STATES = {"quiet": [], "1 busy": [LOOP], "1 torch job": [TORCH_JOB], "2 busy": [LOOP, LOOP]}  # processes beside
SETTLE_S = 0.5  # the busy processes run this long before a state's first pass
EVICT_BYTES = 64 << 20  # the engine's reference read: twice this CPU's 32 MiB last-level cache
POLICY = "dedup"  # the kernel llama.cpp's MUL_MAT_ID matches (it reads each selected expert once)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--reps", type=int, default=3, help="passes per (way, state, n) in a round")
    p.add_argument("--n", default="1-9", help="pass sizes")
    p.add_argument("--depth", type=int, default=DEPTH)
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the demo's model")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=str(Path.home() / ".cache" / "moespec" / "llama-cpp-verify"),
                   help="where the GGUF export is cached (shared with llama_cpp_verify.py)")
    p.add_argument("--gguf", help="a GGUF of the same model instead of exporting one")
    p.add_argument("--no-llama", action="store_true", help="time moespec only")
    p.add_argument("--states", default="quiet,1 busy,1 torch job", help=f"of {', '.join(STATES)}")
    return p.parse_args(argv)


class Engine:
    """The demo's model on moespec's engine at one prefilled context: `time(tokens, cores)` is one verify pass
    (the cache evicted first, cropped back after) on the threads `cores` gives it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.lm = load_model(preset=MODEL, layers=args.layers, dtype=FORMAT, seed=args.seed)
        self.dense = set_dense(self.lm.model, "native")
        set_policy(self.lm.model, PREFILL_POLICY)
        context = prompts(1, args.depth, self.lm.model.config.vocab_size, args.seed)[0]
        self.state = speculative.prefill(self.lm.model, torch.tensor([context]))
        set_policy(self.lm.model, POLICY)
        self.evict = StreamRead(EVICT_BYTES)
        self.vocab = self.lm.model.config.vocab_size

    def time(self, tokens: list[int], cores: Cores) -> float:
        self.evict()
        cores.before()
        seconds = speculative.timed_forward(self.lm.model, tokens, self.state)
        cores.after()
        return seconds


def busy(codes: list[str]) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in codes]
    time.sleep(SETTLE_S if procs else 0)
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def summarize(samples: dict, ns: list[int], ways: list[str], states: list[str], rng: np.random.Generator) -> dict:
    """Medians with 95% intervals per (way, state, n); busy / quiet per way; fitted / fixed per state, paired."""
    out: dict = {"median_s": {}, "busy_over_quiet": {}, "fitted_over_fixed": {}}
    for way in ways:
        for state in states:
            out["median_s"][f"{way} | {state}"] = {
                str(n): dict(zip(("median", "lo", "hi"), bootstrap_median(samples[way][state][n], rng))) for n in ns}
            if state != "quiet":
                out["busy_over_quiet"][f"{way} | {state}"] = {
                    str(n): float(np.median(samples[way][state][n]) / np.median(samples[way]["quiet"][n])) for n in ns}
    for state in states:
        out["fitted_over_fixed"][state] = {
            str(n): float(np.median(np.asarray(samples["fitted"][state][n]) / np.asarray(samples["fixed"][state][n])))
            for n in ns}
    return out


def report(result: dict, ns: list[int], ways: list[str], states: list[str]) -> None:
    print(f"ceiling (streaming read): {result['ceiling_gbps']['before']:.1f} GB/s before, "
          f"{result['ceiling_gbps']['after']:.1f} after")
    print("verify pass, ms (median [95% interval]); busy/quiet; fitted/fixed paired")
    for n in ns:
        cells = []
        for way in ways:
            for state in states:
                m = result["median_s"][f"{way} | {state}"][str(n)]
                cells.append(f"{way} {state} {m['median'] * 1e3:6.1f} [{m['lo'] * 1e3:.1f}, {m['hi'] * 1e3:.1f}]")
        print(f"n={n}: " + "; ".join(cells))
        print("      busy/quiet " + ", ".join(f"{k} {v[str(n)]:.2f}" for k, v in result["busy_over_quiet"].items())
              + "; fitted/fixed " + ", ".join(f"{s} {v[str(n)]:.3f}" for s, v in result["fitted_over_fixed"].items()))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ns = parse_ints(args.n, "--n", 1, N_MAX, "pass sizes")
    names = args.states.split(",")
    if not names or any(s not in STATES for s in names) or names[0] != "quiet":
        raise SystemExit(f"--states: quiet first, then any of {', '.join(STATES)}")
    started = provenance("cpu", FORMAT) | {"command": shlex.join(sys.argv)}
    torch.set_num_threads(args.threads)
    engine = Engine(args)
    passes, llama_skipped = None, "--no-llama" if args.no_llama else None
    if not args.no_llama:
        try:
            llama_cpp_api.bindings()
            passes = llama_cpp_api.Passes(export_gguf(args, Path(args.work)), args.depth, max(ns), args.threads,
                                          args.seed)
        except (Skip, llama_cpp_api.Unavailable) as why:
            llama_skipped = str(why)
            print(f"llama.cpp skipped: {llama_skipped}", flush=True)
    ways = ["fitted", "fixed"] + (["llama.cpp"] if passes else [])
    rng = np.random.default_rng(args.seed)
    draws = {n: rng.integers(3, engine.vocab, size=(args.reps * args.rounds + 1, n)).tolist() for n in ns}
    fitted, fixed = Cores(args.threads), Cores(args.threads, fit=False)
    time_of = {"fitted": lambda t: engine.time(t, fitted), "fixed": lambda t: engine.time(t, fixed),
               "llama.cpp": lambda t: passes.time(t)}
    for n in ns:  # untimed: each path's first pass of a size
        for way in ways:
            time_of[way](draws[n][0])
    ceiling = {"before": measure_stream_read()}
    samples = {w: {s: {n: [] for n in ns} for s in names} for w in ways}
    records = {s: {"fitted": [], "fixed": []} for s in names}
    orders = list(itertools.permutations(ways))  # every way after every other alike: llama.cpp's threads spin on
    for r in range(args.rounds):  # after its pass, which a rotation would always hand to the same way
        for state in names[r % len(names):] + names[:r % len(names)]:
            procs = busy(STATES[state])
            try:
                for rep in range(args.reps):
                    for n in ns:
                        for way in orders[(r * args.reps + rep) % len(orders)]:
                            samples[way][state][n].append(time_of[way](draws[n][1 + r * args.reps + rep]))
            finally:
                stop(procs)
            records[state]["fitted"].append(fitted.take())
            records[state]["fixed"].append(fixed.take())
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    fitted.release()
    ceiling["after"] = measure_stream_read()
    if passes:
        passes.close()
    result = {"format": "moespec contention benchmark", "model": f"{MODEL}, {args.layers} layers, random weights "
              f"(seed {args.seed})", "depth": args.depth, "policy": POLICY, "threads": args.threads,
              "dense": engine.dense, "verify_pass": verify_pass(engine.lm.model), "llama_cpp_skipped": llama_skipped,
              "rounds": args.rounds, "reps": args.reps, "n": ns, "states": {s: STATES[s] for s in names},
              "ceiling_gbps": {k: median_iqr(v)[0] for k, v in ceiling.items()},
              "ceiling_samples_gbps": ceiling,
              "bytes": {str(n): pass_bytes(engine.lm.spec, n, args.depth) for n in ns},
              **summarize(samples, ns, ways, names, rng),
              "contention_seen": {s: {w: {k: sum(x[k] for x in v) for k in ("calls", "contended", "fewer_threads")}
                                      for w, v in rec.items()} for s, rec in records.items()},
              "samples_s": {w: {s: {str(n): v for n, v in d.items()} for s, d in sd.items()}
                            for w, sd in samples.items()},
              "provenance": started}
    report(result, ns, ways, names)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
