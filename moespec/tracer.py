"""`moespec trace`: record which experts a real MoE checkpoint routes every token to.

Physics first. Deduplication pays off only when consecutive tokens reuse experts, and how much they reuse
is a property of the model's router on real text, not of the architecture. So we teacher-force text
through the model exactly as a verification pass would see it (each token attends to every earlier token
of its document) and write down, for every token and MoE layer, the m experts the router selected and the
router weights it gave them. A trace is the only model-specific input the byte accounting needs.

How the selection is captured. Every supported transformers v5 class computes routing in one router module
that returns (router_logits, top-k weights, top-k indices), and the experts consume exactly those indices:
OlmoeTopKRouter, Qwen3MoeTopKRouter and MixtralTopKRouter take the top-m of softmax(logits) (Mixtral and
Qwen3 with norm_topk_prob renormalize the weights); GptOssTopKRouter takes the top-m of the biased logits
and softmaxes the selected ones; DeepseekV2TopkRouter takes the top-m of softmax(logits), after masking
all but the best `topk_group` expert groups when topk_method is group_limited_greedy, and scales the
weights by routed_scaling_factor. A forward hook on each router module records its indices and weights as
the model computed them, so no selection rule is re-implemented here (output_router_logits would give the
logits alone; the tests re-derive the selection from those, class by class, and compare). Dense layers
(DeepSeek's first, Qwen3's mlp_only_layers) have no router and are not recorded. Within a token, ids are
stored by decreasing weight (DeepSeek's top-k is unsorted).

Documents. WikiText raw files are split at top-level headings (a line " = Title = "; " = = Sub = = " does
not split); a JSONL file gives one document per record, from a string field or a list of strings (MT-Bench
"turns", joined by blank lines). Each document is tokenized with the checkpoint's own tokenizer and fed in
chunks of --chunk tokens, the KV cache carried across chunks, so long documents fit in memory.

Resumable. Finished documents are kept in OUT.partial/ (one npz each plus state.json naming the inputs);
rerunning the same command skips them. The final trace is written atomically and the folder removed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.io import atomic_write, provenance, write_json
from moespec.spec import ModelSpec

STATE_VERSION = 1  # layout of OUT.partial/state.json
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # --dtype -> torch dtype; fp32 default: no near-tie flips
HASH_CHARS = 16  # hex digits of sha256 kept in source and tokenizer ids: collisions are not a concern
_HEADING = re.compile(r"= (?!=).*(?<!=) =")  # a stripped top-level WikiText heading line, "= Title ="


# -- documents ---------------------------------------------------------------------------------------
def split_wikitext(text: str) -> list[str]:
    """Documents of a WikiText raw text: each top-level heading starts one; text before the first is its own."""
    docs: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if _HEADING.fullmatch(line.strip()):
            docs.append([])
        docs[-1].append(line)
    return [d for d in ("".join(lines) for lines in docs) if d.strip()]


def read_jsonl(path: Path, field: str) -> list[str]:
    """One document per JSONL record: `field` is a string or a list of strings (joined by blank lines)."""
    docs = []
    for number, line in enumerate(_read_text(path, "--jsonl").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise MoespecError(f"--jsonl {path}:{number}: not JSON ({e.msg})") from None
        value = record.get(field) if isinstance(record, dict) else None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = "\n\n".join(value)
        if not isinstance(value, str):
            raise MoespecError(f"--jsonl {path}:{number}: field {field!r} missing or not a string / list of strings")
        if value.strip():
            docs.append(value)
    return docs


def _read_text(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MoespecError(f"{flag} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise MoespecError(f"{flag} {path}: cannot read as UTF-8 text ({e})") from None


def load_documents(args: argparse.Namespace) -> tuple[list[str], str]:
    """The documents and a source id (file name, sha256 prefix, and the JSONL field)."""
    if args.jsonl is not None:
        path, flag = Path(args.jsonl), "--jsonl"
        docs = read_jsonl(path, args.field)
    else:
        path, flag = Path(args.text), "--text"
        docs = split_wikitext(_read_text(path, flag))
    if not docs:
        raise MoespecError(f"{flag} {path}: no documents (the file is empty or only whitespace)")
    source = f"{path.name}:{_sha256_file(path)[:HASH_CHARS]}"
    return docs, source + (f"#{args.field}" if args.jsonl is not None else "")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenize(tokenizer: Any, docs: list[str], max_tokens: int | None) -> list[np.ndarray]:
    """Token ids per document with the checkpoint's tokenizer, truncated to max_tokens in all."""
    out: list[np.ndarray] = []
    left = max_tokens
    for doc in docs:
        ids = np.asarray(tokenizer(doc)["input_ids"], dtype=np.int64)
        if left is not None:
            ids, left = ids[:left], left - min(left, ids.size)
        if ids.size:
            out.append(ids)
        if left == 0:
            break
    return out


