"""plan.json: the results file of `moespec plan`, its typed record `Plan` and its only loader `load_plan`, which
validates it; every reader (run --plan, score, report, demo) goes through it. What the numbers mean is in
moespec.predict.plan, which builds it.

plan.json (FORMAT_NAME, FORMAT_VERSION; n and k keys are strings):
  model, device, device_kind, dtype   the bench's ("cpu" or "cuda": a plan holds for the device its bench timed)
  eps (engine eps: max over slot and dedup), delta = eps/(1-eps) (relative error of each expert-op time (17)),
  kmax, tau1_s, draft_time_s [h(0..kmax)]
  coverage     {timed_layers, num_moe_layers (L, the MoE layers the sums cover), model_moe_layers, scale, rule}
  basis        {kind, why}: "bench" (the versions below on the bench's expert-op times, (22)), or "runs"
               (moespec.predict.measured: the bench is too small to time, `why` says how, and every version's
               times are --runs' measured verify times of slot and dedup with their 95% intervals as bounds; eps
               and delta 0; saving.{n} is the runs' S(n) with its interval, r and margin null; AUTO and the
               crossover run dedup only where that interval lies above 0); absent in version-1 plans: "bench"
  crossover    n or null;  crossover_measured: the same on the measured-time version
  kernel_by_n  {n: "slot"|"dedup"} for n = 1..kmax+1 (the AUTO policy)
  kernels      {slot: name, dedup: name}: the bench kernels the plan's slot and dedup are (newer files): ours,
               or ggml's pair (ggml-per-slot, ggml-mul_mat_id) for a plan of llama.cpp from ggml's own times
  tau_hat      {slot|dedup|auto: {n: s}} prediction (22);  tau_measured: the same of the measured-time version
               (slot and dedup only in plans before it was scorable)
  step_times_measured, staircase_measured, table_measured (version "measured-time")   the measured-time version:
               (22) with the bench's measured per-window op times in place of the fits (the paper's primary
               version); plans on runs (basis "runs") and older plans have none
  saving       {n: {predicted_s, measured_s, band_s, lo_s, hi_s, u, r, margin, decided, byte_model, two_bandwidth}}
  delta_steps  {version: {policy: d}}: (1-d) V <= V_hat <= (1+d) V, the delta of the version's bands (21); d
               is null where the error bound reaches half of V(k) (a noisy bench, a calibration): no band, and
               that version's rows carry speedup_lo = speedup_hi = null
  step_times   {policy: [V_hat(0..kmax)]}
  staircase    {policy: {k_at_zero, step_points: [a_1..a_kmax], intervals: [{k, lo, hi}]}}: k_hat* = k on (lo, hi]
  table        [{a, policy, version, k_hat, speedup, speedup_lo, speedup_hi}] per acceptance of the paper's grid
               and policy; version "prediction" (a row without it is one)
  reuse_threshold {depth, rho_bar: {k: v}, rho_star: {a: {k: v}}, k_hat_bytes: {a: k}}  (16)
  inputs_ceiling_gbps {bench, runs}: the streaming-read ceiling its bench and its --runs were measured at (score
               compares it with the scored runs'; absent in version-1 plans)
  pass_bytes   {slot|dedup: {n: bytes}}: what a verify pass of n tokens reads in the one-bandwidth byte model (16),
               D + n m W + kv(n-1) per-slot and D + E_dedup(n) + kv(n-1) deduplicated, for the MoE layers covered;
               the verdict compares measured verify times with these bytes over the ceiling (absent in version-1 plans)
  verdict      the plain answer, printed first (moespec.predict.verdict.Verdict.to_json): {version, policy,
               kernel_by_n: [{n, choice ("dedup", "per-slot" or moespec.predict.verdict.SAME, "no measurable
               difference ..."),
               evidence ("measured": --runs' S(n) 95% interval, "predicted": S_hat(n) and band (18)), saving_s, lo_s,
               hi_s, auto}], draft: [{a, profile, k, speedup, lo, hi, measured_k}] (the AUTO policy of the version
               named), warnings: [one line per input check, naming its file and what to change], lines: [the text,
               within 100 columns]} (absent in version-1 plans)
  level_gbps   the host's bandwidth level (reference read, GB/s) its measured inputs were kept at: the --runs'
               pinned level, else the bench's (moespec.measure.level); a run with this plan that pins (--pin-wait)
               keeps its rounds at it; null where neither pinned one (absent in version-1 plans)
  runs         null, or {path, moe_layers, depth} of --runs; then the calibrated version too:
  tau_calibrated {slot|dedup|auto: {n: s}};  saving.{n}.calibrated_s;  crossover_calibrated (the last two equal
               the measured-time version's: the calibration adds the same measured time to both kernels)
  step_times_calibrated, staircase_calibrated   as step_times and staircase
  table_calibrated  rows as table's with version "calibrated", speedup_lo and speedup_hi null where d is null: a
               list of its own, so that a reader that keys `table` by (policy, a) keeps reading the prediction
  tau_whole_pass, saving.{n}.whole_pass_s, crossover_whole_pass, step_times_whole_pass, staircase_whole_pass,
  table_whole_pass (version "whole-pass")   the whole-pass version, when the runs of --runs measured the verify
               time with the expert operation taken out (verify_time_s.outside): the prediction (22) plus the
               growth with n of the time outside the expert operation measured at each n
               (moespec.predict.verify.whole_pass); left out, with a line in verdict.warnings, where one of its
               times is not positive
  llama_cpp    {version, policy: "dedup", intervals: [{k, lo, hi, flags}], table: [row of `table` + flags]}: the
               dedup staircase of the calibrated version (the prediction without --runs) as llama.cpp's flags
               (moespec.predict.plan.llama_cpp_flags; absent in version-1 plans)
  throughput_rate  the throughput rate the plan is scored on, a name of moespec.formats.runsfile.RATES: "counted"
               (the paper's) or "computed" (absent in older plans, scored on the computed rate)
  batch        with --batch (absent otherwise): {batches, kmax, policy: "auto", source, acceptances (the paper's
               11), per_batch: {B: {step_time_s: {policy: [V_B(0..kmax)]}, kernel_by_n: {n: kernel}, crossover,
               k_hat: [per acceptance], tokens_per_s: [B G_a(k)/V_B(k)], speedup: [per acceptance]}}, b_stop:
               [the least B from which k_hat = 0 at every larger B, or null, per acceptance], predicted: null or
               {per_batch, b_stop} of the prediction from the bench} (moespec.predict.batch_map): per_batch from the
               verify times measured at each B; the prediction's per_batch entries also hold, in newer plans,
               union_share [u_B(n)] and r [r(B n), or null where a kernel's fitted time is not positive] over n =
               1..kmax+1 on the bench's timed layers, rule (7) at batch B: dedup faster where u_B(n) < r(B n)
  provenance   who made the plan and how (moespec.formats.files.provenance), and
    inputs     {role: {path, sha256}} of each file the plan was made from (INPUT_ROLES: bench, trace, runs of
               --runs, draft_time where --draft-time named a runs.json): the path as given to `moespec plan`, the
               sha256 of the file's bytes when the plan was made, so a reader (the report) can tell whether the
               files beside a plan are the ones it was made from; absent in version-1 plans
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moespec import MoespecError, theory
from moespec.defaults import KERNELS, KMAX_LIMIT, LAYERS_LIMIT, POLICIES
from moespec.formats.runsfile import RATES
from moespec.formats.files import (
    Record,
    check_numbers,
    format_problem,
    is_number,
    positive,
    read_json_bytes,
    sha256_file,
)

FORMAT_NAME = "moespec-plan"

FORMAT_VERSION = 2  # 2 writes basis, pass_bytes, level_gbps, llama_cpp and provenance.inputs

# key -> type(s) every plan.json must carry (the engine and external checks read them)
REQUIRED = {"format_version": int, "model": str, "device": str, "dtype": str, "eps": float, "kmax": int,
            "crossover": (int, type(None)), "kernel_by_n": dict, "tau_hat": dict, "saving": dict,
            "staircase": dict, "table": list, "provenance": dict}

ROW_KEYS = ("a", "policy", "k_hat", "speedup", "speedup_lo", "speedup_hi")

# table key -> the version of its rows, and the verify times they come from
# version -> the suffix of its keys: tau<suffix> (the prediction's are tau_hat), table<suffix>, staircase<suffix>,
# step_times<suffix>, crossover<suffix>, saving.{n}.<suffix without _>_s
VERSION_SUFFIX = {"prediction": "", "measured-time": "_measured", "calibrated": "_calibrated",
                  "whole-pass": "_whole_pass"}
# table key -> the version of its rows, and the verify times they come from
TABLES = {f"table{s}": (v, f"tau{s or '_hat'}") for v, s in VERSION_SUFFIX.items()}

# the files a plan is made from, by role, as provenance.inputs records them
INPUT_ROLES = ("bench", "trace", "runs", "draft_time")
SHA256 = re.compile(r"[0-9a-f]{64}")


def input_records(paths: Mapping[str, str | Path | None]) -> dict[str, dict[str, str]]:
    """provenance.inputs: {role: {path, sha256}} for `paths` (role in INPUT_ROLES -> the file's path as given, or
    None where the plan read no such file), each file hashed now."""
    if not isinstance(paths, Mapping) or any(role not in INPUT_ROLES for role in paths):
        raise ValueError(f"paths must map roles among {', '.join(INPUT_ROLES)} to file paths, got {paths!r}")
    return {role: {"path": str(path), "sha256": sha256_file(path)} for role, path in paths.items()
            if path is not None}


def _check_inputs(inputs: Any) -> str | None:
    """The first problem with provenance.inputs, or None."""
    if not isinstance(inputs, dict):
        return "provenance.inputs must be an object keyed by role"
    for role, entry in inputs.items():
        if role not in INPUT_ROLES or not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or \
                not SHA256.fullmatch(str(entry.get("sha256"))):
            return f"provenance.inputs.{role} must be {{path, sha256 of 64 hex digits}} of a role among " \
                   f"{', '.join(INPUT_ROLES)}"
    return None


def _check_rows(rows: Any, key: str, version: str, kmax: int) -> str | None:
    """The first problem with the table rows under `key`, or None."""
    if not isinstance(rows, list):
        return f"{key} must be a list of rows"
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or any(k not in row for k in ROW_KEYS):
            return f"{key}[{i}] must carry {', '.join(ROW_KEYS)}"
        if row.get("version", "prediction") != version:
            return f"{key}[{i}]: version {row.get('version')!r} is not {version!r}"
        if row["policy"] not in POLICIES or not (is_number(row["a"]) and 0 <= row["a"] < 1):
            return f"{key}[{i}]: policy {row['policy']!r} or acceptance {row['a']!r} is invalid"
        if isinstance(row["k_hat"], bool) or not isinstance(row["k_hat"], int):
            return f"{key}[{i}].k_hat = {row['k_hat']!r} has the wrong type ({type(row['k_hat']).__name__}, not int)"
        if not 0 <= row["k_hat"] <= kmax:
            return f"{key}[{i}].k_hat = {row['k_hat']!r} is outside 0..{kmax}"
        if not (is_number(row["speedup"]) and row["speedup"] > 0):
            return f"{key}[{i}].speedup = {row['speedup']!r} must be a positive finite number"
        if row["speedup_lo"] is None and row["speedup_hi"] is None:
            continue  # no band: the step times' error bound reaches half of V(k) (a noisy bench, a calibration)
        if not all(is_number(row[k]) for k in ROW_KEYS[3:]) or \
                not row["speedup_lo"] <= row["speedup"] <= row["speedup_hi"]:
            return f"{key}[{i}]: need speedup_lo <= speedup <= speedup_hi"
    return None

def _check_plan(doc: Any) -> str | None:
    """The first problem with a plan document, or None."""
    problem = format_problem(doc, "plan", FORMAT_NAME, FORMAT_VERSION)
    if problem:
        return problem
    for key, kind in REQUIRED.items():
        if key not in doc:
            return f"missing key {key!r}"
        if isinstance(doc[key], bool) or not isinstance(doc[key], kind):
            return f"{key} has the wrong type ({type(doc[key]).__name__})"
    if "throughput_rate" in doc and doc["throughput_rate"] not in RATES:
        return f"throughput_rate must be one of {', '.join(RATES)}"
    kmax = doc["kmax"]
    if not 1 <= kmax <= KMAX_LIMIT or not 0 <= doc["eps"] < theory.EPS_LIMIT:
        return f"kmax = {kmax} must lie in 1..{KMAX_LIMIT} and eps = {doc['eps']} in [0, 1/2)"
    ns = {str(n) for n in range(1, kmax + 2)}
    coverage = doc.get("coverage", {})
    layers = coverage.get("num_moe_layers", 1) if isinstance(coverage, dict) else None
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= LAYERS_LIMIT:
        return f"coverage must be an object whose num_moe_layers is an integer in 1..{LAYERS_LIMIT:,}"
    if doc["crossover"] is not None and not 2 <= doc["crossover"] <= kmax + 1:
        return f"crossover {doc['crossover']} is outside n = 2..{kmax + 1}"
    if set(doc["kernel_by_n"]) != ns or not all(v in KERNELS for v in doc["kernel_by_n"].values()):
        return f"kernel_by_n must map every n = 1..{kmax + 1} to one of {', '.join(KERNELS)}"
    for table, (version, times) in TABLES.items():
        if table not in doc and (times not in doc or version == "measured-time"):
            continue  # a plan made without --runs has no calibrated version (nor a whole-pass one); plans before
            # the measured-time version was scorable hold its tau_measured (slot and dedup) without a table
        by_policy = doc.get(times, {})
        if not isinstance(by_policy, dict) or not set(by_policy) <= set(POLICIES):
            return f"{times} must be keyed by the policies {', '.join(POLICIES)}"
        for p in POLICIES:
            per_n = by_policy.get(p)
            if not isinstance(per_n, dict) or set(per_n) != ns or \
                    not all(is_number(v) and v > 0 for v in per_n.values()):
                return f"{times}.{p} must give a positive time for every n = 1..{kmax + 1}"
        problem = _check_rows(doc.get(table), table, version, kmax)
        if problem:
            return problem
    for key, entry in doc["saving"].items():
        if key not in ns or not isinstance(entry, dict) or \
                not all(is_number(v) for k, v in entry.items() if k.endswith("_s")):
            return f"saving.{key} must be an object of finite times (keys ending _s) at an n in 1..{kmax + 1}"
    basis = doc.get("basis", {"kind": "bench", "why": None})
    if not isinstance(basis, dict) or basis.get("kind") not in ("bench", "runs") or \
            not isinstance(basis.get("why"), (str, type(None))):
        return f"basis must be {{kind: \"bench\" or \"runs\", why: a line or null}}, got {basis!r}"
    if "batch" in doc:
        problem = _check_batch(doc["batch"])
        if problem:
            return problem
    if "inputs" in doc["provenance"]:
        return _check_inputs(doc["provenance"]["inputs"])
    return None


def _check_batch(block: Any) -> str | None:
    """The first problem with a plan's batch block, or None."""
    batches = block.get("batches") if isinstance(block, dict) else None
    if not isinstance(batches, list) or not batches or not all(type(b) is int and b >= 1 for b in batches) or \
            batches != sorted(set(batches)):
        return "batch.batches must be batch sizes >= 1, ascending and distinct"
    kmax, acceptances = block.get("kmax"), block.get("acceptances")
    if type(kmax) is not int or not 1 <= kmax <= KMAX_LIMIT or not isinstance(acceptances, list) or \
            not all(is_number(a) and 0 <= a <= 1 for a in acceptances):
        return f"batch.kmax must lie in 1..{KMAX_LIMIT} and batch.acceptances in [0, 1]"
    problem = _check_map(block, batches, kmax, acceptances, "batch")
    if problem or block.get("predicted") is None:
        return problem
    return _check_map(block["predicted"], batches, kmax, acceptances, "batch.predicted")


