"""The engine measures, on a whole model, what `moespec plan` predicts (paper Section 4, App. D.2,
D.3, E).

Physics. A verification pass of n tokens at context depth d costs tau_p(n): the dense weights and the KV cache
read once, plus the expert operation of every MoE layer, which requests n m experts per layer with the per-slot
kernel and the U distinct ones with the deduplicating kernel. Speculative decoding with draft length k spends
V(k) = tau(k + 1) + h(k) per step (h: draft and host time) and yields G_a(k) = (1 - a^(k+1)) / (1 - a) tokens
at acceptance a (B.1), so throughput is T_a(k) = G_a(k) / V(k). The run measures both halves:

1. verify time: the context of d tokens is prefilled once; each sample crops the KV cache back to d and times
   one forward of n new tokens, for n = 1..9 and each kernel policy, in rounds over all of them (the sizes
   ascending and descending in turn, the policies rotated), so drift and the host's changes of bandwidth level
   hit every n and policy alike (moespec.measure.rounds; moespec.measure.level). With --replay, every MoE layer of each
   pass selects the experts of a window of the trace (moespec.model.policies), so a random-weight model verifies
   passes with realistic reuse.
   Medians with 95% bootstrap intervals; the saving S(n) = tau_slot(n) - tau_dedup(n) with its interval.
2. throughput: speculative decoding with the oracle draft for every policy and k, each prompt at one acceptance
   of the grid in turn, T_a(k) from the cell's one V(k), the cells interleaved one prompt per round
   (moespec.measure.decoding).
Every finished unit (the verify rounds so far, one prompt of one throughput cell) is checkpointed to OUT.partial: a
rerun re-measures nothing already done, and each unit draws its random tokens from the seed and its key, so the
remaining units of a resumed run measure what a clean run's would.

runs.json: its keys are documented in moespec.formats.runsfile, which owns the format.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from moespec import MoespecError, theory
from moespec.console import progress
from moespec.defaults import (
    BATCH_LIMIT,
    DEPTH,
    DEPTH_LIMIT,
    ENGINES,
    GENERATED_LIMIT,
    KERNELS,
    KMAX,
    LAYERS_LIMIT,
    MODEL,
    N_MAX,
    REPS_LIMIT,
    SAMPLES_LIMIT,
)
from moespec.formats.checkpoint import Checkpoint, unit_rng
from moespec.formats.files import check_output, holds_outputs, provenance, sha256_file, write_json
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import FORMAT_NAME, FORMAT_VERSION, Runs
from moespec.formats.trace import Trace, load_trace
from moespec.measure.batch_run import batch_unit_checks, check_trace, measure_batches, plan_kernels
from moespec.measure.contention import Cores, check_threads, describe, merge, on_own_cores
from moespec.measure.decoding import (
    Prompts,
    expand_k0,
    measure_throughput,
    prefill_prompts,
    prompts,
    run_unit_checks,
    throughput_cells,
)
from moespec.measure.level import LEVEL_BAND, Level, check_level, host_level, pin_wait
from moespec.measure.rounds import VERIFY_UNIT, bootstrap_median, timed_rounds, verify_done, verify_statistics
from moespec.measure.timing import measure_stream_read, median_iqr
from moespec.model import speculative
from moespec.model.dense import DEFAULT_DENSE, DENSE, set_dense, verify_pass
from moespec.model.load import LoadedModel, load_draft, load_model, resolve_device
from moespec.model.policies import auto_kernel, set_policy, set_replay
from moespec.model.spec import ModelSpec

DEFAULT_LAYERS = 4  # OLMoE's real layer shapes, 4 of its 16 layers: ~1.7 GB of bf16 weights, fits 24 GiB easily
DEFAULT_REPS = 7  # verify-time samples per (policy, n) at least: a median and a bootstrap interval of it
# Rounds go on until every median's 95% interval is within +-5% of it (issue 13), up to MAX_REPS rounds or the
# budget per pass size: a pass of the 2-layer demo model takes 30-200 ms, so 60 rounds of four policies fit in it.
TARGET = 0.05
MAX_REPS = 60
BUDGET_S = 60.0
DRAFT_MODEL_PROMPTS = 2  # prompts per cell for a draft model (it has no acceptance grid to cover)
# ---- the model, the prompts and the replayed routing ------------------------------------------------------
def load_plan_kernels(path: str | None, dtype: str, device_kind: str) -> tuple[dict[str, Any] | None,
                                                                              dict[int, str] | None]:
    """The plan's identity (path, sha256, model) and its AUTO policy (kernel per n), after checking the plan is
    for the run's dtype and device kind (its kernel choice and times hold for those only)."""
    if path is None:
        return None, None
    plan = load_plan(path)
    for key, ran in (("dtype", dtype), ("device_kind", device_kind)):
        if plan.get(key) != ran:
            raise MoespecError(f"{path}: a plan for {key} {plan.get(key)!r}, but the run is {ran!r}: make the plan "
                               f"from a bench of this {key}")
    info = {"path": path, "sha256": plan.sha256, "model": plan.model, "moe_layers": plan.moe_layers,
            "level_gbps": plan.get("level_gbps")}
    return info, plan.kernel_by_n