def tokenizer_id(tokenizer: Any) -> str:
    """Class, vocabulary size and a hash of the vocabulary: identical ids mean identical tokenization tables."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    return f"{type(tokenizer).__name__}:{len(tokenizer)}:{hashlib.sha256(vocab).hexdigest()[:HASH_CHARS]}"


# -- the model and its routers -----------------------------------------------------------------------
def load_model(path: Path, dtype: str, device: str) -> tuple[Any, Any, ModelSpec]:
    """Tokenizer, model (eval mode, on `device`) and spec of a local checkpoint; never touches the hub."""
    from moespec import engine  # imports torch and transformers, and this module

    loaded = engine.load_model(path=str(path), dtype=dtype, device=device)
    if loaded.tokenizer is None:
        raise MoespecError(f"--model {path}: the checkpoint has no tokenizer; tracing text needs one")
    return loaded.tokenizer, loaded.model, loaded.spec


def find_routers(model: Any, spec: ModelSpec) -> list[Any]:
    """The router module of each MoE layer, in layer order: the class transformers itself records
    router_logits from (`_can_record_outputs`), else any module class named *TopKRouter."""
    recorder = getattr(model, "_can_record_outputs", {}).get("router_logits")
    target = getattr(recorder, "target_class", None)
    routers = [m for m in model.modules()
               if (isinstance(m, target) if target else re.search(r"TopKRouter$", type(m).__name__, re.I))]
    if len(routers) != spec.L:
        raise MoespecError(f"{type(model).__name__}: found {len(routers)} router modules, expected one per MoE "
                           f"layer ({spec.L}); this model class or transformers version is not supported")
    return routers


class RouterTap:
    """Forward hooks that keep each router's (top-k indices, top-k weights) of the current forward pass."""

    def __init__(self, routers: list[Any], top_k: int) -> None:
        self.top_k = top_k
        self.calls: list[list[tuple[Any, Any]]] = [[] for _ in routers]
        self.handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(routers)]

    def _hook(self, layer: int):
        def record(module: Any, inputs: Any, output: Any) -> None:
            if not (isinstance(output, tuple) and len(output) == 3 and output[2].shape[-1] == self.top_k):
                raise MoespecError(f"{type(module).__name__} did not return (logits, top-{self.top_k} weights, "
                                   "top-k indices); this transformers version is not supported")
            self.calls[layer].append((output[2].detach(), output[1].detach()))
        return record

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """ids [T, L, m] and weights [T, L, m] recorded since the last take, ids by decreasing weight."""
        ids = np.stack([np.concatenate([i.cpu().numpy() for i, _ in c]) for c in self.calls], axis=1)
        weights = np.stack([np.concatenate([w.float().cpu().numpy() for _, w in c]) for c in self.calls], axis=1)
        self.calls = [[] for _ in self.calls]
        order = np.argsort(-weights, axis=-1, kind="stable")
        return np.take_along_axis(ids, order, -1), np.take_along_axis(weights, order, -1).astype(np.float32)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def trace_document(model: Any, tap: RouterTap, ids: np.ndarray, chunk: int, device: str) -> tuple[np.ndarray, ...]:
    """Teacher-force one document in chunks, carrying the KV cache; the routing of every token."""
    import inspect

    import torch

    from moespec.engine import cache_argument

    cache_arg = cache_argument(model)
    # skip the full-vocabulary head
    extra = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    cache = None
    with torch.inference_mode():
        for start in range(0, ids.size, chunk):
            piece = torch.as_tensor(ids[start:start + chunk], device=device)[None]
            out = model(input_ids=piece, use_cache=True, **{cache_arg: cache}, **extra)
            cache = out.get(cache_arg)
    experts, weights = tap.take()
    if experts.shape[0] != ids.size:
        raise MoespecError(f"routers saw {experts.shape[0]} tokens for a document of {ids.size}")
    return experts, weights


