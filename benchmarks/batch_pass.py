"""moespec's batched verify pass beside llama.cpp's: B sequences x n tokens in one pass, the same model in both.

Physics. A server verifies the drafts of B sequences in one pass of B n tokens, each sequence at context depth d
over its own KV cache. The pass must move
- the dense weights once (attention, norms, routers, the output head) and B n embedding rows: D
  (moespec.model.spec.dense_bytes);
- the experts each MoE layer's B n tokens select, each distinct expert once: the union U_l of layer l
  (moespec.kernels.experts.distinct_experts), U_l w_l bytes; it nears all N experts as B n grows;
- each sequence's KV cache of d + n positions: B kv(n - 1) (moespec.model.spec.kv_bytes);
and it does 2 x (the parameters each token touches) FLOPs per token: the dense matrices with the head, and the m
experts it selects (attention over the cache, 4 (d + n) x heads x head_dim per token and layer, is left out: ~2%
at depth 512). Bytes per token fall with B n while FLOPs per token stay, so the pass moves from memory-bound toward
compute-bound. Its floor is max(bytes / streaming-read ceiling, FLOPs / matmul peak), both ceilings measured on
this machine in the same run (moespec.measure.timing); the roofline share is that floor over the measured time.
That floor assumes the pass's reads and multiply-adds overlap as one stream. They cannot across its phases: a layer's
experts wait on its attention and router, the next layer's attention on its experts, the head on the last layer,
and no cache holds a layer's experts ahead of time. So the pass also has a phase floor, the sum of each phase's own
roofline: the dense matrices (every dense bf16 matrix does B n FLOPs per byte, so they are one phase),
max(D / read, dense FLOPs / peak); the experts, max(union bytes / read, expert FLOPs / peak); the caches, kv / read.
Where the dense phase is compute-bound and the experts' memory-bound (large B n) the phase floor exceeds the floor,
and a pass cannot reach the floor's share above floor / phase floor.
GB/s and GFLOP/s are those bytes and FLOPs over each engine's time: the same work for every engine (the per-slot
kernel reads B n m experts per layer, more than the union: `experts_slot_bytes` in the JSON).

What it does.
1. The model: OLMoE-1B-7B's shape cut to --layers decoder layers (default 2), bf16, random weights from --seed,
   vocabulary 32768 (moespec.model.load), exported once to a bf16 GGUF cached in --work (llama_cpp_build.export_gguf,
   as benchmarks/llama_cpp_verify.py does), so both engines run the same weights.
2. Contexts: max(B) sequences of --depth seeded random tokens each, prefilled once per engine: moespec one cache per
   sequence (moespec.model.cache.new_cache), llama.cpp one context with a sequence id per sequence
   (moespec.model.llama_cpp.LlamaSequences). A pass of B sequences runs over the first B.
3. Cells (B, n): one seeded set of B x n random token ids per cell, the same for both engines and every round.
   moespec: moespec.model.batched.batch_logits over the B caches with the native dense path
   (moespec.model.dense.set_dense "native") and the expert policy "dedup" or "slot" (moespec.model.policies), each
   cache then cropped by n. llama.cpp: one llama_decode of the B n tokens with every logit, timed to
   llama_synchronize, then llama_memory_seq_rm per sequence. Each engine's first pass of a cell is untimed;
   moespec's records the routing (moespec.routing.tracer.RouterTap) whose per-layer unions give the expert bytes.
4. Rounds (--rounds), interleaved: a round times every (engine, B, n) once, every pass after the same flush of the
   last-level cache (moespec.measure.timing.CpuTimer.flush), the order rotated by len / rounds from round to
   round so every pass starts a round as often. Medians with 95% bootstrap intervals over the rounds
   (moespec.measure.rounds.bootstrap_median); the ratio moespec / llama.cpp is the median of the per-round ratios
   (the rounds pair the engines) with its interval.
5. Ceilings: the streaming read and the matmul peak (bf16; fp32 where torch has no bf16 GEMM:
   moespec.measure.timing.matmul_dtype), before the first round and after the last, and a short sample of each
   (ROUND_STREAM_READS reads, ROUND_MATMULS products) before every round and after the last. This host's read moves by
   2x within seconds, so a pass is judged against the ceilings around its own round: its round share is the pass's floor
   at the mean of the samples bracketing its round over its time, and the table's share and phase share are each
   engine's median over rounds with a 95% interval. The share at the run's ceilings (the median of the before and after
   samples) stays in the JSON (`run_roofline_share`).

Caveats.
- Routing: random weights route however they route (close to uniform over the N experts); a trained model's tokens
  share experts more, so its unions are smaller at the same B n. The unions are moespec's routing of each cell's
  tokens; llama.cpp routes the same tokens on the same weights (tests/test_llama_cpp.py: >= 97% of tokens alike).
- llama.cpp keeps K and V in f16, moespec in bf16: the same bytes.
- --threads sets both engines' threads (torch.set_num_threads, llama.cpp's n_threads) and the ceilings'.
- A shared or busy machine makes the times noisy: the load average before and after is in the JSON.

    .venv/bin/python benchmarks/batch_pass.py --out out/batch-pass.json [--batches 1,2,4,8] [--n 1,2,4,9]
        [--rounds 20] [--depth 512] [--threads T] [--layers 2] [--seed 0] [--work DIR]

It prints the ceilings, the times and ratios per cell, then bytes, FLOPs, rates and roofline shares per cell; --out
receives it all with every sample and the provenance (device, dtype, versions, git commit, timestamp, command).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from llama_cpp_build import FORMAT, export_gguf, say  # benchmarks/ is the script's folder, first on sys.path
from llama_cpp_verify import default_work

from moespec import MoespecError
from moespec.cli.args import parse_ints
from moespec.defaults import BATCH_LIMIT, DEPTH, DEPTH_LIMIT, MODEL, N_MAX, THREADS_LIMIT
from moespec.formats.files import check_output, provenance, write_json
from moespec.kernels import pages
from moespec.kernels.experts import distinct_experts
from moespec.measure.decoding import PREFILL_POLICY
from moespec.measure.rounds import bootstrap_median
from moespec.measure.timing import CpuTimer, StreamRead, matmul_dtype, matmul_peak, measure_stream_read
from moespec.model.batched import batch_logits, batch_pass_kind
from moespec.model.cache import new_cache
from moespec.model.dense import set_dense
from moespec.model.llama_cpp import LlamaSequences, bindings
from moespec.model.load import find_routers, load_model
from moespec.model.policies import moe_experts, set_policy
from moespec.model.speculative import forward_logits
from moespec.routing.tracer import RouterTap

LLAMA = "llama.cpp"
POLICIES = ("dedup", "slot")  # moespec's expert kernels, each an engine of the table
ENGINES = (LLAMA, *(f"moespec {p}" for p in POLICIES))
LLAMA_N_BATCH = 2048  # llama-bench's default n_batch; raised to B n where a pass holds more
ROUND_STREAM_READS = 3  # 256 MiB each: ~15 ms a round at 50 GB/s
ROUND_MATMULS = 2  # 1024 x 2048 x 2048 bf16 each, after a warm-up: ~0.1 s a round at 400 GFLOP/s


# ---- the two engines ------------------------------------------------------------------------------------------
class Moespec:
    """The model with max(B) prefilled caches; `time(policy, tokens, flush)` is one batched pass over the first B."""

    def __init__(self, lm: Any, contexts: list[list[int]]) -> None:
        self.lm, self.model = lm, lm.model
        self.dense = set_dense(self.model, "native")
        set_policy(self.model, PREFILL_POLICY)
        self.caches = [new_cache(self.model) for _ in contexts]
        with torch.inference_mode():
            for context, cache in zip(contexts, self.caches):
                forward_logits(self.model, context, cache, keep=1)

    def time(self, policy: str, tokens: list[list[int]], flush: Callable[[], None]) -> float:
        """Seconds of one pass of every sequence's tokens (every logit), its cache positions dropped after."""
        set_policy(self.model, policy)
        caches = self.caches[:len(tokens)]
        flush()
        with torch.inference_mode():
            start = time.perf_counter()
            batch_logits(self.model, tokens, caches)
            seconds = time.perf_counter() - start
            for cache, ids in zip(caches, tokens):
                cache.crop(-len(ids))
        return seconds

    def unions(self, tokens: list[list[int]]) -> list[int]:
        """Distinct experts per MoE layer that the pass's tokens select (an untimed dedup pass under a tap)."""
        tap = RouterTap(find_routers(self.model, self.lm.spec), self.lm.spec.m)
        try:
            self.time("dedup", tokens, lambda: None)
            ids, _ = tap.take()  # [B n, L, m]
        finally:
            tap.close()
        return [distinct_experts(torch.from_numpy(ids[:, layer])) for layer in range(ids.shape[1])]

    def parameters_per_token(self) -> tuple[int, int]:
        """The weights one token multiplies: every matrix but the experts and the embedding table (a lookup), and
        the m experts it selects in each MoE layer (dense, experts)."""
        experts = [p for module in moe_experts(self.model) for p in module.parameters()]
        embed, head = self.model.get_input_embeddings().weight, self.model.get_output_embeddings().weight
        seen = {id(p) for p in experts}
        dense = sum(p.numel() for p in self.model.parameters() if id(p) not in seen)
        dense -= embed.numel() if embed is not head else 0
        return dense, sum(p.numel() for p in experts) * self.lm.spec.m // self.lm.spec.N


