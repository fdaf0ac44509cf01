"""`moespec reuse TRACE [TRACE ...]`: the reuse estimator (App. D.2) over several trace files of one model, as a
map and a reduction: each file's per-document sufficient statistics (moespec.routing.reuse.documents_of) are counted
apart, in this process or as Ray tasks on a cluster (moespec.cluster), then joined in the files' order and reduced
(reuse_from). The statistics are integer counts, so the result, bootstrap included (its resamples depend on the
seed and the document count alone), is exactly the single-process result over the files' documents in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.cluster import connected, tasks
from moespec.formats.trace import load_trace
from moespec.routing.reuse import Documents, ReuseStats, documents_of, joined, reuse_from, trace_expert_bytes


@dataclass(frozen=True)
class Shard:
    """One trace file's part of the estimator: its statistics, its expert bytes w_l (None: relative units) and
    their label, and its header."""

    path: str
    docs: Documents
    expert_bytes: np.ndarray | None
    units: str
    meta: dict[str, Any]


def shard(path: str, n_max: int, fmt: str) -> Shard:
    """Load one trace file and count its statistics (the map; a Ray task's body)."""
    trace = load_trace(path)
    w, units = trace_expert_bytes(trace, fmt)
    return Shard(str(path), documents_of(trace, n_max), w, units, trace.meta)


def _check_same_model(shards: Sequence[Shard]) -> None:
    """One line naming the first file that routes another model than the first file's."""
    first = shards[0]
    for s in shards[1:]:
        if s.docs.repeats.shape[0] != first.docs.repeats.shape[0] or (s.docs.num_experts, s.docs.m) != \
                (first.docs.num_experts, first.docs.m) or s.meta.get("model") != first.meta.get("model"):
            raise MoespecError(f"{s.path}: routes {s.meta.get('model')!r} (L={s.docs.repeats.shape[0]}, "
                               f"N={s.docs.num_experts}, m={s.docs.m}), not {first.path}'s model "
                               f"{first.meta.get('model')!r}: reuse joins traces of one model")


def reuse_files(paths: Sequence[str], n_max: int, bootstrap: int, seed: int, level: float, fmt: str,
                ray: str | None = None) -> tuple[ReuseStats, dict[str, Any]]:
    """The estimator over every document of `paths` in order, each file counted in this process or, with `ray` (an
    address, moespec.cluster), as a task on the cluster; with the first file's header."""
    if not paths:
        raise ValueError("paths must name at least one trace file")
    for path in paths:  # before a cluster is started for them
        if not Path(path).is_file():
            raise MoespecError(f"{path}: no such trace file")
    if ray is None:
        shards = [shard(p, n_max, fmt) for p in paths]
    else:
        with connected(ray) as cluster:
            shards = tasks(cluster, shard, [(p, n_max, fmt) for p in paths])
    _check_same_model(shards)
    first = shards[0]
    return reuse_from(joined([s.docs for s in shards]), bootstrap, seed, level, first.expert_bytes,
                      first.units), first.meta