# -- resumable run -----------------------------------------------------------------------------------
class Checkpoint:
    """OUT.partial/: state.json (the run's inputs) and doc_NNNNNN.npz for every finished document."""

    def __init__(self, out: Path, key: dict[str, Any], lengths: list[int]) -> None:
        self.folder = out.with_name(out.name + ".partial")
        self.key, self.lengths = key, lengths
        state_file = self.folder / "state.json"
        if state_file.is_file():
            try:
                state = json.loads(state_file.read_text())
            except (OSError, json.JSONDecodeError):
                state = None
            if not isinstance(state, dict) or state.get("version") != STATE_VERSION or state.get("key") != key \
                    or state.get("lengths") != lengths:
                raise MoespecError(f"{self.folder} holds an unfinished run with other inputs; "
                                   "rerun that command, or delete the folder to start over")
        else:
            write_json(state_file, {"version": STATE_VERSION, "key": key, "lengths": lengths})

    def _file(self, doc: int) -> Path:
        return self.folder / f"doc_{doc:06d}.npz"

    def load(self, doc: int) -> tuple[np.ndarray, np.ndarray] | None:
        """A finished document's (ids, weights), or None if it still has to be traced."""
        try:
            with np.load(self._file(doc)) as f:
                experts, weights = f["experts"], f["weights"]
        except (OSError, KeyError, ValueError):
            return None
        return (experts, weights) if experts.shape[0] == self.lengths[doc] else None

    def save(self, doc: int, experts: np.ndarray, weights: np.ndarray) -> None:
        def write(tmp: Path) -> None:
            with tmp.open("wb") as f:
                np.savez(f, experts=experts, weights=weights)
        atomic_write(self._file(doc), write)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _model_id(path: Path) -> str:
    """sha256 prefix of config.json plus the weight files' names and sizes (hashing GBs of weights is slow)."""
    digest = hashlib.sha256((path / "config.json").read_bytes())
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        digest.update(f"{f.name}:{f.stat().st_size}".encode())
    return digest.hexdigest()[:HASH_CHARS]


def _progress():
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    return Progress(TextColumn("tracing"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens {task.fields[rate]}"),
                    TimeRemainingColumn(), console=console, disable=not console.is_terminal)


# -- command -----------------------------------------------------------------------------------------
def _positive(text: str) -> int:
    value = int(text) if text.lstrip("-").isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face checkpoint folder (no hub access)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="raw text; WikiText top-level headings ' = Title = ' start documents")
    source.add_argument("--jsonl", help="JSONL file, one document per record")
    parser.add_argument("--field", default="text", help="JSONL key: a string or a list of strings (default text)")
    parser.add_argument("--out", required=True, help="trace file to write (.npz)")
    parser.add_argument("--max-tokens", type=_positive, default=None, help="stop after this many tokens in all")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="compute dtype (default fp32)")
    parser.add_argument("--chunk", type=_positive, default=512, help="tokens per forward pass (default 512)")


def run(args: argparse.Namespace) -> int:
    from moespec.trace import Trace

    docs, source = load_documents(args)
    model_path, out = Path(args.model), Path(args.out)
    tokenizer, model, spec = load_model(model_path, args.dtype, args.device)
    token_ids = tokenize(tokenizer, docs, args.max_tokens)
    if not token_ids:
        raise MoespecError(f"{args.text or args.jsonl}: the documents tokenize to no tokens")
    tok_id = tokenizer_id(tokenizer)
    key = {"model": _model_id(model_path), "source": source, "tokenizer": tok_id, "max_tokens": args.max_tokens,
           "chunk": args.chunk, "dtype": args.dtype}
    lengths = [int(ids.size) for ids in token_ids]
    routers = find_routers(model, spec)  # before the checkpoint folder exists: a refusal leaves nothing behind
    checkpoint = Checkpoint(out, key, lengths)
    tap = RouterTap(routers, spec.m)
    results: list[tuple[np.ndarray, np.ndarray]] = []
    traced, start = 0, time.perf_counter()
    try:
        with _progress() as progress:
            task = progress.add_task("trace", total=sum(lengths), rate="")
            for doc, ids in enumerate(token_ids):
                done = checkpoint.load(doc)
                if done is None:
                    done = trace_document(model, tap, ids, args.chunk, args.device)
                    checkpoint.save(doc, *done)
                    traced += ids.size
                results.append(done)
                rate = traced / max(time.perf_counter() - start, 1e-9)
                progress.update(task, advance=ids.size, rate=f"{rate:,.0f}/s")
    except KeyboardInterrupt:
        print(f"moespec trace: finished documents kept in {checkpoint.folder}; rerun to resume", file=sys.stderr)
        raise
    finally:
        tap.close()
    elapsed = time.perf_counter() - start
    meta = {"model": spec.name, "model_type": spec.model_type, "spec": spec.to_dict(), "source": source,
            "tokenizer": tok_id, "synthetic": False, "max_tokens": args.max_tokens, "chunk": args.chunk,
            "provenance": provenance(args.device, args.dtype)}
    trace = Trace.from_arrays(np.concatenate([e for e, _ in results]), np.cumsum([0, *lengths]), spec.N,
                              weights=np.concatenate([w for _, w in results]), meta=meta)
    trace.save(out)
    checkpoint.remove()
    total = sum(lengths)
    print(f"traced {total} tokens in {len(lengths)} documents ({spec.L} MoE layers, m={spec.m}) "
          f"at {traced / max(elapsed, 1e-9):,.0f} tokens/s -> {out}")
    return 0