class Llama:
    """llama.cpp with max(B) prefilled sequences in one context; `time(tokens, flush)` is one decode of the first B."""

    def __init__(self, gguf: Path, contexts: list[list[int]], room: int, threads: int, n_batch: int) -> None:
        self.seqs = LlamaSequences(str(gguf), len(contexts), room, threads, n_batch=n_batch)
        for seq, context in enumerate(contexts):
            self.seqs.prefill(seq, context)

    def time(self, tokens: list[list[int]], flush: Callable[[], None]) -> float:
        self.seqs.fill(tokens)
        flush()
        start = time.perf_counter()
        self.seqs.decode()
        seconds = time.perf_counter() - start
        self.seqs.rollback([len(ids) for ids in tokens])
        return seconds

    def close(self) -> None:
        self.seqs.close()


# ---- the work of a pass ---------------------------------------------------------------------------------------
def work(lm: Any, b: int, n: int, depth: int, unions: list[int], per_token: tuple[int, int]) -> dict:
    """Bytes (dense once, the union of experts, B KV caches), the per-slot kernel's expert bytes, and FLOPs, in all
    and of the dense and the expert phase (per_token: the dense and the expert parameters one token multiplies)."""
    spec = lm.spec
    experts = sum(u * spec.expert_bytes(layer, FORMAT) for layer, u in enumerate(unions))
    dense, kv = spec.dense_bytes(FORMAT, tokens=b * n), b * spec.kv_bytes(k=n - 1, depth=depth)
    dense_flops, experts_flops = (2 * p * b * n for p in per_token)
    return {"dense_bytes": dense, "experts_bytes": experts, "kv_bytes": kv, "bytes": dense + experts + kv,
            "unions": unions, "experts_slot_bytes": b * n * spec.m * spec.W(FORMAT),
            "dense_flops": dense_flops, "experts_flops": experts_flops, "flops": dense_flops + experts_flops}


