"""Recording which experts a real MoE checkpoint routes every token to.

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

Documents (moespec.routing.documents) are tokenized with the checkpoint's own tokenizer and fed in chunks of
`chunk` tokens, the KV cache carried across chunks, so long documents fit in memory.

Resumable. Finished documents are kept in OUT.partial/ (moespec.formats.checkpoint: one npz each plus state.json
naming the inputs); rerunning the same command skips them (`fresh` drops them). The final trace is written
atomically and the folder removed; OUT is locked meanwhile (moespec.formats.lock).
"""

from __future__ import annotations

import hashlib
import inspect
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from moespec import MoespecError
from moespec.cluster import check_address, cluster_cpus, connected
from moespec.formats.checkpoint import Checkpoint
from moespec.formats.files import holds_outputs, provenance
from moespec.formats.trace import Trace
from moespec.model.load import cache_argument, find_routers, load_model, resolve_device
from moespec.routing.documents import HASH_CHARS, load_documents, tokenize, tokenizer_id
from moespec.routing.llama_tracer import GgufRouter
from moespec.routing.ray_trace import RaySource


@dataclass(frozen=True)
class TraceConfig:
    """What `trace` records: a local checkpoint (`model`) or a llama.cpp GGUF file (`gguf`, routed by llama.cpp itself:
    moespec.routing.llama_tracer), the documents of a raw text file or of a JSONL file's `field`, at most
    `max_tokens` tokens, fed `chunk` tokens per forward in `dtype` on `device` (a GGUF: in its own formats, on the
    CPU, `threads` threads; a checkpoint: torch's threads); written to `out`, checkpointed in OUT.partial/ (a rerun
    resumes it; `fresh` drops it); with `ray`, traced by workers on that Ray cluster (moespec.routing.ray_trace)."""

    model: str | None
    out: str
    text: str | None = None
    jsonl: str | None = None
    field: str = "text"
    max_tokens: int | None = None
    device: str = "cpu"
    dtype: str = "fp32"  # fp32 default: no near-tie flips of the router's choice
    chunk: int = 512
    fresh: bool = False
    gguf: str | None = None
    threads: int | None = None
    ray: str | None = None  # a Ray cluster's address (moespec.cluster): the documents traced by its workers


# -- the model and its routers -----------------------------------------------------------------------
def _load(path: Path, dtype: str, device: str) -> tuple[Any, Any, Any]:
    """Tokenizer, model (eval mode, on `device`) and spec of a local checkpoint; never touches the hub."""
    loaded = load_model(path=str(path), dtype=dtype, device=device)
    if loaded.tokenizer is None:
        raise MoespecError(f"--model {path}: the checkpoint has no tokenizer; tracing text needs one")
    return loaded.tokenizer, loaded.model, loaded.spec


