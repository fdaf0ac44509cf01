"""bench.json: the results file of `moespec bench`, its typed record `Bench` and its only loader `load_bench`, which
validates it; every later reader (plan, report, demo) goes through it. Its tables and figure are drawn in
moespec.report.html.

bench.json (FORMAT_NAME, FORMAT_VERSION; JSON object keys for n, layers and U are strings):
  format, format_version, model, spec     model name and ModelSpec fields
  device, device_kind, dtype              "cpu: <model name>, <threads> threads" or "cuda: <GPU name>, sm<major><minor>,
                                          <memory> GiB"; "cpu" or "cuda" (bench --device); "bf16", "fp32",
                                          or a GGUF format "q8_0", "q4_0" (ggml's kernels only)
  ceiling_kind                            what the ceiling measures (moespec.measure.timing): "streaming read" (cpu) or
                                          "device-to-device copy" (cuda; bytes read + written)
  ceiling_gbps, ceiling_iqr_gbps          the measured ceiling in GB/s (1e9 B/s): median and IQR over the
                                          samples before and after the timing; ceiling_before_after_gbps: each
  layers, n                               MoE layers (trace layer index) and pass sizes timed: tokens per pass
  batch                                   B sequences per pass (`bench --batch`; 1 in version-1 files): each n is
                                          then B times a sequence's tokens, and recorded passes hold B windows
  expert_bytes                            {layer: b}: each expert's bytes, which the fits' regressors read
  kernels  {name: {kind, implementation, beta_gbps: {n: v}, beta_iqr_gbps: {n: v}}}  on requested bytes;
           implementation: native or torch for ours (moespec.kernels.implementation), else the peer's engine
           (kind 'slot': n m b, kind 'dedup': U b), median and IQR over recorded windows of all layers
           gflops: {n: v} (newer files): 2 x 3 d f FLOPs per token-slot over the kernel's time, median over windows
  ceiling_by_n_gbps {n: median of the ceiling samples taken between the rounds of that n} (newer files)
  ceiling_rounds_gbps {layer: {n: [the sample after that (layer, n)'s group in each round, in round order]}}
           (newer files): a pass's round_s[k] ran just before the k-th sample
  matmul_peak_gflops  the compute ceiling: GFLOP/s of a torch.matmul in the bench's dtype, or fp32 on a CPU whose
           torch has no GEMM in it (moespec.measure.timing matmul_peak, matmul_dtype), median of the samples
           before the timing; absent in version-1 files
  pair     [per-slot kernel, dedup kernel]: the engine pair timed (moespec.kernels.PAIRS: ours, or ggml's), or
           null (version-1 files timed ours)
  r        {n: beta_dedup/beta_slot} of the pair (empty if none was timed)
  u        {n: E_dedup/E_slot} over every in-document window of every layer of the trace (bytes-weighted)
  eps      {kernel: median over layers of its fit's median relative error on windows, n >= 2}
  eps_engine {engine: max over its kernels' eps}  (moespec: slot, dedup; transformers: hf-*; mlx-lm: mlx-*)
  crossover  smallest n >= 2 from which u(n) < r(n) for every larger n timed; null if none
  fits     {layer: {kernel: {equation, passes, t_op_s, c_u_s_per_byte, c_re_s_per_byte, re_read_cost,
           first_read_gbps | c_g_s_per_byte, c_t_s_per_token, union_gbps; eps}}}; null when not identifiable
  per_layer {layer: {kernels: {kernel: {n: {windows, measured_mean_s, measured_median_s, predicted_mean_s}}},
           one_token_s: {kernel, measured_s, predicted_s}}}: operation times over windows for prediction (22)
           (measured: mean / median of the per-window medians; predicted: the fit at each window's (n, U),
           averaged); t_l(1) from the per-slot kernel
  chosen   {layer: {n: [{U, median_s: {kernel: s}, iqr_s: {kernel: s}, round_s: {kernel: [s per round]}}]}}   raw
           medians on chosen ids (round_s: newer files, in the order of ceiling_rounds_gbps)
  windows  {layer: {n: [{start, U, median_s, iqr_s, round_s}]}}   raw medians on recorded windows (start: first
           token); with `bench --call-ceilings` each row also has round_ceiling_gbps {kernel: [the ceiling sampled
           right after that call, per round]}
  trace    {path, synthetic, source, note, num_tokens, num_documents, sha1}
  protocol {reps, windows, u_values, seed, flush_bytes, timer, weight_std, noisy_iqr, call_ceilings, late_starts,
           outlier_ratio}
           timer: "perf_counter" (cpu)
           or "cuda events"
  skipped_kernels {kernel: why}: kernels `--kernels all` left out because they cannot run at this dtype
  noisy    {threshold, count, total, worst}: timings whose IQR exceeds threshold x median (noise_verdict)
  too_small {flag, share_of_ceiling, fixed_share, eps, reason}: whether the expert operation of this model is too
           small to time on this machine (too_small: the kernels' median share of the ceiling under TOO_SMALL_FLOOR,
           or under TOO_SMALL_SHARE with a pass's fitted fixed time at least FIXED_SHARE of it, or their eps past
           1/2), the numbers it was decided on and one line why (null when not flagged); a plan refuses a bench so
           flagged; absent in version-1 files (too_small computes it from their numbers)
  resumed_rounds  rounds taken from an earlier run's checkpoint (OUT.partial) rather than timed by this run
           (`bench --fresh` times every round); absent in version-1 files
  level    {pinned_gbps, band, wait_s, waited_s, dropped, kept_off, exhausted}: the host's bandwidth level the
           rounds were kept at (moespec.measure.level; wait_s 0: none pinned); absent in version-1 files
  contention {cores, threads, fitted, calls, contended, fewer_threads, others_max, wait_share_max} or null: the
           timed calls another process ran beside (moespec.measure.contention): `contended` of `calls` saw another
           process's runnable thread or waited for a core over 5% of the call, `fewer_threads` ran on fewer than
           `threads` because a core was taken; absent in version-1 files
  retimed  [{layer, n, round, group, pass, kernel, first_s, seconds, ceiling_gbps}]: the timed calls over
           protocol.outlier_ratio x their pass's expected time, timed again
           (moespec.measure.bench_rounds.retime_outliers): `seconds` is in round_s and the medians, `first_s` the time
           it replaced (`pass`: the index in chosen + windows at n; ceiling_gbps null without call ceilings); absent
           in files from before it
  placement {layer: [p_e per expert] or null}: each expert's read rate over the ceiling buffer's, in the memory the
           bench's draw of that layer lay in (moespec.measure.placement; `bench --call-ceilings` on the CPU); absent
           otherwise
  elapsed_s, provenance (device, host, dtype, versions, timestamp, command)
  predicted true where the operation times are predicted, not timed (`bench --predict`,
           moespec.predict.structure_bench); absent in a measured bench. prediction {profile, profile_sha256,
           profile_ceiling_gbps, ceiling_gbps (the median over n), ceiling_source ("profile", "given", "given per
           n" or "probe"), placement (whether a measured bench's placement set the experts' reads; absent before it),
           loop_factor (the k its loop terms were scaled by, moespec.measure.state_probe; null: none) and probe (`bench
           --probe`: {k, used, passes, take}, the check passes timed here and the k each gave; null: none; both absent
           before them), error: {kernel: stated relative error}, error_source, fit_eps: {kernel: the fits' error on the
           predicted windows}, profile_warnings: [the profile's warnings, moespec.predict.checks.profile_checks;
           absent before them]}: eps is fit_eps + error per kernel
Files written before `bench --device` lack device_kind, ceiling_kind and protocol.timer: they were all measured on
the CPU against a streaming read, and load_bench fills in those two keys and batch 1 (LEGACY_KEYS).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moespec import MoespecError, theory
from moespec.defaults import (
    BATCH_LIMIT,
    BENCH_DTYPES,
    DEVICE_KINDS,
    KERNELS,
    LAYERS_LIMIT,
    N_LIMIT,
    REPS_LIMIT,
    SAMPLES_LIMIT,
)
from moespec.formats.files import (
    Record,
    check_contention_record,
    check_level_record,
    field,
    format_problem,
    is_number,
    positive,
    read_json,
)

FORMAT_NAME = "moespec-bench"
FORMAT_VERSION = 2  # 2 writes device_kind, ceiling_kind, noisy, too_small, resumed_rounds, level, contention
# what a file written before `bench --device` was measured on: every such bench ran on the CPU
LEGACY_KEYS = {"device_kind": "cpu", "ceiling_kind": "streaming read", "batch": 1}
# per_layer's times of one kernel at one n: measured ones are positive; a fit's prediction is finite (a fit may
# extrapolate below zero at a pass size it did not see)
OP_TIMES = {"measured_mean_s": True, "measured_median_s": True, "predicted_mean_s": False}
# the names of each fit's coefficients by its kernel's kind, in moespec.measure.fits.design's column order
COEF_KEYS = {"slot": ("t_op_s", "c_u_s_per_byte", "c_re_s_per_byte"),
             "dedup": ("t_op_s", "c_g_s_per_byte", "c_t_s_per_token")}


def as_pair_roles(doc: Any) -> dict[str, Any]:
    """The bench document with its pair's kernels renamed to KERNELS (slot, dedup) in kernels, eps, per_layer and fits,
    the names a plan reads (a bench of ggml's pair plans llama.cpp with ggml's times); the document itself when
    it timed ours."""
    pair = doc.get("pair") or list(KERNELS)
    if list(pair) == list(KERNELS):
        return doc
    rename = dict(zip(pair, KERNELS))
    keep = lambda table: {rename[k]: v for k, v in table.items() if k in rename}  # noqa: E731
    per_layer = {layer: {**entry, "kernels": keep(entry["kernels"])} for layer, entry in doc["per_layer"].items()}
    fits = {layer: keep(by_kernel) for layer, by_kernel in (doc.get("fits") or {}).items()}
    return {**doc, "kernels": keep(doc["kernels"]), "eps": keep(doc["eps"]), "per_layer": per_layer, "fits": fits,
            "pair_kernels": dict(zip(KERNELS, pair))}


NOISY_SHARE = 0.1  # a bench with more than 10% noisy timings (IQR > noisy.threshold x median) is noisy
# Our kernels stream a real model's experts near the ceiling (at best 0.8-1.3 of it on this project's CPU and an
# H200: results/); where the median share over n stays under a quarter, fixed per-call costs, not bytes, are timed
# (the trained pair's target, hidden 128: a few percent to under a fifth of it on this CPU).
TOO_SMALL_SHARE = 0.25
# ... unless the fits say the bytes set the time: a kernel whose loop keeps it under that share (ggml's q4_0 blocks
# on a 2-core Xeon: 22-27% of a ~33 GB/s ceiling, a pass's fitted fixed time 4-40% of its time at one token) is
# timed well; the trained pair's passes are 66-105% fixed time (a short bench's fit, three CPUs' validation benches).
# So the flag needs at least this much too.
FIXED_SHARE = 0.5
# ... and under this share no fit decides: the intercept t_op of passes this small moves with the draw (the trained
# pair's GGUF, 2% of the ceiling, fitted 76-107% fixed in three benches back to back), while every real model's
# bench in results/ reached a fifth of the ceiling or more (the trained pair 1-14%).
TOO_SMALL_FLOOR = 0.15


def noise_verdict(doc: Mapping[str, Any]) -> tuple[bool, bool]:
    """(noisy, drifted) of a bench: drifted when the ceiling's IQR exceeds noisy.threshold of it; noisy when it
    drifted or more than NOISY_SHARE of the timings are noisy. (False, False) where the bench has no noise record."""
    noisy = doc.get("noisy")
    if not isinstance(noisy, Mapping) or not all(is_number(noisy.get(k)) for k in ("threshold", "count", "total")):
        return False, False
    iqr = doc.get("ceiling_iqr_gbps")
    drifted = bool(is_number(iqr) and iqr > noisy["threshold"] * doc["ceiling_gbps"])
    return drifted or noisy["count"] > NOISY_SHARE * noisy["total"], drifted


def fixed_share(doc: Mapping[str, Any], pair: list[str]) -> float | None:
    """The share of a pass's time that is fixed: per MoE layer the least over `pair` of its fit's t_op (4), (E.1)
    over its mean time at the bench's fewest tokens, the median over layers; None where the bench has no such fits."""
    shares = []
    for layer, fits in (doc.get("fits") or {}).items():
        times = ((doc.get("per_layer") or {}).get(layer) or {}).get("kernels") or {}
        got = [fits[k]["t_op_s"] / t for k in pair if is_number((fits.get(k) or {}).get("t_op_s"))
               and (by_n := times.get(k)) and is_number(t := by_n[min(by_n, key=int)].get("measured_mean_s"))
               and t > 0]
        if got:
            shares.append(min(got))
    return float(statistics.median(shares)) if shares else None


