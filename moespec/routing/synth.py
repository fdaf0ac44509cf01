"""Synthetic routing traces from stationary, seeded routing processes (for when no checkpoint is at hand).

A routing process is a law on the expert sets S_{l,t} (paper Section 1); the byte accounting needs only its reuse
profile rho_l(n) of (1), through U_l(n) = m Σ_{j<=n} (1 - rho_l(j)) (2). Three processes, each stationary (every
document starts in the stationary law, so a window of n tokens has the same law wherever it starts):

- uniform: every token draws an independent uniform m-subset of the N experts. Then 1 - rho(n) = q^(n-1),
  q = 1 - m/N (Huang et al., 2025), the paper's dotted curve in Figure 1.
- popularity: independent draws with per-layer expert popularity: m distinct experts by successive sampling
  (Plackett-Luce: each next expert drawn with probability proportional to its weight among those not yet
  drawn). For OLMoE-1B-7B and Mixtral-8x7B the weights are fitted so that the inclusion probabilities match the
  measured selection shares on Wikipedia text (allenai/OLMoE routing counts at layers 0, 7 and 15; each layer takes
  the nearest measured layer). Other models take OLMoE's popularity shape resampled to their N (the sorted
  log-weights interpolated by rank quantile, assigned to experts by a seeded permutation). Popularity raises
  reuse above uniform but has no memory: real routing's consecutive-token reuse is far higher (Figure 1).
- calibrated: a keep-or-refresh process with memory. Each (document, layer) draws a topic pool of s experts
  (by popularity, as above); the first token's set is a uniform m-subset of the pool; each next token keeps each
  expert of the previous token's set independently with probability kappa and fills the other slots with
  distinct experts drawn uniformly from the pool minus the previous set. Exchangeability inside the pool makes
  each expert's membership a two-state Markov chain: stay with kappa, enter with p01 = m (1 - kappa) / (s - m).
  The chain's stationary share is m/s, so the uniform first set is stationary, and (1) becomes exactly
        1 - rho(n) = (1 - kappa) p^(n-2),  p = 1 - m (1 - kappa) / (s - m),  n >= 2
  (the expert at the window's end was absent from all n-1 earlier sets: it entered after n-2 absences). With
  s = N and kappa = m/N this is the uniform curve. Calibration to rho(2) = r2 and rho(9) = r9: kappa = r2 and
  p^7 = (1 - r9)/(1 - r2) fix a real pool size s*; pools take the two integers around s*, the larger with the
  share f that makes the mixture exact at n = 9 (a mixture over documents of stationary processes is stationary,
  and its reuse is the mixture of their reuses). Feasible targets need 2m <= s* <= N (s >= 2m leaves room to
  refresh all m slots). With a profile, all layers share the parameters (its targets are layer means); fitted to a
  recorded trace (`synth --fit TRACE`, layer_targets), each layer gets its own: real routing's reuse differs by
  layer (FLAME-MoE-290M's next-token reuse runs from 0.151 to 0.252 across its layers).

The `paper-wikitext` profile holds the paper's layer means on WikiText-103 (Section 2, Figure 1):
rho(2) = 0.363, 0.480, 0.492 and rho(9) = 0.762, 0.780, 0.856 for OLMoE-1B-7B, Qwen3-30B-A3B and gpt-oss-20b.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from moespec import ArgumentError, MoespecError
from moespec.arguments import real, show, whole
from moespec.console import progress
from moespec.defaults import TOKENS_LIMIT
from moespec.formats.files import provenance
from moespec.formats.trace import Trace, depth_map
from moespec.model.spec import ModelSpec, resolve
from moespec.routing.reuse import uniform_rho

PROCESSES = ("uniform", "popularity", "calibrated")
TARGET_N = (2, 9)  # the pass sizes whose layer-mean reuse the paper reports
PROFILES: dict[str, dict[str, tuple[float, float]]] = {
    # model -> (rho(2), rho(9)), layer means on the WikiText-103 fit documents (paper Section 2, Figure 1)
    "paper-wikitext": {"olmoe-1b-7b": (0.363, 0.762), "qwen3-30b-a3b": (0.480, 0.780), "gpt-oss-20b": (0.492, 0.856)},
}

# Plackett-Luce weights (x 1e-5, summing to ~1e5) whose inclusion probabilities reproduce the measured selection
# shares on Wikipedia text at layers 0, 7 and 15 (allenai/OLMoE scripts/routing_output, ~209k tokens each). Fitted
# once by a multiplicative fixed-point iteration on Monte Carlo inclusion frequencies (300k tokens per iteration);
# checked on 1M sampled tokens: every inclusion probability within 0.0016 of its measured share (mean m/N).
_MEASURED_LAYERS = (0, 7, 15)
_MEASURED_WEIGHTS: dict[str, tuple[str, ...]] = {
    "olmoe-1b-7b": (
        "866 1056 490 4938 3916 533 980 955 717 231 1021 15583 1569 922 617 659 787 6337 738 1588 796 1001 "
        "1039 462 1449 726 1340 526 1248 1741 1110 1450 1251 919 1264 1331 887 1500 455 464 1567 1745 2252 "
        "926 1275 1457 1315 1402 1805 1012 1767 4788 1016 1047 772 1334 1624 1717 736 634 1472 998 1106 773",
        "928 1652 260 1785 2369 1093 330 339 196 438 659 1089 1933 1561 831 321 693 362 2459 936 425 1449 "
        "3547 1248 880 220 1227 19247 82 1024 2839 5769 559 2970 507 1629 659 1357 1750 932 1534 730 2722 "
        "3122 1487 831 1839 2054 1335 5811 260 164 1100 370 283 553 976 443 2021 937 365 788 861 859",
        "7562 3567 181 2216 46 145 6346 1290 2714 511 131 279 2887 137 285 145 731 1277 129 111 220 232 137 "
        "367 1680 130 401 397 118 1243 1247 5539 149 206 204 3370 8655 186 172 90 884 5855 431 5717 317 142 "
        "120 704 511 1774 78 66 1332 2292 150 256 183 7771 6291 981 4744 169 119 3682",
    ),
    "mixtral-8x7b": (
        "13318 13061 12267 10790 12700 14027 10531 13306",
        "11928 11892 14213 11335 12247 13222 11856 13307",
        "13030 13252 12453 7413 13945 15078 12171 12658",
    ),
}


# ---- popularity --------------------------------------------------------------------------------------------
def _measured(model: str) -> np.ndarray:
    """The stored weight table of a measured model, [3 measured layers, N]."""
    return np.array([[float(x) for x in row.split()] for row in _MEASURED_WEIGHTS[model]])


def popularity(model: str, num_experts: int, num_layers: int, rng: np.random.Generator) -> np.ndarray:
    """Per-layer expert weights [L, N] for successive sampling (see the module docstring)."""
    if model in _MEASURED_WEIGHTS and _measured(model).shape[1] == num_experts:
        nearest = np.abs(np.arange(num_layers)[:, None] - np.array(_MEASURED_LAYERS)).argmin(axis=1)
        return _measured(model)[nearest]
    shape = np.log(np.sort(_measured("olmoe-1b-7b"), axis=1)[:, ::-1])  # [3, 64] sorted log-weights, largest first
    depth = np.array(_MEASURED_LAYERS) / _MEASURED_LAYERS[-1]
    source_q = (np.arange(shape.shape[1]) + 0.5) / shape.shape[1]
    target_q = (np.arange(num_experts) + 0.5) / num_experts
    weights = np.empty((num_layers, num_experts))
    for layer in range(num_layers):
        row = shape[np.abs(depth - layer / max(num_layers - 1, 1)).argmin()]
        weights[layer] = rng.permutation(np.exp(np.interp(target_q, source_q, row)))
    return weights


def alias_table(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table (Vose's construction) for drawing index i with probability weights[i] / Σ weights in
    O(1): pick a column k uniformly, keep it with probability keep[k], else take alias[k]."""
    n = weights.size
    keep = weights / weights.sum() * n
    alias = np.arange(n)
    small = [i for i in range(n) if keep[i] < 1]
    large = [i for i in range(n) if keep[i] >= 1]
    while small and large:
        s, big = small.pop(), large.pop()
        alias[s] = big
        keep[big] -= 1 - keep[s]
        (small if keep[big] < 1 else large).append(big)
    keep[small + large] = 1.0  # leftovers are 1 up to rounding
    return keep, alias


