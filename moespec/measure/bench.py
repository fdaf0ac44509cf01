"""The benchmark of one MoE layer's expert operation (paper Section 2, Table 1, Figure 2,
Appendix E; DESIGN.md "Measurement protocol").

Physics. The expert operation is memory-bound (moespec.kernels), so a kernel is judged by its effective
bandwidth beta_p(n) = requested expert bytes / time: n m b for a per-slot kernel, U b for a deduplicating one
(b = w_l, the bytes of one expert; U distinct experts among the pass's n m slots). The deduplicating kernel is
faster exactly where the byte share u(n) = E_dedup/E_slot lies below the bandwidth ratio r(n) = beta_dedup /
beta_slot (7), so both are measured here on the model's real per-layer shapes and dtype (random weights).

Two kinds of expert ids are timed, each after a cache flush (moespec.measure.timing: a write larger than the last-level
cache, then a clean read) so every first read of an expert comes from DRAM:
- chosen ids: for each n, passes whose n m slots name exactly U distinct experts, U over the reachable range
  m .. min(n m, N) (every token still names m distinct experts). At fixed n the per-slot kernel requests the
  same n m b bytes whatever U, so how its time moves with U separates the first read of an expert (U slots)
  from a repeated slot (n m - U), which a cache may serve: fit (4) t = t_op + c_u U b + c_re (n m - U) b and
  the re-read cost c_re/c_u. The deduplicating kernel gets (E.1) t = t_op + c_g U b + c_t n (moespec.measure.fits).
- windows of recorded routing: n consecutive tokens of one document at one layer of a trace, the routing the
  model really produces. The fits never see them, so their median relative error on the windows is an honest
  bandwidth error eps (Section 3.5, 4); beta_p(n) is the median over these windows, pooled over the layers.
A layer is timed in rounds, each over every pass size and within each pass every kernel (their order rotated per
round), so drift on a shared machine and a change of the host's bandwidth level (moespec.measure.level) hit every
n and kernel alike. Timed one n after another, a level that changed mid-bench landed on the largest n only and
tilted both fits: t_op read -2.6 ms where the one-token pass measured 2.5 ms, and the whole-pass plan missed n = 1
by 35% (`make demo`, results/demo-cpu.md: the ceiling read 44-48 GB/s at n <= 6 and 35-36 at n = 7, 9). Round r starts
r/reps of the way through the pass sizes (1..9, 4..9 1..3, 7..9 1..6 for three rounds), so each n sits once in
each part of a round (drift balanced) and a burst across two rounds meets different n: rounds that ran ascending
and descending in turn put n = 7-9 at both ends of the first boundary, where one burst took two of their three
samples (the fit read 4.8 ms at n = 1 against 2.9 measured, `make demo`, results/demo-cpu.md: the ceiling read 52-61
GB/s at n = 7-9 and 37-43 below). Once a layer's rounds are done, a call far over its pass's expected time (a core
taken mid-call: up to 6x here) is timed again (moespec.measure.bench_rounds.retime_outliers): a median of three
rounds does not survive two such calls of one pass. Each figure is a median over the rounds with its interquartile
range.
The device's ceiling (moespec.measure.timing: a streaming read on the CPU, a device-to-device copy on a GPU) is
printed beside every bandwidth.

`--device cuda` runs the kernels on a GPU (slot and dedup as our Triton kernels) and times them with CUDA
events; weights and inputs are drawn on the CPU and then copied, so every device times the same values.

Work is split into units, one round of one layer each and a layer's calls timed again; each finished unit is saved
atomically to `OUT.partial`, so rerunning after an interruption re-times nothing already done.

bench.json: its keys are documented in moespec.formats.benchfile, which reads, validates and reports it.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable


from moespec import MoespecError, theory
from moespec.console import progress
from moespec.defaults import (
    BATCH_LIMIT,
    BENCH_DTYPES,
    KERNELS,
    MODEL,
    N_LIMIT,
    N_MAX,
    PROFILE,
    QUANTIZED,
    REPS_LIMIT,
    SAMPLES_LIMIT,
    TRACE_DOCS,
    TRACE_TOKENS,
)
from moespec.formats.benchfile import FORMAT_NAME, FORMAT_VERSION, Bench, placement_ok, too_small
from moespec.formats.checkpoint import Checkpoint, require
from moespec.formats.files import check_output, holds_outputs, provenance, write_json
from moespec.formats.trace import Trace, load_trace
from moespec.kernels import implementation
from moespec.kernels.peers import GGML_PEERS
from moespec.measure import bench_rounds
from moespec.measure.bench_rounds import (LAYOUT, OUTLIER_RATIO, apply_retimes, retime_check, retime_key,
                                          round_check, round_key, unit_records, warm_up)
from moespec.measure.contention import Cores, check_threads, merge, on_own_cores
from moespec.measure.fits import NOISY_IQR, analyze, engine_of, noise, raw_medians
from moespec.measure.level import LEVEL_UNIT, Level, check_level, host_level, pin_wait
from moespec.measure.level import check_unit as check_level_unit
from moespec.measure.layer import (
    WEIGHT_STD,
    LayerWeights,
    bench_kernels,
    check_memory,
    layer_weights,
    parse_kernels,
    pass_inputs,
    torch_dtype,
)
from moespec.measure.passes import Pass, plan_unit
from moespec.measure.placement import expert_placement
from moespec.measure.timing import MATMUL_SHAPE, Timer, matmul_dtype, matmul_peak, median_iqr, timer_for
from moespec.model.gguf import read_gguf, resolve_model
from moespec.model.load import resolve_device
from moespec.model.spec import ModelSpec
from moespec.routing.batch import batch_union
from moespec.routing.reuse import reuse_stats
from moespec.routing.synth import PROFILES, synthesize

DEFAULT_KERNELS = ",".join(KERNELS)  # the hf-* peers run 10-20x slower on this CPU: opt in with --kernels all
# Defaults sized so two OLMoE layers at n = 1..9 with our two kernels take about 2 min on this 2-core machine at
# ~20 GB/s (5 reps x (1 + 8 x 8 chosen + 9 x 16 window passes) per layer), inside 5 minutes even at half that.
DEFAULT_REPS = 5
DEFAULT_WINDOWS = 16  # recorded windows per layer and n: enough for a median and a median relative error
DEFAULT_U_VALUES = 8  # chosen U per n (all when fewer reach): ~60 passes at n = 2..9 for each 3-coefficient fit


def bench_layers(layers: tuple[int, ...] | None, spec: ModelSpec) -> list[int]:
    """The MoE layer indices to time (0..L-1), sorted; default: the first and the one before the middle (OLMoE:
    0, 7)."""
    if layers is None:
        return sorted({0, max(spec.L // 2 - 1, 0)})
    layers = sorted(set(layers))
    bad = [layer for layer in layers if not 0 <= layer < spec.L]
    if bad:
        raise MoespecError(f"--layers: layer {bad[0]} outside 0..{spec.L - 1} ({spec.name} has {spec.L} MoE layers)")
    return layers


def bench_trace(spec: ModelSpec, path: str | None, seed: int) -> tuple[Trace, dict[str, Any]]:
    """The trace to sample windows from and u(n), with a description; synthesizes the default without --trace."""
    if path is None:
        if spec.name not in PROFILES[PROFILE]:
            raise MoespecError(f"no --trace given and no calibrated default routing for {spec.name} (the "
                               f"{PROFILE} profile covers {', '.join(PROFILES[PROFILE])}); pass "
                               f"--trace from `moespec trace` or `moespec synth`")
        trace = synthesize(spec.name, "calibrated", TRACE_TOKENS, TRACE_DOCS, seed, PROFILE)
        note = (f"no --trace given: synthesized the calibrated default trace ({PROFILE} profile, "
                f"{TRACE_TOKENS} tokens in {TRACE_DOCS} documents, seed {seed})")
    else:
        trace = load_trace(path)
        trace.check_fits(spec, path, model=spec.name)
        note = f"{'synthetic' if trace.meta.get('synthetic') else 'recorded'} trace {path}"
    digest = hashlib.sha1(trace.experts.tobytes() + trace.doc_starts.tobytes()).hexdigest()
    return trace, {"path": path, "synthetic": bool(trace.meta.get("synthetic")), "source": trace.meta.get("source"),
                   "note": note, "num_tokens": trace.num_tokens, "num_documents": trace.num_documents, "sha1": digest}


def _estimate(kinds: dict[str, str], layer: LayerWeights, passes: list[Pass], m: int, b: float, timer: Timer,
              ceiling_gbps: float, sample: Callable[[], float] | None) -> tuple[float, dict[str, float]]:
    """Seconds the timed calls of `passes` will take (a pass listed once per round it is timed in), from one probe
    of each kernel on the smallest and the largest pass (its fixed time and seconds per requested byte), and what
    each call pays around it: its cache flush (timed after an untimed one: the first touches the flush buffer's pages,
    ~10x a flush), on a CPU the read of its U experts before the flush at the ceiling, and the ceiling `sample`
    after it where the bench takes one; also each kernel's probe GB/s on the largest pass."""
    small, large = (f(passes, key=lambda p: (p.ids.size, p.U)) for f in (min, max))
    around = [timer.flush] + ([sample] if sample else [])
    for fn in around:
        fn()
    total = len(passes) * len(kinds) * sum(timer.time(fn) for fn in around)
    if timer.kind == "cpu":  # Cores.cold_call's read of the call's experts (CPU tensors only)
        total += len(kinds) * sum(p.U for p in passes) * b / (ceiling_gbps * 1e9)
    speeds: dict[str, float] = {}
    inputs = [pass_inputs([p], layer.shape[1], layer.x_dtype, layer.gate_up.device) for p in (small, large)]
    warm_up(inputs, list(kinds), layer)
    probe = bench_rounds.time_round(inputs, list(kinds), layer, 0, 1, timer, lambda count: None, Level(wait_s=0),
                                    Cores())
    for c, (kernel, kind) in enumerate(kinds.items()):
        t_lo, t_hi = (group["times"][0][c] for group in probe)
        lo, hi = (theory.requested_bytes(kind, len(p.ids), p.U, m, b) for p in (small, large))
        per_byte = (t_hi - t_lo) / (hi - lo) if hi > lo else 0.0
        per_byte = per_byte if per_byte > 0 else t_hi / hi  # a noisy probe: no fixed time
        fixed = max(t_lo - per_byte * lo, 0.0)
        speeds[kernel] = hi / t_hi / 1e9
        total += sum(fixed + per_byte * theory.requested_bytes(kind, len(p.ids), p.U, m, b) for p in passes)
    return total, speeds