def fixed_costs_set_time(share: float | None, fixed: float | None) -> bool:
    """Whether fixed per-call costs, not the bytes, set a bench's time: its kernels' median share of the ceiling is
    under TOO_SMALL_FLOOR, or under TOO_SMALL_SHARE with a pass's fitted fixed time (fixed_share; None: no fits) at
    least FIXED_SHARE of it."""
    return share is not None and (share < TOO_SMALL_FLOOR or
                                  (share < TOO_SMALL_SHARE and (fixed is None or fixed >= FIXED_SHARE)))


def too_small(doc: Mapping[str, Any]) -> dict[str, Any]:
    """bench.json's `too_small`: whether the expert operation of the bench's model is too small to time on its
    machine. Per timed n, the faster of the pair a plan reads (`pair`, ours in version-1 files) as a share of the
    ceiling sampled at that n; flagged where fixed per-call costs, not the bytes, set the time (fixed_costs_set_time
    of that median over n and of fixed_share), or where the pair's eps is past the 1/2 the bands (21) need (the fits
    (4), (E.1) do not describe the times). Returns {flag, share_of_ceiling, fixed_share, eps, reason: one line, or
    None when not flagged}."""
    pair = [k for k in (doc.get("pair") or KERNELS) if k in doc["kernels"]] or \
        [k for k in KERNELS if k in doc["kernels"]]  # a document whose pair plays slot and dedup (as_pair_roles)
    by_n = doc.get("ceiling_by_n_gbps") if isinstance(doc.get("ceiling_by_n_gbps"), Mapping) else {}
    shares = []
    for n in map(str, doc["n"]):
        ceiling = by_n.get(n, doc["ceiling_gbps"])
        beta = [doc["kernels"][k]["beta_gbps"].get(n) for k in pair]
        if pair and all(is_number(b) for b in beta) and is_number(ceiling) and ceiling > 0:
            shares.append(max(beta) / ceiling)
    share = float(statistics.median(shares)) if shares else None
    errors = [doc["eps"][k] for k in pair if is_number(doc["eps"].get(k))]
    eps = float(max(errors)) if errors else None
    fixed = fixed_share(doc, pair)
    low = fixed_costs_set_time(share, fixed)
    loose = eps is not None and eps >= theory.EPS_LIMIT
    by_fit = low and share >= TOO_SMALL_FLOOR and fixed is not None  # else the share alone decided
    reasons = [f"the kernels reach {share:.{0 if share >= 0.01 else 1}%} of the "
               f"{doc.get('ceiling_kind', 'streaming read')} ceiling (median over n; under "
               f"{TOO_SMALL_SHARE if by_fit or fixed is None else TOO_SMALL_FLOOR:.0%})"
               + (f" and their fixed time is {fixed:.0%} of a pass's at the fewest tokens" if by_fit else "")
               + ", so fixed per-call costs, not the bytes, set their time"] if low else []
    stated = (doc.get("prediction") or {}).get("error") if doc.get("predicted") else None
    if loose:
        reasons.append(f"its fits (4), (E.1) miss the recorded windows by eps = {eps:.3g} >= 1/2: the speedup band "
                       f"(21) needs eps < 1/2")
        if isinstance(stated, Mapping) and stated:
            reasons[-1] += (f" (eps includes the device profile's stated error, up to "
                            f"{max(v for v in stated.values() if is_number(v)):.3g}, its self-check)")
    what = "the expert operation of this model is too small to time on this machine" + \
        ("" if low else ", or the machine was disturbed")
    if stated and not low:
        what = "the predicted times are too uncertain for a plan"
    return {"flag": low or loose, "share_of_ceiling": share, "fixed_share": fixed, "eps": eps,
            "reason": f"{what}: {'; '.join(reasons)}" if reasons else None}