def replay_windows(trace: Trace | None, path: str | None, spec: ModelSpec, n: int, count: int,
                   seed: int) -> list[np.ndarray] | None:
    """`count` windows [n, L, m] of the trace (the model's L MoE layers), sampled with a seeded generator."""
    if trace is None:
        return None
    starts = trace.window_starts(n)
    if starts.size == 0:
        raise MoespecError(f"{path}: no window of {n} tokens inside one document")
    picks = np.random.default_rng([seed, n]).choice(starts, size=count, replace=starts.size < count)
    return [trace.experts[s:s + n, :spec.L].astype(np.int64) for s in picks.tolist()]


def model_name(lm: LoadedModel, config: RunConfig) -> str:
    """The model's name as plans and scores know it: the preset's (its layer count is `moe_layers`), or the
    checkpoint's spec name."""
    return lm.spec.name if config.model else config.preset or MODEL


# ---- 1. verify time ---------------------------------------------------------------------------------------
def measure_verify(lm: LoadedModel, config: RunConfig, ns: list[int], policies: list[str],
                   kernel_by_n: dict[int, str] | None, trace: Trace | None, checkpoint: Checkpoint,
                   advance: Any, level: Level, cores: Cores) -> dict[int, dict[str, Any]]:
    """Samples of the verify time per policy and n at depth d (one prefill; the cache cropped before each pass),
    in the rounds of `timed_rounds` at the level `level`, on the threads `cores` fits to the free cores."""
    context = prompts(1, config.depth, lm.model.config.vocab_size, config.seed)[0]
    if not verify_done(checkpoint):
        state = prefill_prompts(lm.model, [context])[0]
    windows = {n: replay_windows(trace, config.replay, lm.spec, n, config.max_reps, config.seed) for n in ns}
    tokens = {n: unit_rng(config.seed, f"verify n {n}").integers(3, lm.model.config.vocab_size,
                                                                  size=(config.max_reps, n)) for n in ns}

    def time_pass(n: int, policy: str, rep: int) -> float:
        set_policy(lm.model, policy, kernel_by_n)
        set_replay(lm.model, None if windows[n] is None else windows[n][rep % config.max_reps])
        return speculative.timed_forward(lm.model, tokens[n][rep % config.max_reps].tolist(), state)

    for n in ns if not verify_done(checkpoint) else []:  # untimed: first-call costs stay out of the samples
        for policy in policies:
            time_pass(n, policy, 0)
    units = timed_rounds(time_pass, ns, policies, config, unit_rng(config.seed, VERIFY_UNIT), advance, level,
                         checkpoint, cores)
    set_replay(lm.model, None)
    return units


# ---- results ----------------------------------------------------------------------------------------------
def auto_reference(samples: dict[str, dict[int, list[float]]], kernel_by_n: dict[int, str], n: int,
                   rng: np.random.Generator) -> str:
    """The fixed kernel AUTO is compared with at pass size n: the better one (the smaller median of the per-round
    ratios slot / dedup) where the 95% interval of that paired ratio excludes 1; where it does not, the two are not
    told apart at n (at n = 1 they read the same experts), so neither is "the better", and AUTO is compared with
    the kernel it runs there: its own cost. Picking the smaller of two equal medians instead would charge AUTO the
    winner's curse of their noise (here 2% at n = 1 with 25 rounds)."""
    med, lo, hi = bootstrap_median(list(np.asarray(samples["slot"][n]) / np.asarray(samples["dedup"][n])), rng)
    if lo <= 1.0 <= hi:
        return auto_kernel(kernel_by_n, n)
    return "slot" if med < 1.0 else "dedup"


