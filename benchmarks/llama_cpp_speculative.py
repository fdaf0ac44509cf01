"""llama.cpp's own speculative decoding beside moespec's loop over llama.cpp, on the same target and draft GGUF
(issue 15): the same prompt, greedy, a fixed draft length k = 1..8, interleaved round by round.

Physics. A speculative step drafts k tokens with the draft model (k of its passes), verifies them in one target
pass of k + 1 tokens and keeps the agreeing prefix, so a step costs V(k) = tau(k + 1) + k h + host time and yields
G(k) = 1 + a_1 + a_1 a_2 + ... tokens. Both loops below run the same llama.cpp passes; what differs is the host
time around them: llama.cpp's loop (`common/speculative.cpp`, what `llama-server --model-draft` runs; here its
`llama-speculative-simple` example) is C++, moespec's (`moespec.model.speculative.decode_steps` over
`moespec.model.llama_cpp.LlamaContext`, what `moespec run --engine llama.cpp --draft-gguf` runs) is Python over
llama.cpp's C API. Where their tokens/s agree, `run --engine llama.cpp` measures llama.cpp's own speculative
throughput; the difference is the Python loop's overhead.

What it does. Per round, per k in an order rotated each round:
- llama.cpp: `llama-speculative-simple -m TARGET -md DRAFT -p PROMPT -n TOKENS --spec-type draft-simple
  --spec-draft-n-max k --spec-draft-n-min 0 --spec-draft-p-min 0 --temp 0 -t THREADS` (a child process; it loads
  both models, so only its own "decoded N tokens in S seconds" line is read, with n_drafted and n_accept);
- moespec: the prompt's llama.cpp tokens (the same tokenizer), one prefilled target context and draft context,
  then `run --engine llama.cpp`'s own cell (measure.llama_run.decode_cell: decode_steps with GreedyDraft) for
  TOKENS tokens; tokens/s: the steps' emitted tokens over their time.
Plain decoding (k = 0) is moespec's loop at k = 0 beside `llama-bench -p 0 -n TOKENS` (llama.cpp's token
generation). The streaming-read ceiling is measured before, between the rounds and after. Medians over rounds
with [min, max]; the ratio moespec / llama.cpp per k.

    .venv/bin/python benchmarks/llama_cpp_speculative.py --target T.gguf --draft D.gguf --bin BUILD/bin
        [--k 1-8] [--tokens 64] [--rounds 3] [--threads 2] --out out/llama-cpp-speculative.json

It prints the ceiling, then the table, and ends with one JSON line; --out receives every sample, device, dtype,
versions, timestamp and the exact command. llama-speculative-simple and llama-bench come from llama.cpp's source
(`cmake -DLLAMA_BUILD_EXAMPLES=ON`, targets llama-speculative-simple and llama-bench; the tree llama-cpp-python
vendors); where they are missing, one line says so and the program exits 2.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from moespec import MoespecError
from moespec.cli.args import parse_ints
from moespec.formats.files import provenance, write_json
from moespec.measure.llama_run import Prompt, decode_cell
from moespec.measure.timing import measure_stream_read
from moespec.model.gguf import read_gguf
from moespec.model.llama_cpp import LlamaContext, tokenize

PROMPT = ("The history of the river valley begins with the first farmers, who cleared the forest along its banks "
          "and built their houses from the stones of the hills. Over the centuries the villages grew into towns")
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
COUNT = re.compile(r"n_(drafted|accept)\s*=\s*(\d+)")
CONTEXT = 1024  # both loops' context: the prompt, the tokens and the longest draft past them
MAX_K = 16  # the longest --k


def llama_speculative(binary: Path, args: argparse.Namespace, k: int) -> dict:
    """One run of llama.cpp's own loop: tokens/s of its decode phase, drafted and accepted tokens."""
    cmd = [str(binary), "-m", args.target, "-md", args.draft, "-p", PROMPT, "-n", str(args.tokens),
           "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", "0", "--temp", "0", "-t", str(args.threads), "-c", str(CONTEXT), "--seed", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
    text = proc.stdout + proc.stderr
    found = DECODED.search(text)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"llama-speculative-simple failed ({proc.returncode}): {text.strip()[-400:]}")
    counts = {name: int(v) for name, v in COUNT.findall(text)}
    return {"tokens": int(found.group(1)), "seconds": float(found.group(2)),
            "tokens_per_s": int(found.group(1)) / float(found.group(2)), **counts}