# ---- bench.json --------------------------------------------------------------------------------------------
# protocol key -> the bounds `moespec bench` takes it in (its --reps, --windows, --u-values)
PROTOCOL_COUNTS = (("reps", 1, REPS_LIMIT), ("windows", 1, SAMPLES_LIMIT), ("u_values", 2, SAMPLES_LIMIT))
# key -> type(s) every bench.json must carry (external checks read them)
REQUIRED = {"format_version": int, "model": str, "device": str, "dtype": str, "ceiling_gbps": (int, float),
            "layers": list, "n": list, "kernels": dict, "r": dict, "u": dict, "eps": dict,
            "crossover": (int, type(None)), "fits": dict, "per_layer": dict, "chosen": dict, "provenance": dict}


def _fail(path: str, problem: str) -> MoespecError:
    return MoespecError(f"{path}: {problem}")


def _check_n_map(path: str, name: str, values: Any, ns: list[int]) -> None:
    """A {n: positive number} map whose keys are strings of timed pass sizes."""
    if not isinstance(values, dict):
        raise _fail(path, f"{name} must be an object keyed by n")
    for key, value in values.items():
        if key not in {str(n) for n in ns}:
            raise _fail(path, f"{name} has key {key!r}, not a timed pass size n in {ns}")
        if not (is_number(value) and value > 0):
            raise _fail(path, f"{name}.{key} = {value!r} must be a positive finite number")