def paired_ratio(samples: dict[str, dict[int, list[float]]], reference: str, n: int) -> float:
    """AUTO's verify time over the fixed kernel `reference`'s at pass size n (auto_reference): the median of the
    per-round ratios. The policies of a round run back to back (their order rotated), so each ratio compares passes
    made in the same state of the machine, and drift between rounds, which moves all alike, cancels."""
    return float(np.median(np.asarray(samples["auto"][n]) / np.asarray(samples[reference][n])))


def identity(lm: LoadedModel, config: RunConfig) -> dict[str, Any]:
    """What runs.json says of the model it measured (summarize)."""
    return {"model": model_name(lm, config), "spec": lm.spec.to_dict(), "source": lm.source, "moe_layers": lm.spec.L}


def summarize(model: dict[str, Any], config: RunConfig, units: dict[int, dict[str, Any]], policies: list[str],
              cells: list[dict], acceptances: list[float], plan_info: dict | None,
              kernel_by_n: dict[int, str] | None, started: dict[str, Any],
              ceilings: dict[str, list[float]], level: Level) -> dict[str, Any]:
    """runs.json from the measured verify units and cells (keys in moespec.formats.runsfile); `model` is the
    engine's identity(). The saving and crossover need both kernels: an engine of one kernel (llama.cpp's CPU
    MUL_MAT_ID deduplicates) records none."""
    rng = np.random.default_rng(config.seed)
    samples = {p: {n: unit["samples"][p] for n, unit in units.items()} for p in policies}
    verify = verify_statistics(samples, rng)
    ns = sorted(units)
    reference = {n: auto_reference(samples, kernel_by_n, n, rng) for n in ns} if "auto" in policies else {}
    draft = config.draft_model or config.draft_gguf  # a draft model drafted the cells instead of the oracle
    rows = [] if draft else expand_k0(cells, acceptances)
    per_k: dict[int, list[float]] = {}
    for cell in cells:
        per_k.setdefault(cell["k"], []).append(cell["draft_host_s"])
    doc = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, **model, "device": started["device"],
        "device_kind": started["device"].split(":")[0], "dtype": config.dtype, "depth": config.depth,
        "prompts": config.prompt_count, "tokens": config.tokens, "replay": config.replay, "plan": plan_info,
        "kernel_by_n": None if kernel_by_n is None else {str(n): k for n, k in sorted(kernel_by_n.items())},
        **verify,
        "verify_samples_s": {p: {str(n): samples[p][n] for n in ns} for p in policies},
        "auto_ratio": None if "auto" not in policies else {str(n): paired_ratio(samples, reference[n], n) for n in ns},
        "auto_reference": None if "auto" not in policies else {str(n): reference[n] for n in ns},
        "throughput": rows, "draft_model": draft,
        "throughput_draft_model": cells if draft else [],
        "draft_time_s": {str(k): float(np.median(v)) for k, v in sorted(per_k.items())},
        "overhead_share": float(np.median([c["overhead_share"] for c in cells])) if cells else None,
        "greedy_match": all(c["greedy_match"] for c in cells),
        "greedy_exact": all(c["greedy_exact"] for c in cells),
        "noise": {"target": config.target, "met": all(u["noise"]["met"] for u in units.values()),
                  **{k: units[ns[0]]["noise"][k] for k in ("rounds", "repeated", "off_level", "discarded")},
                  "per_n": {str(n): u["noise"] for n, u in units.items()}},
        "ceiling_gbps": {when: median_iqr(v)[0] for when, v in ceilings.items()},
        "level": level.record(),
        "contention": {"verify": units[ns[0]]["noise"]["contention"],
                       "throughput": merge(list({(c["policy"], c["k"]): c["contention"] for c in cells
                                                 if c.get("contention")}.values()))},
        "provenance": started,
    }
    return doc