def floors(w: dict, gbps: float, gflops: float) -> tuple[float, float]:
    """The pass's floor, max(bytes / read, FLOPs / peak), and its phase floor, the sum of the dense, expert and
    cache phases' own rooflines (module docstring), in seconds."""
    read, peak = gbps * 1e9, gflops * 1e9
    phases = (max(w["dense_bytes"] / read, w["dense_flops"] / peak)
              + max(w["experts_bytes"] / read, w["experts_flops"] / peak) + w["kv_bytes"] / read)
    return max(w["bytes"] / read, w["flops"] / peak), phases


def round_sample(read: StreamRead, timer: CpuTimer) -> dict[str, list[float]]:
    """The short ceiling sample taken between rounds: GB/s of ROUND_STREAM_READS reads, GFLOP/s of ROUND_MATMULS
    bf16 products."""
    return {"stream": [read() for _ in range(ROUND_STREAM_READS)],
            "matmul": matmul_peak(timer, torch.bfloat16, ROUND_MATMULS)}


def round_ceilings(samples: list[dict[str, list[float]]]) -> list[tuple[float, float]]:
    """Per round, (GB/s, GFLOP/s): the mean of the medians of the samples taken before it and after it."""
    at = [(float(np.median(s["stream"])), float(np.median(s["matmul"]))) for s in samples]
    return [((a[0] + b[0]) / 2, (a[1] + b[1]) / 2) for a, b in zip(at, at[1:])]


