"""Linear fits of one layer's expert-operation time to its bytes, their error on recorded routing, and the
crossover (paper Section 2, eq. (4), Appendix E eq. (E.1), Section 4 for eps).

A pass of n tokens names n*m slots, U of them distinct experts of b = w_l bytes each. U slots are the first
read of their expert in the pass and n*m - U repeat one. The two kernels' times are fitted, per layer, by
least squares over passes with chosen ids (every U of a grid at every n >= 2):

    per-slot (4)        t_slot  = t_op + c_u U b + c_re (n m - U) b
    deduplicating (E.1) t_dedup = t_op + c_g U b + c_t n

c_u is the time per byte of a first read and c_re of a repeated slot: the re-read cost c_re/c_u is 1 when a
repeated slot streams from memory again and near 0 when a cache serves it. c_g is the dedup kernel's time per
union byte and c_t its time per token. Neither fit is identifiable from a single n (at fixed n the columns
U b and (n m - U) b, or n and 1, are collinear), so a fit needs chosen passes at two or more n.

A fit's error is scored on windows of recorded routing it never saw: the median, over a layer's windows, of
|predicted - measured| / measured. eps_p is the median of that over layers and engine eps the max over the
engine's kernels (Section 4). The bytes-over-bandwidth prediction (22) uses the fits at each window's (n, U).

`analyze` turns a bench's timed units into the derived keys of bench.json (documented in moespec.formats.benchfile):
pure functions of the medians, so they are tested on synthetic timings with known constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from moespec import MoespecError, theory
from moespec.formats.benchfile import COEF_KEYS
from moespec.kernels import PAIRS

EQUATIONS = {"slot": "(4)", "dedup": "(E.1)"}
_COEFFICIENTS = 3  # t_op and two slopes in both fits


def design(kind: str, n: np.ndarray, U: np.ndarray, m: int, b: float) -> np.ndarray:  # noqa: N803
    """Regressors [passes, 3] of fit (4) (kind 'slot': 1, U b, (n m - U) b) or (E.1) ('dedup': 1, U b, n)."""
    n, U = np.asarray(n, dtype=float), np.asarray(U, dtype=float)  # noqa: N806
    if kind == "slot":
        return np.stack([np.ones_like(U), U * b, (n * m - U) * b], axis=-1)
    if kind == "dedup":
        return np.stack([np.ones_like(U), U * b, n], axis=-1)
    raise MoespecError(f"unknown kernel kind {kind!r}: 'slot' or 'dedup'")


@dataclass(frozen=True)
class Fit:
    """One layer's fit of one kernel: coef = (t_op [s], c_u or c_g [s/byte], c_re [s/byte] or c_t [s/token])."""

    kind: str
    coef: tuple[float, float, float]
    m: int
    b: float
    passes: int

    def predict(self, n: np.ndarray, U: np.ndarray) -> np.ndarray:  # noqa: N803
        """Predicted operation time [s] of passes of n tokens naming U distinct experts."""
        return design(self.kind, n, U, self.m, self.b) @ np.asarray(self.coef)

    def median_relative_error(self, n: np.ndarray, U: np.ndarray, t: np.ndarray) -> float:  # noqa: N803
        """Median over passes of |predicted - measured| / measured."""
        t = np.asarray(t, dtype=float)
        return float(np.median(np.abs(self.predict(n, U) - t) / t))

    def to_json(self) -> dict[str, float | int | str | None]:
        t_op, c1, c2 = self.coef
        per_gb = 1e-9 / c1 if c1 > 0 else None  # 1/c in GB/s; a non-positive slope has no bandwidth
        out: dict[str, float | int | str | None] = {"equation": EQUATIONS[self.kind], "passes": self.passes,
                                                    **dict(zip(COEF_KEYS[self.kind], self.coef))}
        if self.kind == "slot":
            out |= {"re_read_cost": c2 / c1 if c1 > 0 else None, "first_read_gbps": per_gb}
        else:
            out |= {"union_gbps": per_gb}
        return out


def recorded_time(record: dict[str, Any], kind: str, n: np.ndarray, U: np.ndarray, m: int,  # noqa: N803
                  b: float) -> np.ndarray:
    """The operation time [s] a fit as bench.json records it (Fit.to_json) predicts for passes of n tokens naming
    U distinct experts of b bytes."""
    return design(kind, n, U, m, b) @ np.array([record[key] for key in COEF_KEYS[kind]], dtype=float)