@dataclass(frozen=True)
class RunConfig:
    """One engine run: the model (a local checkpoint `model`, or a `preset` with random weights cut to `layers`
    decoder layers), its dtype and device, a plan whose AUTO policy runs beside slot and dedup, the context depth,
    the verify pass sizes `n` and samples per (policy, n), the throughput grid (draft lengths `k`, acceptances `a`:
    None is the paper's 11; `prompts` prompts of `tokens` generated tokens per cell, None: `prompt_count`;
    `throughput=False` measures the verify times only), a draft model instead of the oracle, a trace whose routing
    is replayed, the seed, the host's bandwidth level to keep the rounds at (`level_gbps`, `level_wait_s`: off
    unless asked for, on the CPU only; moespec.measure.level.pin_wait); written to `out`, checkpointed in
    OUT.partial/ (a rerun resumes it; `fresh` drops it)."""

    out: str = "runs.json"
    model: str | None = None
    preset: str | None = None
    layers: int | None = None
    dtype: str = "bf16"
    device: str = "cpu"
    plan: str | None = None
    depth: int = DEPTH
    n: tuple[int, ...] = tuple(range(1, N_MAX + 1))
    reps: int = DEFAULT_REPS
    max_reps: int = MAX_REPS
    target: float = TARGET
    budget_s: float = BUDGET_S
    level_gbps: float | None = None
    level_wait_s: float | None = None
    outside: bool = True
    dense: str = DEFAULT_DENSE
    k: tuple[int, ...] = tuple(range(KMAX + 1))
    a: tuple[float, ...] | None = None
    prompts: int | None = None
    tokens: int = 32
    throughput: bool = True
    draft_model: str | None = None
    replay: str | None = None
    seed: int = 0
    fresh: bool = False
    engine: str = "moespec"
    gguf: str | None = None
    draft_gguf: str | None = None
    threads: int | None = None  # None: one per core of the machine the run runs on (contention.on_own_cores)
    batch: tuple[int, ...] = ()

    def check(self) -> None:
        """Every number in its domain and the output a writable place, before any work."""
        check_output(self.out)
        if self.engine not in ENGINES:
            raise MoespecError(f"--engine {self.engine!r}: one of {', '.join(ENGINES)}")
        if self.engine == ENGINES[0] and (self.gguf is not None or self.draft_gguf is not None):
            raise MoespecError("--gguf and --draft-gguf run llama.cpp: add --engine llama.cpp")
        check_threads(self.threads)
        check_level(self.level_gbps, self.level_wait_s)
        if self.dense not in DENSE:
            raise MoespecError(f"--dense {self.dense!r}: one of {', '.join(DENSE)}")
        if self.model is not None and self.preset is not None:
            raise MoespecError("give a checkpoint (--model) or a preset (--preset), not both")
        if self.max_reps < self.reps or not 0 < self.target < 1 or not self.budget_s > 0:
            raise MoespecError(f"need --max-reps >= --reps, 0 < --target < 1 and --budget > 0, got {self.max_reps}, "
                               f"{self.target} and {self.budget_s}")
        for flag, value, least, most in (("--depth", self.depth, 1, DEPTH_LIMIT), ("--reps", self.reps, 2, REPS_LIMIT),
                                         ("--max-reps", self.max_reps, 2, REPS_LIMIT),
                                         ("--prompts", self.prompt_count, 1, SAMPLES_LIMIT),
                                         ("--tokens", self.tokens, 1, GENERATED_LIMIT),
                                         ("--layers", 1 if self.layers is None else self.layers, 1, LAYERS_LIMIT)):
            if not least <= value <= most:
                raise MoespecError(f"{flag} must lie in {least}..{most:,}, got {value}")
        if not self.n or not all(1 <= n <= N_MAX for n in self.n):
            raise MoespecError(f"--n: pass sizes must lie in 1..{N_MAX}, got {list(self.n)}")
        if not self.k or not all(0 <= k <= KMAX for k in self.k):
            raise MoespecError(f"--k: draft lengths must lie in 0..{KMAX}, got {list(self.k)}")
        if not all(1 <= b <= BATCH_LIMIT for b in self.batch):
            raise MoespecError(f"--batch: batch sizes must lie in 1..{BATCH_LIMIT}, got {list(self.batch)}")
        if self.batch and self.draft_model is not None:
            raise MoespecError("--batch measures the oracle draft; leave out --draft-model")
        if len(self.acceptances) > SAMPLES_LIMIT:
            raise MoespecError(f"--a: {len(self.acceptances)} acceptances, at most {SAMPLES_LIMIT:,}")
        for a in self.acceptances:
            if not 0 <= a < 1:
                raise MoespecError(f"--a: acceptance {a} outside [0, 1) (a = 1 drafts forever; score refuses it)")

    @property
    def prompt_count(self) -> int:
        """Prompts per throughput cell: `prompts`, by default one per acceptance of the oracle's grid, so that every
        cell decodes every acceptance and the counted rate (the plan's default) has a row at each (k, a); a draft
        model (--draft-model, or --draft-gguf on llama.cpp) drafts at its own acceptance: DRAFT_MODEL_PROMPTS."""
        if self.prompts is not None:
            return self.prompts
        drafted = self.draft_model is not None or self.draft_gguf is not None
        return DRAFT_MODEL_PROMPTS if drafted else len(self.acceptances)

    @property
    def acceptances(self) -> list[float]:
        """The throughput grid's acceptances, sorted and distinct (the paper's 11 when `a` is None)."""
        return sorted({float(a) for a in (theory.PAPER_ACCEPTANCES if self.a is None else self.a)})


