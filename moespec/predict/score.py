"""Scoring: does a plan (plan.json) hold up against an engine's whole-model runs (runs.json)?

The plan predicts, from the expert-op bench and a routing trace alone, the whole-model verify time tau_p(n) of
each kernel (22), the saving S(n) = tau_slot(n) - tau_dedup(n), the crossover (the smallest n from which the
saving stays positive), and per acceptance a the best draft length k_hat*(a) with its speedup and band (21).
The runs measure the same quantities on the engine. The paper's six scoring rules (Table 8, Section 4.4), fixed
before any whole-model run, decide whether the prediction holds:

 1. crossover within one. Measured crossover: the smallest n from which the MEDIAN of the measured saving is
    positive at every larger measured n (the point estimate, as in Section 2); predicted: the same on the plan's
    predicted saving. "No crossover" counts as n = n_top + 1 (10 over n = 2..9), so a measured crossover at 9 is
    within one of none. Both are read over the same n, 2..n_top, n_top <= 9 the largest n up to which both files
    hold every n (the plan's own `crossover` is the same number when it covers n = 2..9; it is reported too).
 2. k_hat* within one at >= 9 of 11 acceptances. Measured k*(a) = argmax over measured k of tokens_per_s (the
    smallest k on ties, as theory.best_draft_length); predicted k_hat*(a) from the plan's table. Holds when the
    count within one is >= ceil(9/11 x acceptances scored).
 3. throughput lost at k_hat* <= 6% at every acceptance: loss(a) = 1 - T(k_hat*(a)) / max_k T(k), measured T.
 4. sign of S(n) right wherever its 95% interval excludes 0: at each n whose measured bootstrap interval [lo, hi]
    excludes 0, the plan's predicted saving must have the measured sign (a predicted 0 has none). Vacuously true
    when no interval excludes 0 (reported as "vacuous").
 5. verify time within 15% for both kernels: max over kernel and n = 2..n_top of |tau_hat - tau_meas| / tau_meas.
    n = 1 is left out, as in the paper: tau_hat(1) is the measured one-token time the plan starts from.
 6. best speedup inside (21), as the paper scores it: measured best speedup max_k T(k)/T(0) inside the band (21)
    of the planned speedup at k_hat* at every acceptance, with delta the largest relative error of the version's
    predicted step time against the measured one over the measured k (Table 8; moespec.predict.step_error; per
    policy, the largest reported; not applicable where the runs recorded no step times). An acceptance whose
    delta is >= 1 has no band and is not decidable, reported as "no band". The rule holds when every decidable
    acceptance is inside and at least one is decidable (a rule with nothing to decide does not hold, unlike rule
    4, whose vacuous case is the paper's).
    Variant `speedup_band_eps` (reported under `variants`, not one of the six): the same with the plan's own
    bands, delta fixed in advance from the bench's eps (plan.json delta_steps; a calibrated row may have none).

Rules 2, 3 and 6 compare throughput per policy, at the rate the plan names (plan.json throughput_rate,
moespec.formats.runsfile.RATES): counted, every emitted token over the steps' measured time, as the paper scores, or
computed, G_a(k) over the cell's median step time; `--rate` scores the other, and is then not pre-registered. Each
policy both files hold is scored and reported; the verdict is AUTO's when the runs measured it (the policy the plan
recommends: at each n the kernel with the smaller predicted time), else every fixed policy measured must hold. The
throughput rows use the nominal acceptance a (the oracle draft makes acceptance geometric at rate a);
realized_acceptance is not read.

Honesty: the score records the plan's sha256 (of the file's bytes), its creation time and the time the runs
started; "pre_registered" is true only when the runs ran exactly this plan (`run --plan` records the plan's
sha256 in runs.json, and it equals the sha256 of the plan scored) and the plan was created strictly before the runs
started (timestamps have whole seconds, so the same second does not count); "pre_registration" says why or why
not (the runs recorded no plan, or another plan's sha256, or the plan is not older). The two files must name the
same model, device kind and dtype.

Versions (--version): a plan carries its PREDICTION (from the bench and trace alone) and, when made with
--runs, its CALIBRATED version and, where those runs timed the pass with the expert operation taken out, its
WHOLE-PASS version (moespec.predict.plan). Every rule reads the chosen version's keys, nothing of another; the
default is the prediction. Asking for a version the plan lacks is an error. pre_registered is decided the same
way for all (the calibrated and whole-pass versions are built from an engine's runs, so they are pre-registered
only against runs started after the plan was made).

What score reads from runs.json (written by `moespec run`):
  format "moespec-runs", format_version 1, model, device_kind, dtype, depth (int)
  verify_time_s  {slot|dedup: {n: median seconds}}   n as strings
  saving_s       {n: {median, lo, hi}}                S(n) with its 95% bootstrap interval, seconds
  throughput     [{policy: slot|dedup|auto, k, a, tokens_per_s, ...}], one row per (policy, k, a); every scored
                 (policy, a) needs k = 0 (plain decoding) and the plan's k_hat*
  provenance     {timestamp: ISO time the runs started, ...}
From plan.json (moespec.formats.planfile): model, device_kind, dtype, provenance.timestamp, and per version (VERSIONS):
                 prediction                    calibrated
  verify time    tau_hat.{slot,dedup}.{n}      tau_calibrated.{slot,dedup}.{n}
  saving         saving.{n}.predicted_s        saving.{n}.calibrated_s
  crossover      crossover                     crossover_calibrated          (reported, not scored)
  table rows     table                         table_calibrated              {a, policy, k_hat, speedup_lo, speedup_hi}
  band delta     delta_steps.prediction        delta_steps.calibrated        {policy: d}, d null where no band
  (whole-pass: as calibrated, with whole_pass in place of calibrated and delta_steps.whole-pass)

`--json` prints one document:
  rules           six {"name", "rule", "value", "holds", ...}, in Table 8's order; name and its details:
                    crossover        value: measured n or null; predicted, plan_crossover, scored_n, none_counts_as
                    k_hat            value: count within one; of, needed, policy, per_policy
                    throughput_loss  value: largest loss (fraction); at_a, limit, policy, per_policy
                    saving_sign      value: right signs; of (intervals excluding 0), vacuous, per_n
                    verify_time      value: largest relative error; at {kernel, n}, limit, errors {kernel: {n: e}}
                    speedup_band     value: acceptances inside; of (decidable ones), no_band (count), delta (the
                                     largest measured step-time error), delta_by_policy, policy, per_policy; per
                                     acceptance inside is null at no band
  variants        [speedup_band_eps]: rule 6 with the plan's bands (delta from eps, null: no band), same keys
                  per_policy: {policy: {value, holds, per_acceptance: [...]}}, policy: the policies the verdict uses
  version         "prediction" or "calibrated": the plan version scored
  rate            {name: counted|computed, key: the runs' row key read, plan: the plan's}: the throughput scored
  all_hold        all six hold
  plan_sha256, plan_created, runs_started, pre_registered, pre_registration (the reason, one line),
  runs_plan_sha256 (the plan the runs ran, null if none)
  model, device_kind, dtype, depth
  verdict         the plain answer (moespec.predict.verdict.Verdict.to_json): {version, policy, kernel_by_n: [{n,
                  choice, evidence, saving_s, lo_s, hi_s, auto}], draft: [{a, profile, k, speedup, lo, hi,
                  measured_k}], warnings, lines}, decided by these runs' S(n) intervals where they hold one
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Sequence

import numpy as np

from moespec import MoespecError, theory
from moespec.defaults import KERNELS, N_MAX, POLICIES
from moespec.formats.files import NUMBER, timestamp
from moespec.formats.files import field as _field
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import RATES, Runs, load_runs
from moespec.predict.acceptance import (
    DEFAULT_VERSION,
    SLACK,
    UNNAMED_RATE,
    VERSIONS,
    Keys,
    acceptance_rows,
    plan_rate,
)
from moespec.predict.rules import (
    BAND_KEYS,
    CROSSOVER_WITHIN,
    VERIFY_LIMIT,
    Verdict,
    judge_band,
    judge_k_hat,
    judge_loss,
    sign_verdict,
    verify_verdict,
)
from moespec.predict.step_error import measured_step_times, paper_rows
from moespec.predict.verdict import Verdict as PlainVerdict
from moespec.predict.verdict import build_verdict

# The machine's streaming bandwidth differing by more than rule 5's own tolerance between the plan's measured inputs
# and the scored runs: times that move with the bandwidth cannot then be within 15% but by luck, so score says so.
MACHINE_DRIFT = VERIFY_LIMIT


def _check_pair(plan: dict[str, Any], runs: dict[str, Any], plan_path: str, runs_path: str) -> None:
    """A plan scores only the runs of its own model, device kind, dtype and number of MoE layers (a plan's sums
    (22) cover `coverage.num_moe_layers` layers; an engine may run a model with fewer)."""
    for key in ("model", "device_kind", "dtype"):
        mine, theirs = _field(plan, plan_path, key, str), runs[key]
        if mine != theirs:
            raise MoespecError(f"{plan_path} is a plan for {key} {mine!r} but {runs_path} measured {theirs!r}")
    covered, ran = plan.get("coverage", {}).get("num_moe_layers"), runs.get("moe_layers")
    if covered is not None and ran is not None and covered != ran:
        raise MoespecError(f"{plan_path} plans {covered} MoE layers but {runs_path} ran {ran}: make the plan with "
                           f"--moe-layers {ran} (or --runs from such a run)")


def _keys(plan: dict[str, Any], version: str, plan_path: str) -> Keys:
    """The chosen version's keys, after checking the plan holds that version."""
    if version not in VERSIONS:
        raise MoespecError(f"version {version!r} is not one of {', '.join(VERSIONS)}")
    keys = VERSIONS[version]
    if keys.table not in plan:
        raise MoespecError(f"{plan_path} has no {version} version (the plan was made without --runs, or from runs "
                           f"that did not time the pass with the expert operation taken out); score "
                           f"--version prediction, or make the plan with --runs")
    return keys