def successive_sample(rng: np.random.Generator, num_experts: int, weights: np.ndarray | None, count: int,
                      m: int) -> np.ndarray:
    """`count` sets of m distinct experts [count, m], each drawn in turn with probability proportional to its weight
    among those not yet drawn (uniform when weights is None): draw with replacement, redraw repeats."""
    keep, alias = alias_table(weights) if weights is not None else (None, None)

    def draw(k: int) -> np.ndarray:
        column = rng.integers(0, num_experts, size=k)
        return column if keep is None else np.where(rng.random(k) < keep[column], column, alias[column])

    out = np.empty((m, count), dtype=np.int64)
    for i in range(m):
        out[i] = draw(count)
        repeated = np.zeros(count, dtype=bool)
        for j in range(i):
            repeated |= out[j] == out[i]
        pending = np.flatnonzero(repeated)
        while pending.size:
            out[i, pending] = draw(pending.size)
            pending = pending[(out[:i, pending] == out[i, pending]).any(axis=0)]
    return out.T


# ---- the calibrated keep-or-refresh process -------------------------------------------------------------------
@dataclass(frozen=True)
class KeepPool:
    """Calibrated process (module docstring): keep probability kappa, pools of `pool` experts, a share
    `larger_share` of (document, layer) pools with pool + 1."""

    m: int
    keep: float
    pool: int
    larger_share: float

    def rho(self, n_max: int) -> np.ndarray:
        """Exact stationary reuse rho(n), n = 0..n_max (entry 0 unused)."""
        n = np.arange(n_max + 1)
        absent = np.zeros(n_max + 1)
        for s, share in ((self.pool, 1 - self.larger_share), (self.pool + 1, self.larger_share)):
            if share:
                p = 1 - self.m * (1 - self.keep) / (s - self.m)
                absent += share * (1 - self.keep) * p ** np.maximum(n - 2, 0)
        rho = 1 - absent
        rho[:2] = 0.0
        return rho

    @classmethod
    def calibrate(cls, m: int, num_experts: int, rho2: float, rho9: float) -> "KeepPool":
        """Parameters with rho(2) = rho2 and rho(9) = rho9 exactly; MoespecError when no pool size fits in [2m, N]."""
        num_experts = whole("num_experts", num_experts, 2)
        m = whole("m", m, 1, num_experts - 1)
        if not 0 <= real("rho2", rho2) < real("rho9", rho9) < 1:
            raise ArgumentError(f"calibration targets need 0 <= rho(2) < rho(9) < 1, got {rho2}, {rho9}")
        steps = TARGET_N[1] - TARGET_N[0]
        decay = ((1 - rho9) / (1 - rho2)) ** (1 / steps)  # p of a single pool size
        if decay >= 1:
            raise ArgumentError(f"rho(9) = {rho9} needs a pool larger than N = {num_experts}")
        pool_real = m + m * (1 - rho2) / (1 - decay)
        lo_rho9 = 1 - (1 - rho2) * (1 - m * (1 - rho2) / (num_experts - m)) ** steps
        hi_rho9 = 1 - (1 - rho2) * rho2 ** steps
        if not 2 * m <= pool_real <= num_experts:
            raise ArgumentError(f"targets rho(2) = {rho2}, rho(9) = {rho9} are out of reach of the calibrated process "
                               f"for N = {num_experts}, m = {m}: with this rho(2), rho(9) must lie in "
                               f"[{lo_rho9:.3f}, {hi_rho9:.3f}]")
        pool = min(math.floor(pool_real), num_experts - 1)
        power = [(1 - m * (1 - rho2) / (s - m)) ** steps for s in (pool, pool + 1)]
        share = (decay ** steps - power[0]) / (power[1] - power[0])
        return cls(m=m, keep=rho2, pool=pool, larger_share=float(min(max(share, 0.0), 1.0)))

    def sample(self, rng: np.random.Generator, lengths: np.ndarray, weights: np.ndarray,
               show_progress: bool = False) -> np.ndarray:
        """Expert ids [T, L, m] for documents of `lengths`, every (document, layer) chain advanced together: the
        work per token is vectorized over chains, so time grows with the longest document (prefer many)."""
        num_layers, num_experts = weights.shape
        m, num_docs, steps = self.m, lengths.size, int(lengths.max())
        chains = num_docs * num_layers
        size = self.pool + (rng.random(chains) < self.larger_share)
        width = self.pool + 1
        # pools: Plackett-Luce samples of `width` experts (Gumbel top-k) of each chain's layer; the first `size`
        # are used. They are put in a uniform random order, so the first m are a uniform m-subset: stationary.
        keys = np.log(weights)[np.tile(np.arange(num_layers), num_docs)] + rng.gumbel(size=(chains, num_experts))
        pools = np.argsort(-keys, axis=1)[:, :width]
        order = np.argsort(rng.random((chains, width)) + (np.arange(width) >= size[:, None]), axis=1)
        state = np.take_along_axis(pools, order, axis=1).astype(np.uint8 if num_experts <= 256 else np.uint16)
        buffer = np.empty((steps, chains, m), dtype=state.dtype)
        with progress("synth calibrated", steps, enabled=show_progress) as advance:
            for t in range(steps):
                if t:
                    self._step(rng, state, size)
                buffer[t] = state[:, :m]
                advance(1)
        # [token step, document, layer, m] -> documents one after another, each cut to its length
        by_doc = buffer.reshape(steps, num_docs, num_layers, m).transpose(1, 0, 2, 3).reshape(-1, num_layers, m)
        return by_doc[(np.arange(steps) < lengths[:, None]).ravel()]

    def _step(self, rng: np.random.Generator, state: np.ndarray, size: np.ndarray) -> None:
        """Advance every chain by one token, in place. state [chains, width]: the first m entries are the current
        set, entries m .. size-1 the rest of the pool. Slot i, if refreshed, swaps in a uniform pick from the
        positions past m + (slots refreshed so far): a partial Fisher-Yates step, so the pick is never an expert
        of the previous set (those sit in slots or were moved to the positions already passed)."""
        m, chains, width = self.m, state.shape[0], state.shape[1]
        flat = state.reshape(-1)
        drop = 1.0 - self.keep
        u = rng.random((m, chains))
        refresh = u < drop  # u / drop is then uniform on [0, 1): it places the pick
        row = np.arange(chains) * width
        first_free = row + m
        left = size - m  # pool positions not yet passed
        for i in range(m):
            r = refresh[i]
            pick = first_free + np.minimum((u[i] / drop * left).astype(np.int64), left - 1)
            dst = np.where(r, pick, row + i)
            src = np.where(r, first_free, row + i)
            fresh, moved, old = flat[dst], flat[src], state[:, i].copy()
            flat[dst] = moved  # the expert at the first free position goes where the pick was
            flat[src] = old  # the dropped expert leaves the set for a passed position
            state[:, i] = fresh
            first_free += r
            left -= r