def fit_time(kind: str, n: np.ndarray, U: np.ndarray, t: np.ndarray, m: int, b: float) -> Fit | None:  # noqa: N803
    """Least-squares fit (4) or (E.1) of times t [s] on passes (n, U); None when the passes cannot identify it
    (fewer than two pass sizes, or fewer passes than coefficients)."""
    x = design(kind, n, U, m, b)
    scale = np.linalg.norm(x, axis=0)  # columns differ by ~1e8 (bytes vs tokens): solve on unit columns
    scale[scale == 0] = 1.0
    xs = x / scale
    if x.shape[0] < _COEFFICIENTS or np.linalg.matrix_rank(xs) < _COEFFICIENTS:
        return None
    coef, *_ = np.linalg.lstsq(xs, np.asarray(t, dtype=float), rcond=None)
    t_op, c1, c2 = (coef / scale).tolist()
    return Fit(kind, (t_op, c1, c2), m, float(b), int(x.shape[0]))


# ---- a bench's results from its timings (moespec.measure.bench stores these in bench.json) ------------------------
FIT_MIN_N = 2  # fits (4), (E.1) and their errors use passes of n >= 2 (n = 1 has the single U = m)
NOISY_IQR = 0.2  # a timing whose IQR exceeds 20% of its median is noisy (a busy or throttling machine)

# Timed units keyed (layer, n): {"passes": [{"source": "chosen" | "window", "U", "start" (windows),
# "median_s": {kernel: s}, "iqr_s": {kernel: s}}]}
Units = dict[tuple[int, int], dict[str, Any]]


# peer kernel name prefix -> the engine it belongs to; kernels without a prefix are moespec's own
ENGINES = {"hf": "transformers", "mlx": "mlx-lm", "ggml": "llama.cpp ggml", "torch": "torch"}


def engine_of(kernel: str) -> str:
    """The engine a kernel belongs to: 'moespec' (slot, dedup) or the peer's, from its name prefix."""
    prefix, _, rest = kernel.partition("-")
    return ENGINES.get(prefix, prefix) if rest else "moespec"


def eps_by_engine(eps: dict[str, float]) -> dict[str, float]:
    """eps_engine: per engine (engine_of), the largest eps of its kernels."""
    engines: dict[str, list[float]] = {}
    for kernel, value in eps.items():
        engines.setdefault(engine_of(kernel), []).append(value)
    return {e: max(v) for e, v in engines.items()}


def _rows(units: Units, layer: int, source: str) -> list[tuple[int, dict[str, Any]]]:
    """(n, pass) of one layer's passes of one source, by n."""
    return [(n, row) for (lay, n), unit in sorted(units.items()) if lay == layer
            for row in unit["passes"] if row["source"] == source]


