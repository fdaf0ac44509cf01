"""Hand-made bench.json and runs.json documents of OLMoE-1B-7B shape with known expert-op times, shared by the plan
and report tests (test modules do not import each other)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from moespec.formats.trace import Trace
from moespec.model.spec import ModelSpec

MODEL = "olmoe-1b-7b"  # 16 MoE layers of equal w_l: untimed layers scale the two timed ones by 16/2
TIMED = [0, 7]
NS = list(range(1, 10))
TAU1 = 0.1
EPS = 0.05
MS = 1e-3
# per timed layer, in ms: slot(n) = n, dedup(n) = 1.5 + n/2, so the saving per layer is n/2 - 1.5:
# negative at n = 2, zero at n = 3, positive from n = 4 (the crossover)
SLOT = {n: n * MS for n in NS}
DEDUP = {n: (1.5 + n / 2) * MS for n in NS}
# a hand-made runs.json: dedup-off verify times whose growth outside the expert op is not (22)'s (quadratic)
RUNS_SLOT = {n: TAU1 + 0.02 * (n - 1) + 0.001 * (n - 1) ** 2 for n in NS}
RUNS_DRAFT = {k: 0.001 * (1 + k) for k in range(9)}
Errors = Callable[[str, int], float]


def make_bench(errors: Errors = lambda kernel, n: 0.0, eps: float = EPS, r: float = 0.5,
               slot: dict[int, float] = SLOT, dedup: dict[int, float] = DEDUP) -> dict[str, Any]:
    """A bench.json document that passes load_bench: per timed layer, the fit (predicted) times `slot` and `dedup`
    and measured times = predicted x (1 + e), e = errors(kernel, n) (the one-token time: errors("slot", 1))."""
    def entry(kernel: str, n: int, t: float) -> dict[str, float]:
        return {"windows": 4, "predicted_mean_s": t, "measured_mean_s": t * (1 + errors(kernel, n)),
                "measured_median_s": t}

    per_layer = {str(layer): {
        "kernels": {kernel: {str(n): entry(kernel, n, times[n]) for n in NS}
                    for kernel, times in (("slot", slot), ("dedup", dedup))},
        "one_token_s": {"kernel": "slot", "predicted_s": slot[1], "measured_s": slot[1] * (1 + errors("slot", 1))}}
        for layer in TIMED}
    beta = {"kind": "slot", "beta_gbps": {str(n): 10.0 for n in NS}, "beta_iqr_gbps": {str(n): 1.0 for n in NS}}
    return {"format": "moespec-bench", "format_version": 1, "model": MODEL, "device": "test device",
            "device_kind": "cpu", "dtype": "bf16", "ceiling_kind": "streaming read", "ceiling_gbps": 20.0,
            "layers": TIMED, "n": NS,
            "expert_bytes": {str(layer): ModelSpec.from_name(MODEL).expert_bytes(layer, "bf16") for layer in TIMED},
            "kernels": {"slot": beta, "dedup": {**beta, "kind": "dedup"}},
            "r": {str(n): r for n in NS}, "u": {str(n): 1.0 for n in NS}, "eps": {"slot": eps / 2, "dedup": eps},
            "crossover": None, "fits": {}, "per_layer": per_layer, "chosen": {}, "provenance": {}}


def uniform_trace() -> Trace:
    """Uniform random routing of the model's shape, two documents of 150 tokens."""
    spec = ModelSpec.from_name(MODEL)
    rng = np.random.default_rng(0)
    experts = np.argsort(rng.random((300, spec.L, spec.N)), axis=-1)[..., :spec.m]
    return Trace.from_arrays(experts, [0, 150, 300], spec.N, meta={"model": MODEL})


def make_runs(slot: dict[int, float] = RUNS_SLOT, **changes: Any) -> dict[str, Any]:
    """A runs.json document with what plan reads (the shape `moespec run` writes), changed by `changes`."""
    return {"format": "moespec-runs", "format_version": 1, "model": MODEL, "device_kind": "cpu", "dtype": "bf16",
            "depth": 4096, "moe_layers": 16,
            "verify_time_s": {"slot": {str(n): t for n, t in slot.items()},
                              "dedup": {str(n): t * 0.9 for n, t in slot.items()}},
            "draft_time_s": {str(k): h for k, h in RUNS_DRAFT.items()}, **changes}