def cell_stats(samples: dict[str, list[float]], w: dict, gbps: float, gflops: float,
               per_round: list[tuple[float, float]], rng: np.random.Generator) -> dict:
    """Per engine: the median [95% interval], GB/s, GFLOP/s, the roofline and phase-floor shares over rounds (each
    pass against its round's ceilings, per_round) with 95% intervals and at the run's ceilings; the ratios moespec /
    llama.cpp."""
    floor, phases = floors(w, gbps, gflops)
    out: dict[str, Any] = {"floor_s": floor, "phase_floor_s": phases,
                           "bound": "memory" if w["bytes"] / gbps >= w["flops"] / gflops else "compute",
                           "engines": {}, "ratio": {}}
    round_floors = [floors(w, *c) for c in per_round]  # [rounds] (floor, phase floor) at the round's ceilings
    for engine, times in samples.items():
        med, lo, hi = bootstrap_median(times, rng)
        share = bootstrap_median([f / t for (f, _), t in zip(round_floors, times)], rng)
        phase = bootstrap_median([p / t for (_, p), t in zip(round_floors, times)], rng)
        out["engines"][engine] = {"median_s": med, "lo_s": lo, "hi_s": hi, "gbps": w["bytes"] / med / 1e9,
                                  "gflops": w["flops"] / med / 1e9, "roofline_share": share[0],
                                  "roofline_share_ci": list(share[1:]), "phase_share": phase[0],
                                  "phase_share_ci": list(phase[1:]), "run_roofline_share": floor / med,
                                  "run_phase_share": phases / med}
    for engine in ENGINES[1:]:
        med, lo, hi = bootstrap_median([a / b for a, b in zip(samples[engine], samples[LLAMA])], rng)
        out["ratio"][engine] = {"median": med, "lo": lo, "hi": hi}
    return out


# ---- output ---------------------------------------------------------------------------------------------------
def print_report(result: dict) -> None:
    c = result["ceilings"]
    mm = c.get("matmul_dtype", "bf16")  # the compute ceiling's dtype (fp32 where torch has no bf16 GEMM)
    print(f"ceilings ({result['threads']} threads): streaming read {c['stream_gbps']:.2f} GB/s (before "
          f"{c['stream_before_gbps']:.2f}, after {c['stream_after_gbps']:.2f}); {mm} matmul {c['matmul_gflops']:.0f} "
          f"GFLOP/s (before {c['matmul_before_gflops']:.0f}, after {c['matmul_after_gflops']:.0f})")
    stream, matmul = ([r[key] for r in c["per_round"]] for key in ("stream_gbps", "matmul_gflops"))
    print(f"ceilings per round: streaming read {min(stream):.1f}-{max(stream):.1f} GB/s (median "
          f"{np.median(stream):.1f}), {mm} matmul {min(matmul):.0f}-{max(matmul):.0f} GFLOP/s")
    print(f"moespec: dense {result['moespec']['dense']}, batched pass {result['moespec']['pass_kind']}, weights, "
          f"caches and the ceiling's buffer in {result['moespec']['pages']}; routing: "
          "random weights, routed as they route (the unions are moespec's routing of each cell's tokens)")
    print(f"\nverify pass of B sequences x n tokens at depth {result['depth']}, ms: median [95% interval] over "
          f"{result['rounds']} interleaved rounds; ratio = moespec / llama.cpp, median of per-round ratios")
    print(f"{'B':>3}{'n':>3}  " + "".join(f"{e:<26}" for e in ENGINES)
          + "".join(f"{e.split()[1] + ' / llama.cpp':>21}" for e in ENGINES[1:]))
    for cell in result["cells"]:
        s = cell["stats"]
        ms = lambda e: (f"{s['engines'][e]['median_s'] * 1e3:.2f} [{s['engines'][e]['lo_s'] * 1e3:.2f}, "
                        f"{s['engines'][e]['hi_s'] * 1e3:.2f}]")
        ratio = lambda e: f"{s['ratio'][e]['median']:.2f} [{s['ratio'][e]['lo']:.2f}, {s['ratio'][e]['hi']:.2f}]"
        print(f"{cell['B']:>3}{cell['n']:>3}  " + "".join(f"{ms(e):<26}" for e in ENGINES)
              + "".join(f"{ratio(e):>21}" for e in ENGINES[1:]))
    print("\nwork per pass: MB = dense + union of experts (sum over layers, of N each) + KV caches, 1e6 B; GFLOP = "
          "2 x parameters per token x B n; floor = max(MB / read ceiling, GFLOP / matmul peak); phases = the sum of "
          "the dense, expert and cache phases' own floors (both at the run's ceilings); per engine GB/s, GFLOP/s, "
          "% of the floor (roofline share) and % of the phase floor, each pass against the ceilings sampled around "
          "its round: median over rounds")
    print(f"{'B':>3}{'n':>3}{'union':>7}{'MB':>8}{'GFLOP':>8}{'floor':>9}{'phases':>9}{'bound':>8}  "
          + "".join(f"{e:>26}" for e in ENGINES))
    print(" " * 55 + "".join(f"{'GB/s GFLOP/s share phase':>26}" for _ in ENGINES))
    for cell in result["cells"]:
        w, s = cell["work"], cell["stats"]
        rate = lambda e: (f"{s['engines'][e]['gbps']:.1f} {s['engines'][e]['gflops']:.0f} "
                          f"{100 * s['engines'][e]['roofline_share']:.0f}% {100 * s['engines'][e]['phase_share']:.0f}%")
        print(f"{cell['B']:>3}{cell['n']:>3}{sum(w['unions']):>7}{w['bytes'] / 1e6:8.0f}{w['flops'] / 1e9:8.2f}"
              f"{s['floor_s'] * 1e3:7.2f}ms{s['phase_floor_s'] * 1e3:7.2f}ms{s['bound']:>8}  "
              + "".join(f"{rate(e):>26}" for e in ENGINES))