def _delta(plan: dict[str, Any], keys: Keys, plan_path: str) -> float | None:
    """The largest step-time delta over policies of the version's bands; None when no policy has a band."""
    ds = _field(plan, plan_path, f"delta_steps.{keys.delta}", dict)
    for policy, d in ds.items():
        if d is not None and (isinstance(d, bool) or not isinstance(d, NUMBER) or not np.isfinite(d)):
            raise MoespecError(f"{plan_path}: delta_steps.{keys.delta}.{policy} has the wrong type or value ({d!r})")
    known = [d for d in ds.values() if d is not None]
    return max(known) if known else None


def _scored_n(plan: dict[str, Any], runs: Runs, runs_path: str, plan_path: str = "plan") -> list[int]:
    """n = 2..n_top: n_top <= N_MAX the largest n up to which both files hold the saving at every n (the verify
    times, for runs of one kernel)."""
    measured = _field(runs, runs_path, "saving_s", dict)
    kernels = runs.kernels
    if not kernels:
        raise MoespecError(f"{runs_path}: verify_time_s holds neither kernel ({', '.join(KERNELS)})")
    if not measured and len(kernels) == 1:
        measured = _field(runs, runs_path, f"verify_time_s.{kernels[0]}", dict)
    ns = []
    for n in range(2, N_MAX + 1):
        if str(n) not in plan["saving"] or str(n) not in measured:
            break
        ns.append(n)
    if not ns:
        raise MoespecError(f"{runs_path} and {plan_path} share no saving at n = 2: nothing to score")
    return ns