def run_level(config: RunConfig, plan_info: dict[str, Any] | None, checkpoint: Checkpoint,
              say: Callable[[str], None], device_kind: str = "cpu") -> Level:
    """The run's bandwidth level (moespec.measure.level), where pinning was asked for (--pin-gbps or --pin-wait) and
    the run is on the CPU (host_level): --pin-gbps, else the plan's (the level its calibration was measured at),
    else the first kept round's; a resumed run continues its checkpointed one."""
    asked = host_level(config.level_gbps, config.level_wait_s, device_kind, say)
    pinned = config.level_gbps if config.level_gbps is not None else (plan_info or {}).get("level_gbps")
    level = Level(pinned, asked.wait_s) if asked.active else asked
    level.restore(checkpoint)
    if level.active:
        say(f"level: rounds kept at {'the first round' if level.pinned is None else f'{level.pinned:.1f} GB/s'} "
            f"+-{LEVEL_BAND:.0%} of the reference read, waiting {level.wait_s:.0f} s at most for it")
    return level


def say_contention(doc: dict[str, Any], say: Callable[[str], None]) -> None:
    """A line per part of a run (verify passes, throughput prompts) that another process ran beside."""
    for part, what in (("verify", "verify passes"), ("throughput", "throughput prompts")):
        if line := describe(doc["contention"][part], what):
            say(f"[bold yellow]{line}[/]")