# ---- main -----------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/batch-pass.json", help="the result JSON (default %(default)s)")
    p.add_argument("--batches", default="1,2,4,8", help="sequences per pass, B (default %(default)s)")
    p.add_argument("--n", default="1,2,4,9", help="tokens per sequence in a pass (default %(default)s)")
    p.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default %(default)s)")
    p.add_argument("--depth", type=int, default=DEPTH, help="context depth of every sequence (default %(default)s)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help="threads of both engines and the ceilings (default: torch's, %(default)s)")
    p.add_argument("--layers", type=int, default=2, help=f"decoder layers of {MODEL} (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the random weights' and tokens' seed (default %(default)s)")
    p.add_argument("--work", default=str(default_work()), help="where the GGUF is cached (default %(default)s)")
    args = p.parse_args(argv)
    for flag, value, least, most in (("--rounds", args.rounds, 2, None), ("--depth", args.depth, 1, DEPTH_LIMIT),
                                     ("--threads", args.threads, 1, THREADS_LIMIT), ("--layers", args.layers, 1, None),
                                     ("--seed", args.seed, 0, None)):
        if value < least or (most is not None and value > most):
            raise MoespecError(f"{flag} must lie in {least}..{most or 'any'}, got {value}")
    args.batches = parse_ints(args.batches, "--batches", 1, BATCH_LIMIT, "sequences per pass")
    args.n = parse_ints(args.n, "--n", 1, N_MAX, "tokens per sequence")
    check_output(args.out)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    bindings()  # llama-cpp-python absent: one line, before any work
    torch.set_num_threads(args.threads)
    started = provenance("cpu", FORMAT) | {"command": shlex.join([sys.executable, *sys.argv]),
                                           "load_average_before": os.getloadavg()}
    work_dir = Path(args.work).expanduser()
    work_dir.mkdir(parents=True, exist_ok=True)
    gguf = export_gguf(argparse.Namespace(gguf=None, layers=args.layers, seed=args.seed), work_dir)
    lm = load_model(preset=MODEL, layers=args.layers, dtype=FORMAT, seed=args.seed)
    vocab, most, longest = lm.model.config.vocab_size, max(args.batches), max(args.n)
    rng = np.random.default_rng(args.seed)
    contexts = rng.integers(3, vocab, size=(most, args.depth)).tolist()
    tokens = {(b, n): np.random.default_rng([args.seed, b, n]).integers(3, vocab, size=(b, n)).tolist()
              for b in args.batches for n in args.n}

    timer = CpuTimer()
    ceilings = {"stream_before": measure_stream_read(threads=args.threads),
                "matmul_before": matmul_peak(timer, torch.bfloat16)}
    say(f"prefill: {most} sequences of {args.depth} tokens in each engine")
    ours = Moespec(lm, contexts)
    theirs = Llama(gguf, contexts, args.depth + longest, args.threads, max(LLAMA_N_BATCH, most * longest))
    try:
        unions = {cell: ours.unions(ids) for cell, ids in tokens.items()}
        for ids in tokens.values():  # every engine's untimed first pass (the tap kept dedup's off the lean path)
            for policy in POLICIES:
                ours.time(policy, ids, timer.flush)
            theirs.time(ids, timer.flush)
        passes = [(engine, cell) for cell in tokens for engine in ENGINES]
        samples: dict[tuple, list[float]] = {p: [] for p in passes}
        read = StreamRead(threads=args.threads)
        at_rounds = [round_sample(read, timer)]
        for r in range(args.rounds):
            shift = r * len(passes) // args.rounds
            for engine, cell in passes[shift:] + passes[:shift]:
                samples[engine, cell].append(theirs.time(tokens[cell], timer.flush) if engine == LLAMA else
                                             ours.time(engine.split()[1], tokens[cell], timer.flush))
            at_rounds.append(round_sample(read, timer))
            say(f"round {r + 1}/{args.rounds} ({time.perf_counter() - began:.0f} s; {at_rounds[-1]['stream'][0]:.0f} "
                f"GB/s)")
    finally:
        theirs.close()
    ceilings |= {"stream_after": measure_stream_read(threads=args.threads),
                 "matmul_after": matmul_peak(timer, torch.bfloat16)}

    gbps = float(np.median(ceilings["stream_before"] + ceilings["stream_after"]))
    gflops = float(np.median(ceilings["matmul_before"] + ceilings["matmul_after"]))
    per_token, per_round = ours.parameters_per_token(), round_ceilings(at_rounds)
    cells = []
    for (b, n), ids in tokens.items():
        w = work(lm, b, n, args.depth, unions[b, n], per_token)
        times = {engine: samples[engine, (b, n)] for engine in ENGINES}
        cells.append({"B": b, "n": n, "work": w, "stats": cell_stats(times, w, gbps, gflops, per_round, rng),
                      "samples_s": times})
    result = {
        "format": "moespec-batch-pass", "format_version": 3, "out": args.out,
        "provenance": started | {"device": timer.name, "load_average_after": os.getloadavg(),
                                 "versions": started["versions"] | {"llama-cpp-python": version("llama-cpp-python")}},
        "model": lm.spec.to_dict(), "dtype": FORMAT, "gguf": str(gguf.resolve()), "depth": args.depth,
        "batches": args.batches, "n": args.n, "rounds": args.rounds, "threads": args.threads, "seed": args.seed,
        "engines": list(ENGINES), "parameters_per_token": sum(per_token),
        "parameters_per_token_dense_experts": list(per_token),
        "moespec": {"dense": ours.dense, "pass_kind": batch_pass_kind(lm.model, tokens[most, longest],
                                                                     ours.caches[:most]),
                    "pages": pages.placement()},
        "llama_cpp": {"timing": "one llama_decode of B n tokens (each with its sequence id and position, every "
                                "logit) to llama_synchronize, then llama_memory_seq_rm per sequence",
                      "n_seq_max": most, "positions_per_sequence": args.depth + longest},
        "routing": "random weights, routed as they route; unions: moespec's routing of each cell's tokens",
        "ceilings": {"stream_gbps": gbps, "matmul_gflops": gflops,
                     "matmul_dtype": str(matmul_dtype(torch.bfloat16, "cpu")).removeprefix("torch."),
                     "stream_before_gbps": float(np.median(ceilings["stream_before"])),
                     "stream_after_gbps": float(np.median(ceilings["stream_after"])),
                     "matmul_before_gflops": float(np.median(ceilings["matmul_before"])),
                     "matmul_after_gflops": float(np.median(ceilings["matmul_after"])), "samples": ceilings,
                     "rounds": at_rounds, "per_round": [{"stream_gbps": g, "matmul_gflops": f} for g, f in per_round]},
        "wall_s": time.perf_counter() - began,
        "cells": cells,
    }
    write_json(args.out, result)
    print_report(result)
    say(f"wrote {args.out} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MoespecError as err:
        print(f"batch_pass: {err}", file=sys.stderr)
        sys.exit(2)