# ---- synthesis -----------------------------------------------------------------------------------------------
def document_lengths(tokens: int, docs: int) -> np.ndarray:
    """`tokens` split into `docs` documents as evenly as possible; at most TOKENS_LIMIT tokens (their expert ids are
    held in memory)."""
    tokens = whole("tokens", tokens, 1, TOKENS_LIMIT)
    docs = whole("docs", docs, 1, tokens)
    return np.full(docs, tokens // docs) + (np.arange(docs) < tokens % docs)


def layer_targets(fit: Trace, spec: ModelSpec, where: str = "trace") -> list[tuple[float, float]]:
    """Per MoE layer of `spec`, the (rho(2), rho(9)) of a recorded trace's layer at the same relative depth
    (moespec.formats.trace.depth_map): a model of 16 layers fitted to a trace of 4 gets each of its layers from the
    nearest one. The trace must route N experts with top-m as the model does."""
    from moespec.routing.reuse import reuse_stats

    if (fit.num_experts, fit.m) != (spec.N, spec.m):
        raise MoespecError(f"{where}: routes N={fit.num_experts}, m={fit.m}; {spec.name} has N={spec.N}, m={spec.m}")
    rho = reuse_stats(fit, n_max=TARGET_N[1], bootstrap=0).rho  # [L_fit, n_max + 1]
    source = depth_map(fit.num_layers, spec.L)
    return [(float(rho[i, TARGET_N[0]]), float(rho[i, TARGET_N[1]])) for i in source]


def synthesize(model: str, process: str, tokens: int, docs: int, seed: int = 0, profile: str = "paper-wikitext",
               targets: tuple[float, float] | list[tuple[float, float]] | None = None,
               show_progress: bool = False, fitted_to: str | None = None) -> Trace:
    """A synthetic trace of `tokens` tokens in `docs` documents for a model preset (or config path).

    `targets` = (rho(2), rho(9)) for the calibrated process, one pair for every layer, or a list of one pair per MoE
    layer (layer_targets: each layer its own parameters; `fitted_to` names the trace they came from); default: the
    profile's values for the model."""
    for name, value in (("model", model), ("process", process), ("profile", profile)):
        if not isinstance(value, str):
            raise ArgumentError(f"{name} must be a name, got {show(value)}")
    if fitted_to is not None and not isinstance(fitted_to, str):
        raise ArgumentError(f"fitted_to must be a trace's name or None, got {show(fitted_to)}")
    seed = whole("seed", seed, 0)
    if targets is not None and not (isinstance(targets, (tuple, list)) and (
            len(targets) == 2 and not isinstance(targets[0], (tuple, list)) or
            all(isinstance(t, (tuple, list)) and len(t) == 2 for t in targets))):
        raise ArgumentError(f"targets must be one (rho(2), rho(9)) pair or a list of one per layer, got "
                            f"{show(targets)}")
    spec = resolve(model)
    if process not in PROCESSES:
        raise ArgumentError(f"unknown process {process!r}; one of {', '.join(PROCESSES)}")
    if targets is not None and process != "calibrated":
        raise ArgumentError("--rho2/--rho9 and --fit apply to --process calibrated only")
    lengths = document_lengths(tokens, docs)
    rng = np.random.default_rng(seed)
    meta: dict[str, Any] = {"model": spec.name, "spec": spec.to_dict(), "source": f"synthetic:{process}",
                            "tokenizer": None, "synthetic": True, "process": process, "seed": seed, "params": {},
                            "calibrated_to": None, "expected_rho": None, "provenance": provenance()}
    weights = None if process == "uniform" else popularity(spec.name, spec.N, spec.L, rng)
    if isinstance(targets, list):
        params_by_layer = _per_layer(spec, targets)
        experts = np.stack([p.sample(rng, lengths, weights[layer:layer + 1], show_progress)[:, 0]
                            for layer, p in enumerate(params_by_layer)], axis=1)
        meta.update(params={"layers": [asdict(p) for p in params_by_layer]},
                    expected_rho=[[None, *p.rho(TARGET_N[1])[1:].round(6).tolist()] for p in params_by_layer],
                    calibrated_to={"profile": fitted_to or "custom", "what": "per-layer reuse",
                                   "rho": [{str(n): v for n, v in zip(TARGET_N, t)} for t in targets]})
    elif process == "calibrated":
        label = profile if targets is None else "custom"
        targets = targets or _profile_targets(profile, spec.name)
        params = KeepPool.calibrate(spec.m, spec.N, *targets)
        experts = params.sample(rng, lengths, weights, show_progress)
        meta.update(params=asdict(params), expected_rho=[None, *params.rho(TARGET_N[1])[1:].round(6).tolist()],
                    calibrated_to={"profile": label, "what": "layer-mean reuse",
                                   "rho": {str(n): float(v) for n, v in zip(TARGET_N, targets)}})
    else:
        experts = _independent(rng, spec, weights, int(lengths.sum()), show_progress)
        if weights is None:
            meta["expected_rho"] = [None, *uniform_rho(TARGET_N[1], spec.N, spec.m)[1:].round(6).tolist()]
        else:
            meta["params"] = {"popularity": _popularity_source(spec.name, spec.N)}
    return Trace.from_arrays(experts, np.concatenate([[0], np.cumsum(lengths)]), spec.N, meta=meta)


def _per_layer(spec: ModelSpec, targets: list[tuple[float, float]]) -> list[KeepPool]:
    """Each MoE layer's calibrated parameters (synthesize with a list of targets), the layer named on failure."""
    if len(targets) != spec.L:
        raise ArgumentError(f"{len(targets)} per-layer targets for the {spec.L} MoE layers of {spec.name}")
    params = []
    for layer, (rho2, rho9) in enumerate(targets):
        try:
            params.append(KeepPool.calibrate(spec.m, spec.N, rho2, rho9))
        except MoespecError as e:
            raise MoespecError(f"layer {layer}: {e}") from None
    return params


def _independent(rng: np.random.Generator, spec: ModelSpec, weights: np.ndarray | None, tokens: int,
                 show_progress: bool) -> np.ndarray:
    """[T, L, m] ids of independent tokens: uniform (weights None) or with per-layer popularity weights [L, N]."""
    experts = np.empty((tokens, spec.L, spec.m), dtype=np.uint8 if spec.N <= 256 else np.uint16)
    with progress("synth independent", spec.L, enabled=show_progress) as advance:
        for layer in range(spec.L):
            experts[:, layer] = successive_sample(rng, spec.N, None if weights is None else weights[layer], tokens,
                                                  spec.m)
            advance(1)
    return experts


def _profile_targets(profile: str, model: str) -> tuple[float, float]:
    if profile not in PROFILES:
        raise ArgumentError(f"unknown profile {profile!r}; one of {', '.join(PROFILES)}")
    if model not in PROFILES[profile]:
        raise ArgumentError(f"profile {profile} has no targets for {model} (it has {', '.join(PROFILES[profile])}); "
                           f"give --rho2 and --rho9")
    return PROFILES[profile][model]


def _popularity_source(model: str, num_experts: int) -> str:
    if model in _MEASURED_WEIGHTS and _measured(model).shape[1] == num_experts:
        return f"measured selection shares of {model} on Wikipedia text (layers 0, 7, 15; nearest layer)"
    return "OLMoE-1B-7B's measured popularity shape resampled to N experts, seeded expert permutation per layer"


def describe(meta: dict[str, Any]) -> str:
    """One phrase naming the process and what it was calibrated to or drawn from."""
    if meta["calibrated_to"]:
        target = meta["calibrated_to"]
        if isinstance(target["rho"], list):  # one pair per layer
            pairs = "; ".join(f"{r['2']:.3f}, {r['9']:.3f}" for r in target["rho"])
            return f"calibrated process, each layer fitted to {target['profile']}: rho(2), rho(9) = {pairs}"
        rho = ", ".join(f"rho({n}) = {v}" for n, v in target["rho"].items())
        return f"calibrated process, calibrated to {target['profile']}: {rho}"
    if meta["params"].get("popularity"):
        return f"popularity process: {meta['params']['popularity']}"
    return "uniform process"
