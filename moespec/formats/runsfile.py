"""runs.json: the results file of `moespec run` (the engine's whole-model measurements), its typed record `Runs`
and its only loader `load_runs`; every reader (plan, score, report, demo) goes through it. The loader checks what
every reader needs (format, version, identity, depth); each accessor checks the keys it reads, where it reads them,
so a verify-only run (no throughput) is as valid as a full one.

runs.json (FORMAT_NAME, FORMAT_VERSION; n, k keys are strings):
  model, spec, source, moe_layers, device, device_kind, dtype, depth, prompts, tokens, replay (trace or null),
  plan {path, sha256} or null, kernel_by_n (the AUTO policy used, or null)
  verify_time_s       {policy: {n: median s}}        verify_time_ci_s {policy: {n: [lo, hi]}} (95% bootstrap)
                      policies slot, dedup, auto (with a plan) and outside (the expert operation taken out: the
                      time of the rest of the pass, which the plan's whole-pass version reads; absent in version-1
                      files)
  verify_samples_s    {policy: {n: [s, ...]}}
  saving_s            {n: {median, lo, hi}}           S(n) = tau_slot(n) - tau_dedup(n), 95% bootstrap interval
  crossover           smallest n >= 2 from which the median saving stays positive (null if none)
  auto_ratio          {n: AUTO's time over the better fixed kernel's, the median of the ratios of passes in the
                      same round} when a plan gave the AUTO policy (version-1 files: ratio of medians)
  auto_reference      {n: "slot" | "dedup"}: the kernel auto_ratio divides by, the better one where the paired
                      slot / dedup interval excludes 1, else the one AUTO runs at n (moespec.measure.run.auto_reference;
                      version-1 files: the smaller median)
  throughput          [{policy, k, a, tokens_per_s, counted_tokens_per_s, counted_tokens_per_s_ci, tokens, prompts,
                        realized_acceptance, tokens_per_step, G_a, steps, step_time_s, verify_time_s, overhead_share,
                        greedy_exact, greedy_match, mismatches}]
                      tokens_per_s, the COMPUTED rate: the steady state T_a(k) = G_a(k) / V(k) (B.1), V = step_time_s
                      the measured median step time (version-1 files may hold the mean); and G_a(k) for the
                      oracle draft (geometric at rate a by construction) at the nominal a; for a draft model, the
                      counted rate below
                      oracle rows: the cell (policy, k) decodes each prompt once, its prompts taking the grid's
                      acceptances in turn (moespec.measure.decoding.prompt_acceptance); step_time_s,
                      verify_time_s, draft_host_s and overhead_share are the cell's over all its prompts (a step's
                      time does not depend on a), the other keys the `prompts` prompts decoded at a (0 of them, with
                      counted_tokens_per_s, tokens_per_step and realized_acceptance null, where the grid has more
                      acceptances than the run prompts; files without `prompts`: every prompt at every a)
                      acceptance_profile: [a_1..a_k] the per-position acceptance the steps measured
                      (moespec.theory.profile.estimate_profile; null where no step tested a position; absent in
                      version-1 files)
                      counted_tokens_per_s, tokens_per_step, the COUNTED rate (the paper's): what the steps emitted,
                      every step's accepted drafts plus one over the steps' time (the last step counted in full
                      where it overshoots the generated length, the prompt's first token left out);
                      counted_tokens_per_s_ci: its 95% interval over the steps resampled (null under 2 steps);
                      files that name it realized_tokens_per_s are read as counted, version-1 files, which
                      lack it, as their tokens_per_s;
                      tokens: generated
                      greedy_exact: the tokens equal plain decoding's; greedy_match: they do, or they first differ
                      where plain decoding's two largest logits are exactly equal (a tie in the model's dtype,
                      bf16 logits tie often on a random-weight model: either token is the greedy choice)
                      mismatches: [{prompt, position, plain_top2_gap}] where the tokens first differ from plain
                      decoding's and the gap between plain decoding's two largest logits there (a near tie,
                      which rounding in a pass of another size can flip, or a real disagreement)
  draft_model, throughput_draft_model   with --draft-model: its path and the rows above at a = null (the
                      realized acceptance is the model's), drafted by it instead of the oracle
  draft_time_s        {k: median draft + host time per step}, the h(k) `moespec plan --draft-time` reads
  overhead_share      median over cells of the engine's share of step time
  greedy_match, greedy_exact   over every cell (above)
  noise               {target, met, rounds, repeated, off_level, discarded, per_n: {n: {rounds, repeated,
                      off_level, discarded, met, seconds, reference_gbps, stopped_by}}}: the verify rounds (each
                      times every n and policy once) kept, dropped as disturbed (a reference read below 70% of
                      the median) or off the level (off_level of them), discarded when the level moved
                      (moespec.measure.level), whether each median's 95% interval came within +-target of it,
                      and what stopped the rounds (target, max_reps, budget, disturbed); version-1 files counted
                      rounds per n
  dense               what ran the dense weights of verify passes: "native" (moespec.model.dense), "torch", or
                      "torch (why the native kernel is unavailable)"; absent in version-1 files
  verify_pass         what computed a verify pass: "lean (L of L layers one native call each)" (moespec.model.lean),
                      "transformers (why the lean pass does not apply)" or "llama.cpp (...)"; absent in version-1 files
  engine              "llama.cpp" for `run --engine llama.cpp` (moespec.measure.llama_run: verify_time_s holds dedup
                      alone, llama.cpp's CPU MUL_MAT_ID, and saving_s is empty; dtype is the GGUF's expert format
                      in moespec's name: files that name it as llama.cpp does (f32) are read as ours (fp32);
                      provenance.llama_cpp names the files and threads); absent for moespec's engine
  level               {pinned_gbps, band, wait_s, waited_s, dropped, kept_off, exhausted}: the host's bandwidth
                      level (reference read, GB/s) every verify round and throughput prompt was kept at:
                      --pin-gbps, the plan's, or the first round's; rounds off it dropped and waited out, within
                      wait_s (moespec.measure.level; wait_s 0: none pinned, the default); absent in version-1 files
  contention          {verify, throughput}: each null or the record of bench.json's `contention` (moespec.formats.
                      benchfile) over the kept verify rounds' passes and the throughput prompts; noise.per_n's
                      `contention` is the verify one; absent in version-1 files
  ceiling_gbps        {before, between, after}: the streaming-read ceiling before the verify rounds, between them
                      and the throughput grid, and after
  batch               with --batch (moespec.measure.batch_run; absent otherwise, where a reader takes batch one):
                      {batches: [B > 1 ascending], per_batch: {B: {verify_time_s, verify_time_ci_s, saving_s,
                      crossover, noise {n: {rounds, met, stopped_by, reference_gbps}}, kernel_by_n (the AUTO
                      policy per n at this B, or null), throughput: [BATCH_ROW_KEYS rows]}}}: the keys above, of
                      passes of B sequences x n tokens; throughput rows per (policy, k, a): step_time_s V_B(k),
                      tokens_per_s B G_a(k) / V_B(k), counted_tokens_per_s every emitted token of the B sequences
                      over the steps' time, steps, greedy_exact
  provenance          device, dtype, versions, timestamp (the start of the run), command
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.defaults import (
    DEPTH_LIMIT,
    GENERATED_LIMIT,
    KERNELS,
    KMAX_LIMIT,
    LAYERS_LIMIT,
    N_LIMIT,
    POLICIES,
    SAMPLES_LIMIT,
)
from moespec.formats.files import (
    NUMBER,
    Record,
    check_contention_record,
    check_level_record,
    check_numbers,
    field,
    format_problem,
    is_interval,
    is_number,
    read_json,
    timestamp,
)
from moespec.model.weights import format_name

# A throughput row's two rates by name (module docstring), as plan.json's throughput_rate names the scored one.
RATES = {"counted": "counted_tokens_per_s", "computed": "tokens_per_s"}
FORMAT_NAME = "moespec-runs"
FORMAT_VERSION = 2  # 2 writes noise, level and contention
IDENTITY = ("model", "device_kind", "dtype")  # runs speak only for their own model, device kind and dtype
# the measured numbers readers tabulate or score (key -> must be positive), each leaf a finite number
NUMBERS = {"verify_time_s": True, "verify_time_ci_s": True, "verify_samples_s": True, "saving_s": False,
           "draft_time_s": False, "auto_ratio": True, "ceiling_gbps": True}
N_KEYS = tuple(str(n) for n in range(1, N_LIMIT + 1))  # pass sizes n as JSON keys
BY_POLICY_N = ((*POLICIES, "outside"), N_KEYS)  # the verify policies (outside: the pass less its expert operation)
# the closed objects: key -> the keys allowed at each level below it (a number or list of numbers under the last)
CLOSED = {"verify_time_s": BY_POLICY_N, "verify_time_ci_s": BY_POLICY_N, "verify_samples_s": BY_POLICY_N,
          "saving_s": (N_KEYS, ("median", "lo", "hi")), "auto_ratio": (N_KEYS,), "auto_reference": (N_KEYS,),
          "draft_time_s": (tuple(str(k) for k in range(KMAX_LIMIT + 1)),), "ceiling_gbps": (("before", "between",
                                                                                              "after"),)}
# integer key -> the bounds `moespec run` takes it in
INTEGERS = {"depth": (0, DEPTH_LIMIT), "moe_layers": (1, LAYERS_LIMIT), "prompts": (1, SAMPLES_LIMIT),
            "tokens": (1, GENERATED_LIMIT)}
SHA256_DIGITS = 64
BATCH_ROW_KEYS = ("policy", "k", "a", "step_time_s", "tokens_per_s", "counted_tokens_per_s", "steps", "greedy_exact")


class Runs(Record):
    """A validated runs.json: read it as its JSON object; the accessors below check what they return."""

    @property
    def where(self) -> str:
        return self.path or "runs"

    def check_identity(self, other: Mapping[str, Any], other_where: str, purpose: str) -> None:
        """Refuse runs of another model, device kind or dtype than `other` (a bench or a plan)."""
        for key in IDENTITY:
            if self.get(key) != other.get(key):
                raise MoespecError(f"{self.where}: {key} {self.get(key)!r} differs from {other_where}'s "
                                   f"{other.get(key)!r}: {purpose}")

    @property
    def moe_layers(self) -> int:
        """The MoE layers of the model the engine ran."""
        return self._integer("moe_layers")

    @property
    def depth(self) -> int:
        return self._integer("depth")

    def _integer(self, key: str) -> int:
        """self[key], an integer in its INTEGERS bounds."""
        value, (least, most) = self.get(key), INTEGERS[key]
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            raise MoespecError(f"{self.where}: {key} = {_short(value)} must be an integer >= {least} "
                               f"(at most {most:,})")
        return value

    @property
    def plan_sha256(self) -> str | None:
        """The sha256 of the plan whose AUTO policy the runs ran (run --plan), None for runs without a plan."""
        plan = self.get("plan")
        if plan is None:
            return None
        sha = plan.get("sha256") if isinstance(plan, dict) else None
        if not (isinstance(sha, str) and len(sha) == SHA256_DIGITS and all(c in "0123456789abcdef" for c in sha)):
            raise MoespecError(f"{self.where}: plan must be null or an object whose sha256 is 64 hex digits, "
                               f"got {plan!r}")
        return sha

    @property
    def kernels(self) -> list[str]:
        """The expert kernels whose verify times the runs hold, in KERNELS order: both for moespec's engine, dedup
        alone for llama.cpp's CPU engine (its MUL_MAT_ID deduplicates)."""
        held = self.get("verify_time_s")
        return [p for p in KERNELS if isinstance(held, dict) and p in held]

    @property
    def started(self) -> datetime:
        """When the runs started (their provenance timestamp)."""
        return timestamp(self, self.where)

    def series(self, key: str, index: range, positive: bool) -> np.ndarray:
        """self[key] ("verify_time_s.slot" by n, "draft_time_s" by k) at every index, seconds: positive, or >= 0."""
        try:
            node = field(self, self.where, key, dict)
        except MoespecError:
            raise MoespecError(f"{self.where}: no {key} (an object of seconds keyed by n or k)") from None
        missing = [i for i in index if str(i) not in node]
        if missing:
            raise MoespecError(f"{self.where}: {key} lacks {', '.join(map(str, missing))}; the plan needs "
                               f"{index[0]}..{index[-1]} (--kmax {index[-1] - index[0]})")
        for i in index:
            value = node[str(i)]
            if not (is_number(value) and (value > 0 if positive else value >= 0)):
                raise MoespecError(f"{self.where}: {key}.{i} = {value!r} must be a "
                                   f"{'positive' if positive else 'non-negative'} time in seconds")
        return np.array([node[str(i)] for i in index], dtype=float)

    def throughput(self) -> list[dict[str, Any]]:
        """The oracle-draft throughput rows, each with a policy, k >= 0, a in [0, 1) and tokens_per_s > 0."""
        rows = field(self, self.where, "throughput", list)
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or row.get("policy") not in POLICIES:
                raise MoespecError(f"{self.where}: throughput[{i}] needs a policy, one of {', '.join(POLICIES)}")
            counted, interval = row.get("counted_tokens_per_s"), row.get("counted_tokens_per_s_ci")
            if not (counted is None or is_number(counted) and counted > 0):
                raise MoespecError(f"{self.where}: throughput[{i}] needs counted_tokens_per_s > 0 or null")
            if not (interval is None or is_interval(interval) and interval[0] <= interval[1]):
                raise MoespecError(f"{self.where}: throughput[{i}] needs counted_tokens_per_s_ci [lo, hi] with "
                                   f"lo <= hi, or null")
            k, a, t = (field(row, f"{self.where}: throughput[{i}]", key, kind)
                       for key, kind in (("k", int), ("a", NUMBER), ("tokens_per_s", NUMBER)))
            if not 0 <= k <= KMAX_LIMIT or not 0 <= a < 1 or t <= 0:
                raise MoespecError(f"{self.where}: throughput[{i}] needs k in 0..{KMAX_LIMIT}, a in [0, 1) and "
                                   f"tokens_per_s > 0")
        return rows