def _arrays(rows: list[tuple[int, dict[str, Any]]], kernel: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n, U and the kernel's median time of each pass."""
    return (np.array([n for n, _ in rows], float), np.array([r["U"] for _, r in rows], float),
            np.array([r["median_s"][kernel] for _, r in rows], float))


def _layer(units: Units, kinds: dict[str, str], m: int, b: float, layer: int,
           ns: list[int]) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """One layer's fits (with their eps), eps per kernel and operation times over windows for (22)."""
    chosen = [(n, r) for n, r in _rows(units, layer, "chosen") if n >= FIT_MIN_N]
    windows = _rows(units, layer, "window")
    scored = [(n, r) for n, r in windows if n >= FIT_MIN_N]
    fits: dict[str, Any] = {}
    eps: dict[str, float] = {}
    times: dict[str, Any] = {}
    layer_fits: dict[str, Fit | None] = {}
    for kernel, kind in kinds.items():
        fit = fit_time(kind, *_arrays(chosen, kernel), m, b) if chosen else None
        layer_fits[kernel] = fit
        if fit is not None and scored:
            eps[kernel] = fit.median_relative_error(*_arrays(scored, kernel))
        fits[kernel] = None if fit is None else fit.to_json() | {"eps": eps.get(kernel)}
        times[kernel] = {}
        for n in ns:
            n_arr, u_arr, t = _arrays([(k, r) for k, r in windows if k == n], kernel)
            times[kernel][str(n)] = {
                "windows": int(t.size), "measured_mean_s": float(t.mean()), "measured_median_s": float(np.median(t)),
                "predicted_mean_s": None if fit is None else float(fit.predict(n_arr, u_arr).mean())}
    # t_l(1) of (22) comes from the per-slot kernel: both engines run it on one-token passes
    one = next((k for k in ("slot", *kinds) if kinds.get(k) == "slot"), None)
    one_token = None if one is None or 1 not in ns else {
        "kernel": one, "measured_s": times[one]["1"]["measured_mean_s"],
        "predicted_s": None if layer_fits[one] is None else float(layer_fits[one].predict(1, m))}
    return fits, eps, {"kernels": times, "one_token_s": one_token}


def analyze(units: Units, kinds: dict[str, str], m: int, b: dict[int, float], layers: list[int], ns: list[int],
            u: dict[int, float], slot_flops: float | None = None) -> dict[str, Any]:
    """bench.json's derived keys from timed units: kernels (beta_p(n) on requested bytes, median and IQR over the
    recorded windows of all layers; with `slot_flops`, the FLOPs of one token-slot (2 x 3 d f), the FLOP rate
    gflops(n)), r, u, eps, eps_engine, crossover, fits, per_layer and, where the units sampled it between their
    rounds, the ceiling per n and each round's sample (see moespec.formats.benchfile)."""
    fits, per_layer, errors = {}, {}, {k: [] for k in kinds}
    for layer in layers:
        fits[str(layer)], eps, per_layer[str(layer)] = _layer(units, kinds, m, b[layer], layer, ns)
        for kernel, value in eps.items():
            errors[kernel].append(value)
    kernels: dict[str, Any] = {}
    for kernel, kind in kinds.items():
        beta, iqr = {}, {}
        for n in ns:
            values = [theory.requested_bytes(kind, n, r["U"], m, b[layer]) / r["median_s"][kernel] / 1e9
                      for layer in layers for k, r in _rows(units, layer, "window") if k == n]
            q1, beta[str(n)], q3 = np.percentile(values, [25, 50, 75]).tolist()
            iqr[str(n)] = q3 - q1
        kernels[kernel] = {"kind": kind, "beta_gbps": beta, "beta_iqr_gbps": iqr}
        if slot_flops is not None:  # every slot's token is multiplied by its expert, whatever the kernel reads
            kernels[kernel]["gflops"] = {str(n): float(np.median(
                [n * m * slot_flops / r["median_s"][kernel] / 1e9
                 for layer in layers for k, r in _rows(units, layer, "window") if k == n])) for n in ns}
    pair = next((list(p) for p in PAIRS if set(p) <= set(kinds)), None)  # the engine pair timed, ours first
    r = {} if pair is None else {
        n: kernels[pair[1]]["beta_gbps"][str(n)] / kernels[pair[0]]["beta_gbps"][str(n)] for n in ns}
    eps = {k: float(np.median(v)) for k, v in errors.items() if v}
    ceilings = {n: [c for layer in layers for c in units[layer, n].get("ceiling_gbps", [])] for n in ns}
    by_n = {str(n): float(np.median(c)) for n, c in ceilings.items() if c}
    rounds = {str(layer): {str(n): list(units[layer, n]["ceiling_gbps"]) for n in ns} for layer in layers
              if all(units[layer, n].get("ceiling_gbps") for n in ns)}
    return {"kernels": kernels, "pair": pair, "r": {str(n): v for n, v in r.items()}, "u": {str(n): u[n] for n in ns},
            "eps": eps, "eps_engine": eps_by_engine(eps),
            "crossover": theory.crossover({n: r[n] - u[n] for n in ns if n in r}),  # (7): dedup faster where u < r
            "fits": fits, "per_layer": per_layer, **({"ceiling_by_n_gbps": by_n} if len(by_n) == len(ns) else {}),
            **({"ceiling_rounds_gbps": rounds} if rounds else {})}


def raw_medians(units: Units, source: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{layer: {n: [passes]}} of one source ("chosen" or "window"), without the source field."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for (layer, n), unit in sorted(units.items()):
        rows = [{k: v for k, v in row.items() if k != "source"} for row in unit["passes"] if row["source"] == source]
        out.setdefault(str(layer), {})[str(n)] = rows
    return out


def noise(units: Units) -> dict[str, Any]:
    """How many timings have an IQR wider than NOISY_IQR x their median, and the widest ratio."""
    ratios = [row["iqr_s"][k] / row["median_s"][k] for unit in units.values() for row in unit["passes"]
              for k in row["median_s"]]
    return {"threshold": NOISY_IQR, "count": sum(x > NOISY_IQR for x in ratios), "total": len(ratios),
            "worst": max(ratios, default=0.0)}