def _measure(spec: ModelSpec, config: BenchConfig, kinds: dict[str, str], plan: dict[tuple[int, int], list[Pass]],
             checkpoint: Checkpoint, ceiling: float, timer: Timer, say: Callable[[str], None],
             level: Level, cores: Cores) -> dict[tuple[int, int], dict[str, Any]]:
    """Time every round the checkpoint lacks, layer by layer (one layer's weights in memory at a time), after
    printing the estimated time; every group of a round at the bench's bandwidth level (saved with each round).
    Returns the rounds gathered per (layer, n) (unit_records)."""
    kernels = list(kinds)
    layers, ns = sorted({layer for layer, _ in plan}), sorted({n for _, n in plan})
    pending = [(layer, rep) for layer in layers for rep in range(config.reps)
               if round_key(layer, rep, kernels) not in checkpoint.units]
    say(f"plan: {len(layers)} layer(s) x {config.reps} rounds, each over n = {ns[0]}..{ns[-1]} (each started "
        f"further along), {len(layers) * config.reps - len(pending)} done; each n up to {config.u_values} chosen "
        f"U values and {config.windows} recorded windows, every timed call after a {timer.flush_bytes >> 20} MiB "
        f"cache flush, timed by {timer.timer_name}")
    per_round = {layer: [p for n in ns for p in plan[layer, n]] for layer in layers}
    sample = timer.sampler() if config.call_ceilings else None
    todo = [layer for layer in layers
            if any(key[0] == layer for key in pending) or retime_key(layer, kernels) not in checkpoint.units]
    weights: LayerWeights | None = None
    if pending:
        start = time.perf_counter()
        weights = layer_weights(spec, todo[0], config.dtype, config.seed, timer.device)
        generate = time.perf_counter() - start
        seconds, speeds = _estimate(kinds, weights, [p for layer, _ in pending for p in per_round[layer]], spec.m,
                                    spec.expert_bytes(todo[0], config.dtype), timer, ceiling, sample)
        seconds += generate * (len(todo) - 1)
        estimate = f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
        say(f"estimated time: {estimate} (probe on requested bytes: "
            f"{', '.join(f'{k} {v:.1f} GB/s' for k, v in speeds.items())}; ceiling {ceiling:.1f} GB/s)")
    with progress("bench", sum(len(per_round[layer]) for layer, _ in pending),
                  enabled=sys.stderr.isatty() and bool(pending)) as advance:
        for layer in todo:
            weights = weights or layer_weights(spec, layer, config.dtype, config.seed, timer.device)
            inputs = [pass_inputs(plan[layer, n], weights.shape[1], weights.x_dtype, weights.gate_up.device)
                      for n in ns]
            warm_up(inputs, kernels, weights)
            if sample and any(key[0] == layer for key in pending):  # the memory behind this draw of the layer
                checkpoint.save(placement_key(layer), expert_placement(weights.tensors, timer, sample))
            for _, rep in [key for key in pending if key[0] == layer]:
                checkpoint.save(round_key(layer, rep, kernels),
                                bench_rounds.time_round(inputs, kernels, weights, rep, config.reps, timer,
                                                        advance, level, cores, sample))
                level.save(checkpoint)
            if retime_key(layer, kernels) not in checkpoint.units:
                b = spec.expert_bytes(layer, config.dtype)
                requested = [[[theory.requested_bytes(kinds[k], len(p.ids), p.U, spec.m, b) for k in kernels]
                              for p in plan[layer, n]] for n in ns]
                checkpoint.save(retime_key(layer, kernels), bench_rounds.retime_outliers(
                    _rounds(checkpoint, layer, config.reps, kernels), inputs, kernels, weights, requested, timer,
                    level, cores, sample))
                level.save(checkpoint)
            weights = None  # frees the layer (and the peers' modules cached on its tensors)
    units = {}
    for layer in layers:
        rounds = apply_retimes(_rounds(checkpoint, layer, config.reps, kernels),
                               checkpoint.units[retime_key(layer, kernels)], kernels)
        units |= unit_records(layer, ns, kernels, plan, rounds)
    return units