def _check_map(block: Any, batches: list[int], kmax: int, acceptances: list, where: str) -> str | None:
    """The first problem with one version of the batch map (per_batch and b_stop), or None."""
    per_batch = block.get("per_batch") if isinstance(block, dict) else None
    if not isinstance(per_batch, dict) or set(per_batch) != {str(b) for b in batches}:
        return f"{where}.per_batch must hold one entry per batch size"
    for b, entry in per_batch.items():
        steps = entry.get("step_time_s") if isinstance(entry, dict) else None
        if not isinstance(steps, dict) or set(steps) != set(POLICIES) or not all(
                isinstance(V, list) and len(V) == kmax + 1 and all(is_number(v) and v > 0 for v in V)
                for V in steps.values()):
            return f"{where}.per_batch.{b}.step_time_s must give kmax + 1 positive step times per policy"
        if any(not isinstance(entry.get(key), list) or len(entry[key]) != len(acceptances)
               for key in ("k_hat", "tokens_per_s", "speedup")) or \
                not all(type(k) is int and 0 <= k <= kmax for k in entry["k_hat"]):
            return f"{where}.per_batch.{b}: k_hat (0..kmax), tokens_per_s and speedup must have one entry per " \
                   f"acceptance"
        problem = _check_ratios(entry, kmax, f"{where}.per_batch.{b}")
        if problem:
            return problem
    stops = block.get("b_stop")
    if not isinstance(stops, list) or len(stops) != len(acceptances) or not all(s is None or s in batches
                                                                                   for s in stops):
        return f"{where}.b_stop must give a batch size of the grid or null per acceptance"
    return None