def _check_fits(path: str, doc: dict[str, Any], layer: str, fits: dict[str, Any]) -> None:
    """A layer's fits (null where not identifiable) name kernels of the bench, hold their kind's coefficients as
    finite numbers, and the layer's expert bytes b, which the fits' regressors read, are positive."""
    for kernel, fit in fits.items():
        if fit is None:
            continue
        kind = field(doc, path, f"kernels.{kernel}.kind", str)
        if kind not in COEF_KEYS or not isinstance(fit, dict):
            raise _fail(path, f"fits.{layer}.{kernel} must be an object of a slot or dedup kernel's fit")
        for key in COEF_KEYS[kind]:
            field(doc, path, f"fits.{layer}.{kernel}.{key}")
        positive(doc, path, f"expert_bytes.{layer}")


def _check_per_layer(path: str, doc: dict[str, Any], ns: list[int]) -> None:
    """per_layer (what plan's sums (22) and the report read) keyed by the timed layers and kernels, fits by timed
    layers; every operation time a finite number, positive where measured; a prediction null only where its
    kernel has no fit (too few pass sizes identify it); one_token_s null only where n = 1 was not timed, its
    prediction a finite number wherever it is not null."""
    layers = {str(layer) for layer in doc["layers"]}
    if set(doc["per_layer"]) != layers or not set(doc["fits"]) <= layers:
        raise _fail(path, f"per_layer and fits must be keyed by the timed layers {sorted(layers)}, got "
                          f"{sorted(doc['per_layer'])} and {sorted(doc['fits'])}")
    for layer in doc["per_layer"]:
        fits = doc["fits"].get(layer) or {}
        if not isinstance(fits, dict):
            raise _fail(path, f"fits.{layer} must be an object keyed by kernel")
        _check_fits(path, doc, layer, fits)
        for kernel in field(doc, path, f"per_layer.{layer}.kernels", dict):
            if kernel not in doc["kernels"]:
                raise _fail(path, f"per_layer.{layer}.kernels.{kernel}: no kernel of its kernels")
            times = field(doc, path, f"per_layer.{layer}.kernels.{kernel}", dict)
            _check_n_map(path, f"per_layer.{layer}.kernels.{kernel}", dict.fromkeys(times, 1), ns)
            for n in times:
                for key, measured in OP_TIMES.items():
                    where = f"per_layer.{layer}.kernels.{kernel}.{n}.{key}"
                    if measured or fits.get(kernel) is not None or not isinstance(times[n], dict) or \
                            times[n].get(key) is not None:
                        (positive if measured else field)(doc, path, where)
        one = doc["per_layer"][layer].get("one_token_s")
        if one is not None or 1 in ns:
            positive(doc, path, f"per_layer.{layer}.one_token_s.measured_s")
            if fits.get(field(doc, path, f"per_layer.{layer}.one_token_s.kernel", str)) is not None or \
                    one.get("predicted_s") is not None:
                field(doc, path, f"per_layer.{layer}.one_token_s.predicted_s")