def placement_key(layer: int) -> str:
    """The checkpoint's key of a layer's placement (moespec.measure.placement): that of the last process that timed
    its rounds, against that process's ceiling buffer."""
    return f"layer {layer} placement"


def _check_placement(unit: Any, where: str, experts: int) -> None:
    require(placement_ok(unit, experts), where, f"a placement must be null or {experts} positive ratios")


def _rounds(checkpoint: Checkpoint, layer: int, reps: int, kernels: list[str]) -> list[list[dict[str, Any]]]:
    """A layer's finished rounds, in order, from the checkpoint."""
    return [checkpoint.units[round_key(layer, rep, kernels)] for rep in range(reps)]


@dataclass(frozen=True)
class BenchConfig:
    """One bench: the model (a preset name or a config path), its MoE `layers` to time (None: the first and L/2 - 1),
    the weight dtype, the kernels ("slot,dedup", any comma-separated names of moespec.kernels.KERNELS, or "all":
    every one that can run here), the pass sizes `n`, the routing trace (None: the calibrated default), the
    timed repetitions per pass, recorded `windows` and chosen `u_values` per (layer, n), the seed, the device, the
    host's bandwidth level to keep the rounds at (`level_gbps`, `level_wait_s`: off unless asked for, on the CPU
    only; moespec.measure.level.pin_wait), the threads (None: the machine's cores, counted where the bench runs);
    written to `out`, checkpointed in OUT.partial/ (a rerun resumes it; `fresh` drops it)."""

    out: str
    model: str = MODEL
    layers: tuple[int, ...] | None = None
    dtype: str = "bf16"
    kernels: str = DEFAULT_KERNELS
    n: tuple[int, ...] = tuple(range(1, N_MAX + 1))
    trace: str | None = None
    reps: int = DEFAULT_REPS
    windows: int = DEFAULT_WINDOWS
    u_values: int = DEFAULT_U_VALUES
    seed: int = 0
    device: str = "cpu"
    fresh: bool = False
    level_gbps: float | None = None
    level_wait_s: float | None = None
    batch: int = 1  # B sequences per pass: passes of B n tokens (moespec.measure.passes.plan_unit)
    threads: int | None = None  # None: one per core of the machine the bench runs on (contention.on_own_cores)
    # a ceiling sample after every timed call (the state each call met: one more read), and each layer's placement
    # against that ceiling's buffer (moespec.measure.placement)
    call_ceilings: bool = False

    def kernel_list(self) -> str:
        """The kernels to time: as given, except that a quantized dtype's default is ggml's pair (nothing else
        runs GGUF blocks)."""
        quantized_default = self.dtype in QUANTIZED and self.kernels == DEFAULT_KERNELS
        return ",".join(GGML_PEERS) if quantized_default else self.kernels

    def check(self) -> None:
        """Every number in its domain and the output a writable place, before any work."""
        check_output(self.out)
        for flag, value, least, most in (("--reps", self.reps, 1, REPS_LIMIT),
                                         ("--windows", self.windows, 1, SAMPLES_LIMIT),
                                         ("--u-values", self.u_values, 2, SAMPLES_LIMIT)):
            if not least <= value <= most:
                raise MoespecError(f"{flag} must lie in {least}..{most:,}, got {value}")
        if not self.n or not all(1 <= n <= N_LIMIT for n in self.n):
            raise MoespecError(f"--n: pass sizes must lie in 1..{N_LIMIT}, got {list(self.n)}")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or not 1 <= self.batch <= BATCH_LIMIT:
            raise MoespecError(f"--batch must be an integer in 1..{BATCH_LIMIT:,}, got {self.batch!r}")
        if self.dtype not in BENCH_DTYPES:
            raise MoespecError(f"--dtype {self.dtype!r}: one of {', '.join(BENCH_DTYPES)}")
        check_threads(self.threads)
        check_level(self.level_gbps, self.level_wait_s)