class _Checkpoint:
    """A Hugging Face checkpoint as a routing source: the interface GgufRouter shares (spec, tokenize,
    trace_document, model_id, tokenizer_id, close)."""

    def __init__(self, config: TraceConfig) -> None:
        self.path, self.chunk, self.device = Path(config.model), config.chunk, config.device
        self.tokenizer, self.model, self.spec = _load(self.path, config.dtype, config.device)
        self.tap = RouterTap(find_routers(self.model, self.spec), self.spec.m)

    def tokenize(self, docs: list[str], max_tokens: int | None) -> list[np.ndarray]:
        return tokenize(lambda doc: self.tokenizer(doc)["input_ids"], docs, max_tokens)

    def trace_document(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return trace_document(self.model, self.tap, ids, self.chunk, self.device)

    def model_id(self) -> str:
        return _model_id(self.path)

    def tokenizer_id(self) -> str:
        return tokenizer_id(self.tokenizer)

    def close(self) -> None:
        self.tap.close()


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


def _model_id(path: Path) -> str:
    """sha256 prefix of config.json plus the weight files' names and sizes (hashing GBs of weights is slow)."""
    digest = hashlib.sha256((path / "config.json").read_bytes())
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        digest.update(f"{f.name}:{f.stat().st_size}".encode())
    return digest.hexdigest()[:HASH_CHARS]


def _progress() -> Progress:
    console = Console(stderr=True)
    return Progress(TextColumn("tracing"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens {task.fields[rate]}"),
                    TimeRemainingColumn(), console=console, disable=not console.is_terminal)


@dataclass(frozen=True)
class Traced:
    """A finished trace and how fast this call traced (documents resumed from a checkpoint are not counted)."""

    trace: Trace
    traced_tokens: int
    seconds: float


def open_source(config: TraceConfig) -> GgufRouter | _Checkpoint:
    """The routing source of `config`: its GGUF in llama.cpp, or its checkpoint with hooks on the routers."""
    return GgufRouter(config.gguf, config.chunk, config.threads or torch.get_num_threads()) if config.gguf \
        else _Checkpoint(config)


@holds_outputs(lambda config: [config.out])
def trace(config: TraceConfig) -> Traced:
    """Teacher-force the documents through the checkpoint, record every MoE layer's routing, write the trace to
    config.out (atomically, locked meanwhile) and return it. Finished documents are checkpointed in OUT.partial/:
    the same call after an interruption resumes; one with other inputs is refused (config.fresh drops them)."""
    resolve_device(config.device)
    if (config.model is None) == (config.gguf is None):
        raise MoespecError("trace: give a checkpoint (--model) or a GGUF file (--gguf), one of them")
    if config.gguf is not None and config.device != "cpu":
        raise MoespecError(f"--device {config.device}: a GGUF is traced by llama.cpp on the CPU here")
    if config.ray is not None:
        check_address(config.ray)
    docs, source = load_documents(config.text, config.jsonl, config.field)
    if config.ray is None:
        threads = torch.get_num_threads()
        if config.threads and config.gguf is None:  # the workers' threads, so both paths compute alike
            torch.set_num_threads(config.threads)
        try:  # routers found before the checkpoint folder exists: a refusal leaves nothing
            return _trace(config, docs, source, open_source(config))
        finally:
            torch.set_num_threads(threads)
    with connected(config.ray) as ray:
        threads = config.threads or min(torch.get_num_threads(), cluster_cpus(ray))
        return _trace(config, docs, source, RaySource(config, open_source, ray, threads, len(docs)))


def _trace(config: TraceConfig, docs: list[str], source: str, model: Any) -> Traced:
    """trace() with its routing source `model`: in this process, or a RaySource."""
    out = Path(config.out)
    spec, dtype = model.spec, "gguf" if config.gguf else config.dtype
    token_ids = model.tokenize(docs, config.max_tokens)
    if not token_ids:
        model.close()
        raise MoespecError(f"{config.text or config.jsonl}: the documents tokenize to no tokens")
    tok_id = model.tokenizer_id()
    lengths = [int(ids.size) for ids in token_ids]
    key = {"model": model.model_id(), "source": source, "tokenizer": tok_id, "max_tokens": config.max_tokens,
           "chunk": config.chunk, "dtype": dtype, "lengths": lengths}
    checkpoint = Checkpoint(out, key, "trace", config.fresh)
    traced, start = 0, time.perf_counter()
    results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    try:
        with checkpoint, _progress() as progress:
            task = progress.add_task("trace", total=sum(lengths), rate="")
            for doc, ids in enumerate(token_ids):
                unit = checkpoint.load_arrays(f"doc_{doc:06d}")
                if unit is not None and unit["experts"].shape[0] == ids.size:
                    results[doc] = unit["experts"], unit["weights"]
                    progress.update(task, advance=ids.size)
            todo = [(doc, ids) for doc, ids in enumerate(token_ids) if doc not in results]
            found = model.trace_documents(todo) if isinstance(model, RaySource) else \
                ((doc, *model.trace_document(ids)) for doc, ids in todo)
            for doc, experts, weights in found:
                checkpoint.save_arrays(f"doc_{doc:06d}", experts=experts, weights=weights)
                results[doc] = experts, weights
                traced += lengths[doc]
                rate = traced / max(time.perf_counter() - start, 1e-9)
                progress.update(task, advance=lengths[doc], rate=f"{rate:,.0f}/s")
    finally:
        model.close()
    meta = {"model": spec.name, "model_type": spec.model_type, "spec": spec.to_dict(), "source": source,
            "tokenizer": tok_id, "synthetic": False, "max_tokens": config.max_tokens, "chunk": config.chunk,
            "provenance": provenance(config.device, dtype)} | ({"gguf": str(config.gguf)} if config.gguf else {})
    ordered = [results[doc] for doc in range(len(lengths))]
    result = Trace.from_arrays(np.concatenate([e for e, _ in ordered]), np.cumsum([0, *lengths]), spec.N,
                               weights=np.concatenate([w for _, w in ordered]), meta=meta)
    result.save(out)
    checkpoint.remove()
    return Traced(result, traced, time.perf_counter() - start)