def check_pass_sizes(bench: Mapping[str, Any], where: str, kmax: int) -> None:
    """Refuse, naming the pass sizes it has and those it needs, a bench too narrow for a plan up to draft length
    `kmax`: the plan reads the operation times at n = 1..kmax + 1, and the fits (4), (E.1) need chosen ids at two
    pass sizes n >= 2 at least."""
    need = range(1, max(kmax + 1, 3) + 1)
    has = sorted(bench["n"])
    if any(n not in has for n in need):
        raise MoespecError(f"{where}: covers too few pass sizes: it timed {len(has)} (n = "
                           f"{', '.join(map(str, has))}); a plan with --kmax {kmax} needs n up to "
                           f"{need[-1]}, all {len(need)} of 1..{need[-1]} (kmax + 1, and two n >= 2 for the fits (4), "
                           f"(E.1)): rerun "
                           f"`moespec bench` with --n 1-{need[-1]}")


class Bench(Record):
    """A validated bench.json: read it as its JSON object; the typed accessors are what a plan decides on."""

    @property
    def pair(self) -> list[str]:
        """The kernels that play per-slot and dedup for a plan: the pair timed, ours in version-1 files."""
        return self.get("pair") or list(KERNELS)

    @property
    def ceiling_gbps(self) -> float:
        return float(self["ceiling_gbps"])

    @property
    def r(self) -> dict[int, float]:
        """r(n) = beta_dedup / beta_slot by pass size."""
        return self.n_map(self["r"])

    @property
    def u(self) -> dict[int, float]:
        """u(n) = E_dedup / E_slot by pass size."""
        return self.n_map(self["u"])