def default_dtype(model: str) -> str:
    """The expert format to bench `model` in when none is given: a GGUF file's own (bf16, q8_0, ...: its real
    bytes), else BenchConfig's default."""
    if not str(model).endswith(".gguf"):
        return BenchConfig.dtype
    fmt = read_gguf(model).expert_format()
    if fmt not in BENCH_DTYPES:
        raise MoespecError(f"{model}: its experts are {fmt}; the bench times {', '.join(BENCH_DTYPES)}: give --dtype")
    return fmt


def bench_passes(spec: ModelSpec, config: BenchConfig, trace: Trace,
                 layers: list[int]) -> tuple[dict[tuple[int, int], list[Pass]], dict[int, float], list[int]]:
    """The passes a bench times per (layer, B n) (moespec.measure.passes.plan_unit), u(n) of the trace and the pass
    sizes, all keyed by the pass's token count B n."""
    batch, ns = config.batch, sorted(set(config.n))
    plan = {(layer, batch * n): plan_unit(trace, spec, layer, n, config.windows, config.u_values, config.seed, batch)
            for layer in layers for n in ns}
    w = [spec.expert_bytes(layer, config.dtype) for layer in range(spec.L)]
    u = reuse_stats(trace, max(ns), bootstrap=0, expert_bytes=w).u if batch == 1 else \
        batch_union(trace, [batch], max(ns), w).u[batch]
    return plan, {batch * n: float(u[n]) for n in ns}, [batch * n for n in ns]