@holds_outputs(lambda config: [config.out])
@on_own_cores
def run_engine(config: RunConfig, say: Callable[[str], None] = lambda text: None) -> Runs:
    """Measure the verify times and the throughput grid on the model (the module docstring), write runs.json to
    config.out and return it; `say` receives one line per stage (the CLI prints them). config.out is locked for the
    whole run (moespec.formats.lock)."""
    config.check()
    if config.engine != ENGINES[0]:
        raise MoespecError(f"--engine {config.engine}: run_engine runs moespec's engine "
                           "(moespec.measure.llama_run.run_llama_cpp runs llama.cpp)")
    ns, ks, acceptances = sorted(set(config.n)), sorted(set(config.k)), config.acceptances
    device = resolve_device(config.device)
    started = provenance(device, config.dtype)  # the timestamp says when the run began (score: pre-registration)
    # inputs are checked before the model loads
    plan_info, kernel_by_n = load_plan_kernels(config.plan, config.dtype, device.split(":")[0])
    trace = None if config.replay is None else load_trace(config.replay)
    batches = [b for b in sorted(set(config.batch)) if b > 1]
    check_trace(trace, config.replay, batches, max(ns))
    layers = config.layers if config.layers is not None or config.model else DEFAULT_LAYERS
    lm = load_model(path=config.model, preset=None if config.model else config.preset or MODEL,
                    layers=layers, dtype=config.dtype, device=device, seed=config.seed)
    dense_path = set_dense(lm.model, config.dense)
    if plan_info and plan_info["model"] != model_name(lm, config):
        raise MoespecError(f"{config.plan}: a plan for {plan_info['model']}, but the run is of "
                           f"{model_name(lm, config)}")
    if plan_info and plan_info["moe_layers"] not in (None, lm.spec.L):
        say(f"[yellow]note[/]: {config.plan} plans {plan_info['moe_layers']} MoE layers, this model has "
            f"{lm.spec.L}: its AUTO policy applies, its verify times do not (score will refuse the pair)")
    if trace is not None:
        trace.check_fits(lm.spec, config.replay, prefix=True, model=model_name(lm, config))  # as bench's
    policies = list(KERNELS) + (["auto"] if kernel_by_n else [])
    drafter = None
    if config.draft_model:
        drafter = load_draft(config.draft_model, dtype=config.dtype, device=device)
        set_dense(drafter, config.dense)
        if drafter.config.vocab_size != lm.model.config.vocab_size:
            raise MoespecError(f"{config.draft_model}: vocabulary of {drafter.config.vocab_size} tokens, the "
                               f"target's has {lm.model.config.vocab_size}: a draft must share the tokenizer")
    cells = throughput_cells(policies, ks) if config.throughput else []
    key = {"source": lm.source, "dtype": config.dtype, "device_kind": device.split(":")[0], "depth": config.depth,
           "n": ns, "reps": config.reps, "max_reps": config.max_reps, "target": config.target,
           "budget_s": config.budget_s, "level_gbps": config.level_gbps,
           "level_wait_s": pin_wait(config.level_gbps, config.level_wait_s),
           "outside": config.outside, "dense": config.dense, "k": ks, "a": acceptances,
           "prompts": config.prompt_count, "tokens": config.tokens, "replay": config.replay, "plan": plan_info,
           "seed": config.seed, "draft_model": config.draft_model, "spec": lm.spec.to_dict(), "device": device,
           "threads": config.threads, "replay_sha256": config.replay and sha256_file(config.replay),
           "batch": sorted(set(config.batch))}
    verify = policies + (["outside"] if config.outside else [])
    kernels = plan_kernels(config.plan, batches, kernel_by_n)
    checkpoint = Checkpoint(config.out, key, "run", config.fresh,
                            run_unit_checks(ns, verify) | batch_unit_checks(ns, policies))
    say(f"moespec run: {lm.source} ({lm.spec.L} MoE layers, {config.dtype}, {device}); dense weights: "
        f"{dense_path}; verify pass: {verify_pass(lm.model)}; policies "
        f"{', '.join(policies)}; depth {config.depth}; replay {config.replay or 'off (the router decides)'}")
    total = len(ns) * config.reps * len(verify) + len(cells) * config.prompt_count + sum(  # batch B: AUTO where planned
        len(ns) * config.reps * (len(KERNELS) + bool(kernels[b]))
        + (1 if kernels[b] else len(KERNELS)) * len(ks) * len(acceptances) * config.throughput for b in batches)
    ceilings = {"before": measure_stream_read()}
    level = run_level(config, plan_info, checkpoint, say, device.split(":")[0])
    if note := checkpoint.describe():
        say(note)
    cores = Cores(config.threads)
    try:
        with checkpoint, progress("run", total, enabled=sys.stderr.isatty()) as advance:
            units = measure_verify(lm, config, ns, verify, kernel_by_n, trace, checkpoint, advance, level, cores)
            ceilings["between"] = measure_stream_read()
            ps = Prompts(lm, config.prompt_count, config.depth, config.tokens, config.seed, trace, config.replay)
            measured = measure_throughput(lm, cells, kernel_by_n, ps, None if drafter else acceptances, checkpoint,
                                          drafter, advance, level, cores)
            batch = measure_batches(lm, batches, ns, ks, acceptances, config, kernels, trace, config.throughput,
                                    checkpoint, advance, level, cores) if batches else None
    finally:
        cores.release()
    ceilings["after"] = measure_stream_read()
    doc = summarize(identity(lm, config), config, units, verify, measured, acceptances, plan_info, kernel_by_n,
                    started, ceilings, level)
    doc["dense"], doc["verify_pass"] = dense_path, verify_pass(lm.model)
    if batch is not None:
        doc["batch"] = batch
    say_contention(doc, say)
    write_json(config.out, doc)
    checkpoint.remove()
    return Runs(doc, config.out)