def _check_ratios(entry: dict[str, Any], kmax: int, where: str) -> str | None:
    """The first problem with a batch entry's union_share and r (rule (7) at batch B; absent in older plans, and
    then both), or None."""
    present = [key for key in ("union_share", "r") if key in entry]
    if not present:
        return None
    if len(present) == 1:
        return f"{where}: union_share and r come together, got {present[0]} alone"
    share, r = entry["union_share"], entry["r"]
    if not isinstance(share, list) or len(share) != kmax + 1 or not all(is_number(u) and u >= 0 for u in share):
        return f"{where}.union_share must give kmax + 1 byte ratios u_B(n) >= 0"
    if not isinstance(r, list) or len(r) != kmax + 1 or not all(v is None or (is_number(v) and v >= 0) for v in r):
        return f"{where}.r must give kmax + 1 bandwidth ratios r(B n) >= 0 or null"
    return None


def _check_numbers(doc: dict[str, Any], where: str) -> None:
    """The step times of every version present: kmax + 1 positive times per policy; tau1_s positive."""
    for suffix in VERSION_SUFFIX.values():
        key = f"step_times{suffix}"
        if key in doc:
            if not isinstance(doc[key], dict):
                raise MoespecError(f"{where}: {key} must be an object of step times per policy")
            check_numbers(doc, where, key, positive=True)
            bad = [p for p, v in doc[key].items()
                   if p not in POLICIES or not isinstance(v, list) or len(v) != doc["kmax"] + 1]
            if bad:
                raise MoespecError(f"{where}: {key}.{bad[0]} must list kmax + 1 = {doc['kmax'] + 1} times")
    if "tau1_s" in doc:
        positive(doc, where, "tau1_s")
    if "draft_time_s" in doc:
        check_numbers(doc, where, "draft_time_s", positive=False)
        h = doc["draft_time_s"]
        if not isinstance(h, list) or len(h) != doc["kmax"] + 1 or any(t < 0 for t in h):
            raise MoespecError(f"{where}: draft_time_s must list kmax + 1 = {doc['kmax'] + 1} times >= 0")
    if "inputs_ceiling_gbps" in doc:
        check_numbers(doc, where, "inputs_ceiling_gbps", positive=True)
    if doc.get("level_gbps") is not None:
        positive(doc, where, "level_gbps")
    if "pass_bytes" in doc:
        check_numbers(doc, where, "pass_bytes", positive=True)
    verdict = doc.get("verdict", {})
    if not isinstance(verdict, dict) or not all(isinstance(verdict.get(k, []), list) and
                                                all(isinstance(line, str) for line in verdict.get(k, []))
                                                for k in ("warnings", "lines")):
        raise MoespecError(f"{where}: verdict must be an object whose warnings and lines are lists of text")