def llama_plain(bench: Path, args: argparse.Namespace) -> dict:
    """llama.cpp's token generation (llama-bench -p 0 -n TOKENS), its tokens/s."""
    cmd = [str(bench), "-m", args.target, "-p", "0", "-n", str(args.tokens), "-t", str(args.threads), "-r", "1",
           "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    row = json.loads(proc.stdout)[0]
    return {"tokens": args.tokens, "tokens_per_s": float(row["avg_ts"])}


class Ours:
    """moespec's loop over llama.cpp (`run --engine llama.cpp --draft-gguf`'s: measure.llama_run.Prompt and
    decode_cell): one target and one draft context, the prompt prefilled in both."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.target = LlamaContext(args.target, CONTEXT, args.threads)
        self.draft = LlamaContext(args.draft, CONTEXT, args.threads)
        ids = tokenize(self.target.api, self.target.vocab, PROMPT, args.target)
        self.prompt = Prompt(ids, self.target, self.draft, args.tokens + MAX_K + 1)  # plain decoding's, kept
        self.tokens = args.tokens

    def run(self, k: int) -> dict:
        steps = decode_cell(self.prompt, 0, k, None, 0, self.tokens)["steps"]  # [drafted, accepted, v, s, d, h]
        seconds = sum(step[3] for step in steps)
        tokens = sum(step[1] + 1 for step in steps)
        return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                "drafted": sum(step[0] for step in steps), "accept": sum(step[1] for step in steps)}

    def close(self) -> None:
        self.draft.close()
        self.target.close()


def summary(rows: list[dict]) -> dict:
    rates = [r["tokens_per_s"] for r in rows]
    drafted = sum(r.get("drafted", 0) for r in rows)
    return {"tokens_per_s": float(np.median(rates)), "min": min(rates), "max": max(rates),
            "acceptance": sum(r.get("accept", 0) for r in rows) / drafted if drafted else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="the target GGUF")
    p.add_argument("--draft", required=True, help="the draft GGUF (same vocabulary)")
    p.add_argument("--bin", required=True, help="folder with llama-speculative-simple and llama-bench")
    p.add_argument("--k", default="1-8", help="draft lengths (default 1-8)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per run (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--threads", type=int, default=2, help="threads of both loops (default 2)")
    p.add_argument("--out", default="out/llama-cpp-speculative.json")
    args = p.parse_args(argv)
    try:
        ks = parse_ints(args.k, "--k", 1, MAX_K, "draft lengths")
        binary, bench = Path(args.bin) / "llama-speculative-simple", Path(args.bin) / "llama-bench"
        for path in (binary, bench, Path(args.target), Path(args.draft)):
            if not path.is_file():
                raise ValueError(f"{path} does not exist (see the module docstring for how to build it)")
        if args.tokens < 8 or args.rounds < 1 or args.threads < 1:
            raise ValueError("--tokens must be >= 8, --rounds and --threads >= 1")
        fmt = read_gguf(args.target).expert_format()
    except (ValueError, MoespecError) as e:
        print(f"llama_cpp_speculative: {e}", file=sys.stderr)
        return 2
    started, clock = provenance("cpu", fmt), time.perf_counter()
    ceilings = {"before": float(np.median(measure_stream_read()))}
    print(f"ceiling before: {ceilings['before']:.1f} GB/s")
    ours = Ours(args)
    samples: dict[str, dict[int, list[dict]]] = {"llama.cpp": {k: [] for k in [0, *ks]},
                                                 "moespec": {k: [] for k in [0, *ks]}}
    between = []
    try:
        for r in range(args.rounds):
            order = [0, *ks]
            order = order[r % len(order):] + order[:r % len(order)]
            for k in order:
                theirs = llama_plain(bench, args) if k == 0 else llama_speculative(binary, args, k)
                samples["llama.cpp"][k].append(theirs)
                samples["moespec"][k].append(ours.run(k))
            between.append(float(np.median(measure_stream_read())))
            print(f"round {r + 1}/{args.rounds} done; ceiling {between[-1]:.1f} GB/s", flush=True)
    finally:
        ours.close()
    ceilings |= {"between": between, "after": float(np.median(measure_stream_read()))}
    table = {engine: {str(k): summary(rows) for k, rows in by_k.items()} for engine, by_k in samples.items()}
    print(f"ceiling after: {ceilings['after']:.1f} GB/s")
    print(f"{'k':>2}  {'llama.cpp t/s':>22}  {'accept':>6}  {'moespec t/s':>22}  {'accept':>6}  moespec/llama.cpp")
    for k in [0, *ks]:
        a, b = table["llama.cpp"][str(k)], table["moespec"][str(k)]
        acc = lambda s: "-" if s["acceptance"] is None else f"{s['acceptance']:.3f}"  # noqa: E731
        print(f"{k:>2}  {a['tokens_per_s']:7.1f} [{a['min']:6.1f}, {a['max']:6.1f}]  {acc(a):>6}  "
              f"{b['tokens_per_s']:7.1f} [{b['min']:6.1f}, {b['max']:6.1f}]  {acc(b):>6}  "
              f"{b['tokens_per_s'] / a['tokens_per_s']:.3f}")
    result = {"program": "llama_cpp_speculative", "target": args.target, "draft": args.draft, "format": fmt,
              "tokens": args.tokens, "rounds": args.rounds, "threads": args.threads, "prompt": PROMPT,
              "ceiling_gbps": ceilings, "table": table,
              "samples": {e: {str(k): v for k, v in by_k.items()} for e, by_k in samples.items()},
              "provenance": started, "elapsed_s": time.perf_counter() - clock}
    write_json(args.out, result)
    ratio = {k: round(table["moespec"][k]["tokens_per_s"] / table["llama.cpp"][k]["tokens_per_s"], 3)
             for k in table["moespec"]}
    print(json.dumps({"program": result["program"], "out": args.out, "ratio": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