def load_bench(path: str | Path) -> Bench:
    """Read and validate a bench.json (format, version, required keys and types, n ranges, positive bandwidths,
    model name, device kind); returns the document as stored (n keys are strings), a version-1 file with the
    LEGACY_KEYS it lacks. Raises MoespecError naming the file."""
    where = str(path)
    doc = read_json(path, "bench")
    problem = format_problem(doc, "bench", FORMAT_NAME, FORMAT_VERSION)
    if problem:
        raise _fail(where, problem)
    for key, kind in REQUIRED.items():
        if key not in doc:
            raise _fail(where, f"missing key {key!r}")
        if isinstance(doc[key], bool) or not isinstance(doc[key], kind):
            raise _fail(where, f"{key} has the wrong type ({type(doc[key]).__name__})")
    if not doc["model"] or (isinstance(doc.get("spec"), dict) and doc["spec"].get("name") != doc["model"]):
        raise _fail(where, f"model name {doc['model']!r} is empty or differs from its spec's")
    if doc["dtype"] not in BENCH_DTYPES:
        raise _fail(where, f"dtype {doc['dtype']!r} is not one of {', '.join(BENCH_DTYPES)}")
    pair = doc.get("pair")
    if pair is not None and not (isinstance(pair, list) and len(pair) == 2 and all(k in doc["kernels"] for k in pair)):
        raise _fail(where, f"pair {pair!r} must name a per-slot and a dedup kernel of its kernels")
    for key, value in LEGACY_KEYS.items():
        doc.setdefault(key, value)
    if doc["device_kind"] not in DEVICE_KINDS:
        raise _fail(where, f"device_kind {doc['device_kind']!r} is not one of {', '.join(DEVICE_KINDS)}")
    if not isinstance(doc["ceiling_kind"], str) or not doc["ceiling_kind"]:
        raise _fail(where, f"ceiling_kind {doc['ceiling_kind']!r} must name what the ceiling measures")
    batch = doc["batch"]
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= BATCH_LIMIT:
        raise _fail(where, f"batch must be an integer in 1..{BATCH_LIMIT}, got {batch!r}")
    ns = doc["n"]
    if not ns or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= batch * N_LIMIT or n % batch
                     for n in ns):
        raise _fail(where, f"n must list pass sizes B n, n in 1..{N_LIMIT}, for B = {batch}, got {ns!r}")
    if not doc["layers"] or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < LAYERS_LIMIT
                                for i in doc["layers"]):
        raise _fail(where, f"layers must list MoE layer indices in 0..{LAYERS_LIMIT - 1}, got {doc['layers']!r}")
    if not (is_number(doc["ceiling_gbps"]) and doc["ceiling_gbps"] > 0):
        raise _fail(where, f"ceiling_gbps = {doc['ceiling_gbps']!r} must be positive")
    peak = doc.get("matmul_peak_gflops")
    if peak is not None and not (is_number(peak) and peak > 0):
        raise _fail(where, f"matmul_peak_gflops = {peak!r} must be a positive number")
    for name, entry in doc["kernels"].items():
        if not isinstance(entry, dict):
            raise _fail(where, f"kernels.{name} must be an object")
        _check_n_map(where, f"kernels.{name}.beta_gbps", entry.get("beta_gbps"), ns)
    _check_n_map(where, "r", doc["r"], ns)
    _check_n_map(where, "u", doc["u"], ns)
    for kernel, value in doc["eps"].items():
        if kernel not in doc["kernels"]:
            raise _fail(where, f"eps.{kernel}: no kernel of its kernels ({', '.join(doc['kernels'])})")
        if not (is_number(value) and value >= 0):
            raise _fail(where, f"eps.{kernel} = {value!r} must be a finite number >= 0")
    if doc["crossover"] is not None and doc["crossover"] not in ns:
        raise _fail(where, f"crossover {doc['crossover']!r} is not a timed pass size")
    _check_per_layer(where, doc, ns)
    protocol = doc.get("protocol", {})
    for key, least, most in PROTOCOL_COUNTS:
        value = protocol.get(key, least) if isinstance(protocol, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            raise _fail(where, f"protocol.{key} = {value!r} must be a whole number in {least}..{most:,}")
    check_level_record(doc, where)
    check_contention_record(doc.get("contention"), where, "contention")
    small, resumed = doc.get("too_small"), doc.get("resumed_rounds", 0)
    if small is not None and not (isinstance(small, dict) and isinstance(small.get("flag"), bool)):
        raise _fail(where, f"too_small must be an object whose flag is true or false, got {small!r}")
    if isinstance(resumed, bool) or not isinstance(resumed, int) or resumed < 0:
        raise _fail(where, f"resumed_rounds = {resumed!r} must be a whole number >= 0")
    retimed = doc.get("retimed", [])
    if not isinstance(retimed, list) or not all(
            isinstance(f, dict) and f.get("layer") in doc["layers"] and f.get("n") in ns
            and f.get("kernel") in doc["kernels"]
            and all(is_number(f.get(k)) and f[k] > 0 for k in ("first_s", "seconds")) for f in retimed):
        raise _fail(where, "retimed must list calls of a timed layer, pass size and kernel with positive times")
    placement, experts = doc.get("placement", {}), (doc.get("spec") or {}).get("num_experts")
    if not isinstance(placement, dict) or not all(
            key in {str(layer) for layer in doc["layers"]} and placement_ok(value, experts)
            for key, value in placement.items()):
        raise _fail(where, f"placement must map timed layers to null or one positive ratio per expert ({experts})")
    _check_prediction(where, doc)
    return Bench(doc, path)


def placement_ok(unit: Any, experts: int) -> bool:
    """Whether `unit` is a layer's placement: null, or one positive finite ratio per expert."""
    return unit is None or (isinstance(unit, list) and isinstance(experts, int) and len(unit) == experts
                            and all(is_number(v) and v > 0 for v in unit))


def _check_prediction(where: str, doc: Mapping[str, Any]) -> None:
    """`predicted` true or false where present; a predicted bench's `prediction` with a positive ceiling and a stated
    error >= 0 for every kernel of its eps."""
    predicted = doc.get("predicted", False)
    if not isinstance(predicted, bool):
        raise _fail(where, f"predicted must be true or false, got {predicted!r}")
    if not predicted:
        return
    positive(doc, where, "prediction.ceiling_gbps")
    for kernel in doc["eps"]:
        if field(doc, where, f"prediction.error.{kernel}") < 0:
            raise _fail(where, f"prediction.error.{kernel} must be >= 0")