class Plan(Record):
    """A validated plan.json: read it as its JSON object; the typed accessors are what an engine and a score use.
    `sha256` is of the exact bytes read (a run records it; score checks the runs used this plan)."""

    def __init__(self, doc: dict[str, Any], path: str | Path | None = None, sha256: str | None = None) -> None:
        super().__init__(doc, path)
        self.sha256 = sha256

    @property
    def kmax(self) -> int:
        return self["kmax"]

    @property
    def kernel_by_n(self) -> dict[int, str]:
        """The AUTO policy: the kernel to run at each pass size n."""
        return self.n_map(self["kernel_by_n"])

    @property
    def inputs(self) -> dict[str, dict[str, str]]:
        """provenance.inputs: {role: {path, sha256}} of the files the plan was made from (empty in version-1 plans)."""
        return self["provenance"].get("inputs") or {}

    @property
    def moe_layers(self) -> int | None:
        """The MoE layers the plan's sums cover (None in a plan that does not say)."""
        coverage = self.get("coverage")
        return coverage.get("num_moe_layers") if isinstance(coverage, dict) else None


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan.json (format, version, keys and types, kernel names, n ranges, the verify times
    and table rows of each version present); raises MoespecError naming the file and the problem."""
    doc, raw = read_json_bytes(path, "plan")
    problem = _check_plan(doc)
    if problem:
        raise MoespecError(f"{path}: {problem}")
    _check_numbers(doc, str(path))
    return Plan(doc, path, hashlib.sha256(raw).hexdigest())