def bench_document(spec: ModelSpec, config: BenchConfig, kinds: dict[str, str], units: dict[tuple[int, int], Any],
                   layers: list[int], ns: list[int], u: dict[int, float], trace_info: dict[str, Any],
                   impl: dict[str, str], device_keys: dict[str, Any]) -> dict[str, Any]:
    """bench.json's keys from the timed (or predicted) units of every (layer, n): the model, the device's keys as
    given, the fits, r(n), u(n), the crossover and the rest `analyze` derives, the raw medians, the trace, the
    protocol, the noise record and the provenance (moespec.formats.benchfile)."""
    b = {layer: spec.expert_bytes(layer, config.dtype) for layer in layers}
    doc = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "model": spec.name, "spec": spec.to_dict(),
           "dtype": config.dtype, **device_keys,
           "layers": layers, "n": ns, "batch": config.batch, "expert_bytes": {str(layer): b[layer] for layer in layers},
           **analyze(units, kinds, spec.m, b, layers, ns, u, slot_flops=2 * 3 * spec.hidden * spec.expert_width),
           "chosen": raw_medians(units, "chosen"), "windows": raw_medians(units, "window"), "trace": trace_info,
           "protocol": {"reps": config.reps, "windows": config.windows, "u_values": config.u_values,
                        "seed": config.seed, "weight_std": WEIGHT_STD, "noisy_iqr": NOISY_IQR,
                        "call_ceilings": config.call_ceilings},
           "noisy": noise(units), "provenance": provenance(device_keys["device"], config.dtype)}
    for kernel in kinds:
        doc["kernels"][kernel]["implementation"] = impl[kernel]
    return doc