# ---- rules on n ----------------------------------------------------------------------------------------------
def _or(n: int | None, none: int) -> int:
    return none if n is None else n


def not_applicable(name: str, rule: str, runs: Runs) -> Verdict:
    """A rule on the saving S(n) for runs of one kernel: there is no measured saving to score."""
    kernel = ", ".join(runs.kernels)
    return Verdict(name, rule, None, None, {"reason": f"the runs measured one expert kernel ({kernel})"},
                   ("-", f"not applicable: the engine has one expert kernel ({kernel})"))


def crossover_rule(plan: dict[str, Any], runs: Runs, ns: list[int], plan_path: str,
                   runs_path: str, keys: Keys) -> Verdict:
    if len(runs.kernels) == 1:
        return not_applicable("crossover", "crossover within one", runs)
    predicted = theory.crossover({n: _field(plan, plan_path, f"saving.{n}.{keys.saving}") for n in ns})
    measured = theory.crossover({n: _field(runs, runs_path, f"saving_s.{n}.median") for n in ns})
    plan_crossover = _field(plan, plan_path, keys.crossover, (int, type(None)))
    none = ns[-1] + 1
    holds = abs(_or(predicted, none) - _or(measured, none)) <= CROSSOVER_WITHIN
    shown = tuple("none" if c is None else f"n = {c}" for c in (predicted, measured))
    return Verdict("crossover", "crossover within one", measured, holds,
                   {"predicted": predicted, "plan_crossover": plan_crossover, "scored_n": ns,
                    "none_counts_as": none}, (f"{shown[0]} (n = 2..{ns[-1]})", shown[1]))


