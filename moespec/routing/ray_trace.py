"""`moespec trace --ray ADDRESS`: the documents traced by Ray workers (moespec.cluster), each holding the model once.

The driver holds no model: a worker tokenizes the documents and names the model and its tokenizer, then every
worker takes documents one at a time (a GPU each on CUDA, `--threads` CPUs each otherwise) and returns their
routing, which the tracer checkpoints as each arrives (moespec.routing.tracer). A worker that dies is restarted by
Ray and its document traced again; a rerun skips the documents already checkpointed, whichever path traced them.
Each document is traced by the same code on the same model and threads as in one process, so the merged trace is
the single-process trace, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from moespec import MoespecError
from moespec.cluster import call, cluster_cpus, cluster_gpus, each, workers
from moespec.model.spec import ModelSpec


class TraceWorker:
    """One routing source (a checkpoint or a GGUF, built by `open_source(config)`) in a Ray worker."""

    def __init__(self, config: Any, open_source: Callable[[Any], Any], threads: int) -> None:
        torch.set_num_threads(threads)
        self.source = open_source(config)

    def describe(self) -> dict[str, Any]:
        s = self.source
        return {"spec": s.spec.to_dict(), "model_id": s.model_id(), "tokenizer_id": s.tokenizer_id()}

    def tokenize(self, docs: list[str], max_tokens: int | None) -> list[np.ndarray]:
        return self.source.tokenize(docs, max_tokens)

    def trace(self, doc: int, ids: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        return (doc, *self.source.trace_document(ids))


class RaySource:
    """The tracer's routing source with its work on the cluster `ray` (a connected ray module): one worker per GPU
    on CUDA, else one per `threads` of the cluster's CPUs, at most `most` (the documents)."""

    def __init__(self, config: Any, open_source: Callable[[Any], Any], ray: Any, threads: int, most: int) -> None:
        gpu = str(config.device).startswith("cuda")
        if gpu and not cluster_gpus(ray):
            raise MoespecError(f"--device {config.device}: the Ray cluster has no GPU")
        self.ray = ray
        count = min(max(1, most), cluster_gpus(ray) if gpu else max(1, cluster_cpus(ray) // threads))
        self.actors = workers(ray, TraceWorker, (config, open_source, threads), count, num_cpus=threads,
                              num_gpus=1 if gpu else 0)
        self.info = call(ray, self.actors[0], "describe")
        self.spec = ModelSpec.from_dict(self.info["spec"])

    def tokenize(self, docs: list[str], max_tokens: int | None) -> list[np.ndarray]:
        return call(self.ray, self.actors[0], "tokenize", docs, max_tokens)

    def trace_documents(self, todo: Iterable[tuple[int, np.ndarray]]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(document index, experts, weights) of every (index, token ids) of `todo`, as each finishes."""
        yield from each(self.ray, self.actors, "trace", todo)

    def model_id(self) -> str:
        return self.info["model_id"]

    def tokenizer_id(self) -> str:
        return self.info["tokenizer_id"]

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