@holds_outputs(lambda config: [config.out])
@on_own_cores
def run_bench(config: BenchConfig, say: Callable[[str], None] = lambda text: None) -> Bench:
    """Time the expert operation of each chosen layer and pass size with each kernel (the module docstring), fit
    (4) and (E.1), write bench.json to config.out and return it; `say` receives one line per stage (the CLI
    prints them). config.out is locked for the whole run (moespec.formats.lock)."""
    started = time.perf_counter()
    config.check()
    device = resolve_device(config.device)
    spec = resolve_model(config.model)
    ns, layers = sorted(set(config.n)), bench_layers(config.layers, spec)
    check_memory(spec, config.dtype, device)
    names, skipped = parse_kernels(config.kernel_list(), spec, config.dtype, device)
    kinds = {k: bench_kernels()[k] for k in names}
    trace, trace_info = bench_trace(spec, config.trace, config.seed)
    batch = config.batch
    plan, u, ns = bench_passes(spec, config, trace, layers)
    timer = timer_for(device)
    key = {"model": spec.to_dict(), "device_kind": timer.kind, "dtype": config.dtype, "reps": config.reps,
           "layout": LAYOUT,
           "level_gbps": config.level_gbps, "level_wait_s": pin_wait(config.level_gbps, config.level_wait_s),
           "windows": config.windows, "u_values": config.u_values, "seed": config.seed,
           "trace_sha1": trace_info["sha1"], "n": ns, "layers": layers, "kernels": list(kinds), "device": timer.name,
           "batch": batch, **({"call_ceilings": True} if config.call_ceilings else {})}
    sizes = {layer: [len(plan[layer, n]) for n in ns] for layer in layers}
    checks = {f"layer {layer} round ": round_check(sizes[layer], list(kinds)) for layer in layers} | {
        retime_key(layer, list(kinds)): retime_check(sizes[layer], config.reps, list(kinds)) for layer in layers} | {
        placement_key(layer): partial(_check_placement, experts=spec.N) for layer in layers}
    checkpoint = Checkpoint(config.out, key, "bench", config.fresh, checks | {LEVEL_UNIT: check_level_unit})
    resumed = sum(round_key(layer, rep, list(kinds)) in checkpoint.units for layer in layers
                  for rep in range(config.reps))  # bench.json says so: --fresh times them again
    impl = {k: implementation(k, torch_dtype(config.dtype), device) if engine_of(k) == "moespec" else engine_of(k)
            for k in kinds}
    say(f"moespec bench: {spec.name} {config.dtype} on {timer.name}; MoE layers {', '.join(map(str, layers))}; "
        f"{'n' if batch == 1 else f'B = {batch} sequences x n tokens ='} {', '.join(map(str, ns))}; "
        f"kernels {', '.join(f'{k} ({impl[k]})' for k in kinds)}")
    for name, why in skipped.items():
        say(f"skipped {name}: it cannot run {config.dtype} on {device} ({why})")
    say(f"trace: {trace_info['note']}")
    if note := checkpoint.describe():
        say(note)
    before = timer.ceiling()
    first, first_iqr = median_iqr(before)
    say(f"ceiling: {timer.ceiling_kind} {first:.1f} GB/s (IQR {first_iqr:.1f})")
    peak, peak_iqr = median_iqr(matmul_peak(timer, torch_dtype(config.dtype)))
    say(f"compute ceiling: torch.matmul {' x '.join(map(str, MATMUL_SHAPE))} in "
        f"{matmul_dtype(torch_dtype(config.dtype), timer.device)} "
        f"{peak:.0f} GFLOP/s (IQR {peak_iqr:.0f})")
    level = host_level(config.level_gbps, config.level_wait_s, timer.kind, say)  # opt-in; the CPU's only
    level.restore(checkpoint)
    cores = Cores(config.threads)
    try:
        with checkpoint:
            units = _measure(spec, config, kinds, plan, checkpoint, first, timer, say, level, cores)
    finally:
        cores.release()
    after = timer.ceiling()  # the ceiling is the median over samples before and after: drift shows in its IQR
    ceiling, ceiling_iqr = median_iqr(before + after)

    device_keys = {"device": timer.name, "device_kind": timer.kind, "ceiling_kind": timer.ceiling_kind,
                   "ceiling_gbps": ceiling, "ceiling_iqr_gbps": ceiling_iqr,
                   "ceiling_before_after_gbps": [first, median_iqr(after)[0]], "matmul_peak_gflops": peak}
    doc = bench_document(spec, config, kinds, units, layers, ns, u, trace_info, impl, device_keys)
    doc["protocol"] |= {"flush_bytes": timer.flush_bytes, "timer": timer.timer_name,
                        "late_starts": timer.late_starts, "outlier_ratio": OUTLIER_RATIO}
    doc["retimed"] = [{"layer": layer, "n": ns[f["group"]], **f} for layer in layers
                      for f in checkpoint.units[retime_key(layer, list(kinds))]]
    if doc["retimed"]:
        say(f"timed again: {len(doc['retimed'])} call(s) over {OUTLIER_RATIO}x their pass's expected time (a core "
            f"taken mid-call), their new times kept (bench.json `retimed`)")
    placed = {str(layer): checkpoint.units.get(placement_key(layer)) for layer in layers}
    if any(placed.values()):
        doc["placement"] = placed
    doc |= {"skipped_kernels": skipped, "level": level.record(),
            "contention": merge([u["contention"] for u in units.values() if u.get("contention")]),
            "elapsed_s": time.perf_counter() - started, "resumed_rounds": resumed}
    doc["too_small"] = too_small(doc)
    write_json(config.out, doc)
    checkpoint.remove()
    return Bench(doc, config.out)