def sign_rule(plan: dict[str, Any], runs: Runs, ns: list[int], plan_path: str,
              runs_path: str, keys: Keys) -> Verdict:
    rule = "sign of S(n) right wherever its 95% interval excludes 0"
    if len(runs.kernels) == 1:
        return not_applicable("saving_sign", rule, runs)
    intervals = {n: tuple(_field(runs, runs_path, f"saving_s.{n}.{key}") for key in ("lo", "hi")) for n in ns}
    return sign_verdict(rule, {n: (lo, hi, lambda n=n: _field(plan, plan_path, f"saving.{n}.{keys.saving}"))
                               for n, (lo, hi) in intervals.items()})


def verify_rule(plan: dict[str, Any], runs: Runs, ns: list[int], plan_path: str,
                runs_path: str, keys: Keys) -> Verdict:
    kernels = runs.kernels
    errors = {p: {str(n): _relative_error(_field(plan, plan_path, f"{keys.tau}.{p}.{n}"), runs, runs_path, p, n)
                  for n in ns} for p in kernels}
    verdict = verify_verdict("verify time within 15%, both kernels", errors)
    verdict.shown = (f"{keys.tau} {', '.join(kernels)}, n = 2..{ns[-1]}", verdict.shown[1])
    return verdict


def _relative_error(predicted: float, runs: dict[str, Any], runs_path: str, kernel: str, n: int) -> float:
    """|tau_hat - tau_meas| / tau_meas, after checking the measured time is positive."""
    tau = _field(runs, runs_path, f"verify_time_s.{kernel}.{n}")
    if tau <= 0:
        raise MoespecError(f"{runs_path}: verify_time_s.{kernel}.{n} = {tau} is not a positive time")
    return abs(predicted - tau) / tau


# ---- rules on acceptances ------------------------------------------------------------------------------------
def _by_policy(name: str, rule: str, per_policy: dict[str, list[dict]], keys: Sequence[str],
               judge: Callable[[list[dict]], tuple[Any, bool, dict[str, Any], str]], predicted: str,
               extra: dict[str, Any] | None = None) -> Verdict:
    """A rule judged per policy (judge -> value, holds, details, text); the verdict is AUTO's when measured, else
    every fixed policy's; the value is that of the first deciding policy that fails, else of the first; the
    measured cell lists every policy scored."""
    judged = {p: judge(rows) for p, rows in per_policy.items()}
    deciding = ["auto"] if "auto" in judged else [p for p in POLICIES if p in judged]
    failing = [p for p in deciding if not judged[p][1]]
    value, _, detail, _ = judged[(failing or deciding)[0]]
    text = "; ".join(f"{p}: {judged[p][3]}" for p in POLICIES if p in judged)
    per = {p: {"value": v, "holds": h, **d, "per_acceptance": [{k: r[k] for k in ("a", *keys)}
                                                              for r in per_policy[p]]}
           for p, (v, h, d, _) in judged.items()}
    return Verdict(name, rule, value, not failing, {**detail, **(extra or {}), "policy": deciding,
                                                      "per_policy": per}, (predicted, text))