def _short(value: Any) -> str:
    """A value as an error line shows it: a huge integer by its digits, not all of them."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 30:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


def _check_closed(doc: Mapping[str, Any], path: str) -> None:
    """Every CLOSED object present keyed as its level allows (policies, n, k, ...); one line naming the file and
    the dotted key of the first unknown one."""
    def walk(node: Any, key: str, levels: tuple[tuple[str, ...], ...]) -> None:
        if not levels:
            return
        keys = ", ".join(levels[0][:4]) + (", ..." if len(levels[0]) > 4 else "")
        if not isinstance(node, Mapping):
            raise MoespecError(f"{path}: {key} must be an object keyed by {keys}")
        for k, v in node.items():
            if k not in levels[0]:
                raise MoespecError(f"{path}: {key}.{k}: unknown key ({key} is keyed by {keys})")
            walk(v, f"{key}.{k}", levels[1:])
    for key, levels in CLOSED.items():
        if doc.get(key) is not None:
            walk(doc[key], key, levels)
    reference = doc.get("auto_reference") or {}
    if any(v not in KERNELS for v in reference.values()):
        raise MoespecError(f"{path}: auto_reference must name {' or '.join(KERNELS)} at each n")


def _check_batch(block: Any, path: str) -> None:
    """The `batch` block, where present: its batch sizes, and per B the verify times and throughput rows."""
    if block is None:
        return
    batches = block.get("batches") if isinstance(block, Mapping) else None
    if not isinstance(batches, list) or not batches or not all(type(b) is int and b > 1 for b in batches) \
            or batches != sorted(set(batches)):
        raise MoespecError(f"{path}: batch.batches must be batch sizes > 1, ascending and distinct")
    per_batch = block.get("per_batch")
    if not isinstance(per_batch, Mapping) or set(per_batch) != {str(b) for b in batches}:
        raise MoespecError(f"{path}: batch.per_batch must hold one entry per batch size {batches}")
    for b, entry in per_batch.items():
        where = f"batch.per_batch.{b}"
        if not isinstance(entry, Mapping):
            raise MoespecError(f"{path}: {where} must be an object")
        _check_closed(entry, f"{path}: {where}")
        times = entry.get("verify_time_s")
        if not isinstance(times, Mapping) or not all(p in times for p in KERNELS) or not all(
                is_number(t) and t > 0 for per_n in times.values() for t in per_n.values()):
            raise MoespecError(f"{path}: {where}.verify_time_s must give positive slot and dedup times per n")
        rows = entry.get("throughput")
        if not isinstance(rows, list) or not all(isinstance(r, Mapping) and tuple(r) == BATCH_ROW_KEYS for r in rows):
            raise MoespecError(f"{path}: {where}.throughput must be rows of the keys {', '.join(BATCH_ROW_KEYS)}")
        for i, r in enumerate(rows):
            rates = ("step_time_s", "tokens_per_s", "counted_tokens_per_s")
            if r["policy"] not in POLICIES or type(r["k"]) is not int or not 0 <= r["k"] <= KMAX_LIMIT or \
                    not is_number(r["a"]) or not 0 <= r["a"] <= 1 or not all(is_number(r[key]) and r[key] > 0
                                                                             for key in rates):
                raise MoespecError(f"{path}: {where}.throughput[{i}]: a policy, k in 0..{KMAX_LIMIT}, a in [0, 1] and "
                                   f"positive times and rates")


def load_runs(path: str | Path) -> Runs:
    """Read a runs.json and check what every reader needs: a JSON object of this format and version, naming its
    model, device kind and dtype, with an integer depth >= 0. Raises MoespecError naming the file."""
    doc = read_json(path, "runs")
    problem = format_problem(doc, "runs", FORMAT_NAME, FORMAT_VERSION)
    if problem:
        raise MoespecError(f"{path}: {problem}")
    rows = doc.get("throughput")
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and "counted_tokens_per_s" not in row:  # its older names (module docstring)
            row["counted_tokens_per_s"] = row.pop("realized_tokens_per_s", row.get("tokens_per_s"))
    runs = Runs(doc, path)
    for key in IDENTITY:
        field(runs, str(path), key, str)
    runs["dtype"] = format_name(runs["dtype"])  # llama.cpp's name of a format read as ours (module docstring)
    for key in INTEGERS:
        if key == "depth" or key in doc:  # every reader uses or shows the depth
            runs._integer(key)
    _check_closed(doc, str(path))
    for key, positive in NUMBERS.items():
        if doc.get(key) is not None:
            check_numbers(runs, str(path), key, positive)
    check_level_record(runs, str(path))
    contention = runs.get("contention")
    if contention is not None and not isinstance(contention, Mapping):
        raise MoespecError(f"{path}: contention must be an object, got {type(contention).__name__}")
    for part in ("verify", "throughput"):
        check_contention_record((contention or {}).get(part), str(path), f"contention.{part}")
    _check_batch(doc.get("batch"), str(path))
    runs.plan_sha256  # noqa: B018 - checked here, read by score
    if "throughput" in doc:
        runs.throughput()
    return runs