def speedup_rule(plan: Mapping[str, Any], runs: Runs, plan_path: str, runs_path: str, keys: Keys,
                 per_policy: dict[str, list[dict]]) -> Verdict:
    """Rule 6 as the paper scores it (moespec.predict.step_error): the band (21) of the planned speedup at delta, the
    largest relative error of the version's predicted step time against the measured one; not applicable where
    the runs recorded no step times."""
    rows = runs["throughput"] or runs.get("throughput_draft_model") or []
    suffix = keys.table.removeprefix("table")
    steps = plan.get(f"step_times{suffix}")
    for policy in per_policy:
        V = steps.get(policy) if isinstance(steps, Mapping) else None
        if not isinstance(V, list) or len(V) != plan["kmax"] + 1 or \
                not all(isinstance(v, NUMBER) and not isinstance(v, bool) and 0 < v < math.inf for v in V):
            raise MoespecError(f"{plan_path}: step_times{suffix}.{policy} must be kmax + 1 positive step times")
    scored, deltas = paper_rows(per_policy, steps, measured_step_times(rows, runs_path), SLACK)
    rule = "best speedup inside (21), delta the largest relative error of the predicted step time"
    if not scored:
        return not_applicable("speedup_band", rule, runs)
    worst = max(deltas.values())
    return _by_policy("speedup_band", rule, scored, BAND_KEYS, judge_band, f"band (21), delta = {worst:.3g} measured",
                      {"delta": worst, "delta_by_policy": deltas})


@dataclass
class Score:
    """The six verdicts and what makes them honest: which plan (sha256), written when, against runs started when."""
    rules: list[Verdict]
    plan_sha256: str
    plan_created: datetime
    runs_started: datetime
    runs: dict[str, Any]
    version: str = DEFAULT_VERSION
    runs_plan_sha256: str | None = None  # the plan the runs ran (run --plan), None when they ran none
    plan_ceiling_gbps: dict[str, float] | None = None  # the plan's inputs_ceiling_gbps (absent in older plans)
    verdict: PlainVerdict | None = None  # the plain answer from the plan and these runs (moespec.predict.verdict)
    variants: list[Verdict] = field(default_factory=list)  # named variants of the rules, reported, not counted
    rate: str = UNNAMED_RATE  # the throughput rate rules 2, 3 and 6 read
    plan_rate: str = UNNAMED_RATE  # the one the plan pre-registered

    @property
    def machine(self) -> dict[str, Any] | None:
        """The streaming-read ceiling of the plan's inputs beside the scored runs' median one, their largest
        relative difference and whether it exceeds MACHINE_DRIFT (None where either file lacks them)."""
        ran = self.runs.get("ceiling_gbps") or {}
        if not self.plan_ceiling_gbps or not ran:
            return None
        runs_gbps = float(sorted(ran.values())[len(ran) // 2])
        drift = max(abs(runs_gbps / g - 1) for g in self.plan_ceiling_gbps.values())
        return {"plan_inputs_gbps": self.plan_ceiling_gbps, "runs_gbps": runs_gbps, "drift": drift,
                "drifted": drift > MACHINE_DRIFT}

    @property
    def machine_note(self) -> str | None:
        """One line when the machine was in another state for the plan's inputs than for the runs."""
        m = self.machine
        if m is None or not m["drifted"]:
            return None
        inputs = ", ".join(f"{k} {v:.1f}" for k, v in m["plan_inputs_gbps"].items())
        return (f"machine drift: the plan's inputs were measured at a streaming ceiling of {inputs} GB/s, these runs "
                f"at {m['runs_gbps']:.1f} GB/s ({m['drift']:.0%} apart, more than the {MACHINE_DRIFT:.0%} of rule 5): "
                f"the time rules compare two states of the machine")

    @property
    def all_hold(self) -> bool:
        """Every applicable rule holds (runs of one kernel leave the two rules on the saving out)."""
        return all(r.holds is not False for r in self.rules)

    @property
    def applicable(self) -> int:
        return sum(r.holds is not None for r in self.rules)

    @property
    def pre_registered(self) -> bool:
        """The runs ran exactly this plan, made before they started."""
        return self.runs_plan_sha256 == self.plan_sha256 and self.plan_created < self.runs_started \
            and self.rate == self.plan_rate

    @property
    def pre_registration(self) -> str:
        """Whether the plan was pre-registered for these runs, and why (one line)."""
        if self.runs_plan_sha256 is None:
            return "not pre-registered: the runs recorded no plan (run --plan PLAN records its sha256)"
        if self.runs_plan_sha256 != self.plan_sha256:
            return f"not pre-registered: the runs ran another plan (sha256 {self.runs_plan_sha256})"
        if self.rate != self.plan_rate:
            return f"not pre-registered: scored on the {self.rate} throughput, the plan named the {self.plan_rate}"
        if not self.plan_created < self.runs_started:
            return f"not pre-registered: the plan was created {self.plan_created.isoformat()}, not before the " \
                   f"runs started {self.runs_started.isoformat()}"
        return f"pre-registered: the runs ran this plan (same sha256), created {self.plan_created.isoformat()}, " \
               f"before they started {self.runs_started.isoformat()}"

    def to_json(self) -> dict[str, Any]:
        """The `--json` document (module docstring)."""
        return {"rules": [r.to_json() for r in self.rules], "version": self.version, "all_hold": self.all_hold,
                "rate": {"name": self.rate, "key": RATES[self.rate], "plan": self.plan_rate},
                "applicable": self.applicable,
                "plan_sha256": self.plan_sha256, "plan_created": self.plan_created.isoformat(),
                "runs_started": self.runs_started.isoformat(), "pre_registered": self.pre_registered,
                "pre_registration": self.pre_registration, "runs_plan_sha256": self.runs_plan_sha256,
                "machine": self.machine, "verdict": None if self.verdict is None else self.verdict.to_json(),
                "variants": [v.to_json() for v in self.variants],
                **{key: self.runs[key] for key in ("model", "device_kind", "dtype", "depth")}}


def score(plan: Mapping[str, Any], runs: Mapping[str, Any], plan_sha256: str, plan_path: str = "plan",
          runs_path: str = "runs", version: str = DEFAULT_VERSION, warnings: Sequence[str] = (),
          rate: str | None = None) -> Score:
    """The six rules of a validated plan (load_plan) against validated runs (load_runs), reading the plan's
    `version` only, rules 2, 3 and 6 at the throughput `rate` (default the plan's), and the verdict they give
    (moespec.predict.verdict; `warnings`: the caller's lines about the inputs)."""
    rate = plan_rate(plan) if rate is None else rate
    if rate not in RATES:
        raise ValueError(f"rate must be one of {', '.join(RATES)}, got {rate!r}")
    runs = runs if isinstance(runs, Runs) else Runs(dict(runs), runs_path)
    started = runs.started  # checked before any rule is scored
    runs.throughput()  # every row valid before any rule reads one
    keys = _keys(plan, version, plan_path)
    _check_pair(plan, runs, plan_path, runs_path)
    ns = _scored_n(plan, runs, runs_path, plan_path)
    delta = _delta(plan, keys, plan_path)
    per_policy = acceptance_rows(plan, runs, runs_path, keys, rate)
    band = "band (21), delta = " + ("none (no band)" if delta is None else f"{delta:.3g}")
    rules = [
        crossover_rule(plan, runs, ns, plan_path, runs_path, keys),
        _by_policy("k_hat", "k_hat* within one at >= 9 of 11 acceptances", per_policy, ("k_hat", "k_star"),
                   judge_k_hat, f"k_hat*(a) of the plan's {keys.table}"),
        _by_policy("throughput_loss", "throughput lost at k_hat* <= 6% at every acceptance", per_policy,
                   ("k_hat", "k_star", "loss"), judge_loss, "at most 6%"),
        sign_rule(plan, runs, ns, plan_path, runs_path, keys),
        verify_rule(plan, runs, ns, plan_path, runs_path, keys),
        speedup_rule(plan, runs, plan_path, runs_path, keys, per_policy),
    ]
    variant = _by_policy("speedup_band_eps", "best speedup inside (21), delta fixed in advance from eps", per_policy,
                         BAND_KEYS, judge_band, band, {"delta": delta})
    result = Score(rules, plan_sha256, timestamp(plan, plan_path), started, runs, version, runs.plan_sha256,
                   plan.get("inputs_ceiling_gbps"), variants=[variant], rate=rate, plan_rate=plan_rate(plan))
    result.verdict = build_verdict(plan, runs, result, warnings, plan_path=plan_path, runs_path=runs_path)
    return result


def score_files(plan_path: str, runs_path: str, version: str = DEFAULT_VERSION, warnings: Sequence[str] = (),
                rate: str | None = None) -> Score:
    """Load and score: the plan's sha256 is of the exact bytes read."""
    plan = load_plan(plan_path)
    return score(plan, load_runs(runs_path), plan.sha256, plan_path, runs_path, version, warnings, rate)


