"""`moespec bench --predict device.json`: a bench.json whose operation times are predicted by the structural model
(moespec.kernels.structure) from a device profile (moespec.formats.devicefile) instead of timed, for a model nobody
benchmarked: its shapes alone (a preset, a config.json, a GGUF file's header). At bf16 or fp32 it predicts our
kernels; at a GGUF format (q8_0, q4_0) ggml's pair, the kernels a measured bench of that format times (its default
--kernels), from the profile's rates of that format.

It predicts the very passes a measured bench would time (moespec.measure.bench.bench_passes: chosen ids over the U
grid and windows of the routing trace, for each layer and n) and derives every key from them with the measured
bench's own functions (moespec.measure.bench.bench_document: beta(n), the fits (4) and (E.1), r(n), u(n), the
crossover, per_layer), so `moespec plan` reads it as it reads a measured one. The file says `predicted: true`, and
`prediction` records the profile, the ceiling the times were predicted at and the model's stated error: the profile
self-check's median relative error per kernel, a median as the paper's eps is (the median over layers of each fit's
median error on recorded windows), where the check's largest error would state the worst pass of a shape no model
has; each kernel's eps is the fits' error on the predicted windows plus that stated error, so the plan's bands (18),
(21) carry it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch

from moespec import ArgumentError, MoespecError
from moespec.arguments import show
from moespec.formats.benchfile import Bench, too_small
from moespec.formats.devicefile import DeviceProfile, load_profile
from moespec.formats.files import holds_outputs, sha256_file, write_json
from moespec.measure.bench import BenchConfig, bench_document, bench_layers, bench_passes, bench_trace
from moespec.measure.bench_rounds import unit_record
from moespec.measure.contention import on_own_cores
from moespec.measure.device_profile import pair_of
from moespec.measure.fits import engine_of, eps_by_engine
from moespec.measure import state_probe
from moespec.measure.timing import cuda_device_name, device_name, timer_for
from moespec.model.load import resolve_device
from moespec.model.gguf import resolve_model
from moespec.predict.checks import profile_checks
from moespec.kernels.structure import Rates, kind_rates, pass_time


def implementation_of(kernel: str) -> str:
    """bench.json kernels.<k>.implementation of a predicted bench: what the profile timed, predicted (native for
    ours, the peer's engine for ggml's)."""
    engine = engine_of(kernel)
    return f"{'native' if engine == 'moespec' else engine}, predicted"


def check_profile(profile: DeviceProfile, config: BenchConfig) -> None:
    """Refuse a profile that does not describe this bench: another device kind, another CPU or GPU, on the CPU
    another thread count than the bench's (its `threads`, which predict_bench gives torch as a measured bench does), a
    weight format it did not time, kernels it has no model of (at a format, the pair that runs it: ours for bf16 and
    fp32, ggml's for the GGUF formats, as a measured bench of that format names them)."""
    where = profile.path
    kind = config.device.partition(":")[0]
    if kind != profile["device_kind"]:
        raise MoespecError(f"{where}: profiled on {profile['device_kind']}, not --device {config.device}")
    threads = torch.get_num_threads()
    if kind == "cpu" and profile.threads != threads:
        raise MoespecError(f"{where}: profiled at {profile.threads} threads; this bench runs {threads} (set the "
                           f"threads, or profile again at {threads})")
    here = device_name() if kind == "cpu" else cuda_device_name(resolve_device(config.device))
    if profile["device"] != here:
        raise MoespecError(f"{where}: profiled on another device ({profile['device']}; this is {here}): "
                           f"run `moespec profile` here")
    if config.dtype not in profile.dtypes:
        raise MoespecError(f"{where}: the model covers the formats the profile timed ({', '.join(profile.dtypes)}), "
                           f"not {config.dtype}: profile --dtypes {config.dtype}, or bench it")
    pair = list(pair_of(config.dtype).values())
    if not set(config.kernel_list().split(",")) <= set(pair):
        raise MoespecError(f"--kernels {config.kernel_list()}: at {config.dtype} the structural model covers "
                           f"{', '.join(pair)} only")


def predicted_units(rates: dict[str, Rates], kinds: dict[str, str], plan: dict[tuple[int, int], list[Any]],
                    b: dict[int, float], rows: int, ceiling_gbps: dict[int, float], cache_bytes: float,
                    placement: Mapping[int, Sequence[float] | None] | None = None
                    ) -> dict[tuple[int, int], dict[str, Any]]:
    """The bench's units (moespec.measure.bench_rounds.unit_record) with each pass's predicted time in place of its
    timed rounds: one sample per pass and kernel (kinds: name -> slot or dedup, each at rates[kind]; IQR 0), experts of
    b[layer] bytes and `rows` weight rows, each (layer, n) at the ceiling ceiling_gbps[n], each layer's experts at
    placement[layer] where given (pass_time)."""
    at = placement or {}
    return {(layer, n): unit_record(layer, n, list(kinds), passes,
                                    [{k: [pass_time(rates[kind], kind, p.ids, b[layer], rows, ceiling_gbps[n],
                                                    cache_bytes, at.get(layer))]
                                      for k, kind in kinds.items()} for p in passes], [ceiling_gbps[n]])
            for (layer, n), passes in plan.items()}


@holds_outputs(lambda config, *args, **kwargs: [config.out])
@on_own_cores
def predict_bench(config: BenchConfig, profile_path: str, ceiling_gbps: float | Mapping[int, float] | None = None,
                  say: Callable[[str], None] = lambda text: None,
                  placement: Mapping[int, Sequence[float] | None] | None = None,
                  loop_factor: float | None = None, probe: bool = False) -> Bench:
    """Write config.out: the bench `config` describes with predicted times (module docstring), at ceiling_gbps: one
    ceiling, one per n (a measured bench's ceiling_by_n_gbps: the ceilings its passes were timed at, for a side by
    side), or None (the profile's own ceiling); with `placement` ({layer: p_e per expert}, a measured bench's: the
    memory its draw of the weights lay in) each expert's cold bytes at C p_e (pass_time); with `loop_factor` k (a
    state probe's: moespec.measure.state_probe) the profile's loop terms times k (Rates.loop_scaled); with `probe`,
    at this host's state now: the profile's self-check passes timed here first (state_probe.time_probe, ~10 s, no
    model's weights), at the median ceiling their calls met and the k they give. Returns it."""
    started = time.perf_counter()
    config.check()
    if loop_factor is not None and (isinstance(loop_factor, bool) or not isinstance(loop_factor, (int, float))
                                    or not (math.isfinite(loop_factor) and loop_factor > 0)):
        raise ArgumentError(f"loop_factor must be a positive number, got {show(loop_factor)}")
    per_n = dict(ceiling_gbps) if isinstance(ceiling_gbps, Mapping) else None
    given = list(per_n.values()) if per_n is not None else [] if ceiling_gbps is None else [ceiling_gbps]
    if not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0
               for c in given) or per_n == {}:
        raise MoespecError(f"--ceiling must be positive GB/s, got {ceiling_gbps!r}")
    if probe and (ceiling_gbps is not None or loop_factor is not None):
        raise MoespecError("--probe measures the ceiling and the loop's state here: give no --ceiling with it")
    profile = load_profile(profile_path)
    check_profile(profile, config)
    probed = None
    if probe:
        if profile["device_kind"] != "cpu":
            raise MoespecError("--probe times the profile's check passes on the CPU; on a GPU give --ceiling")
        say("probing this host's state: the profile's self-check passes timed again")
        take = state_probe.time_probe(profile, config.dtype, timer_for("cpu"))
        probed = state_probe.loop_factor(profile, config.dtype, take) | {"take": take}
        ceiling_gbps = float(statistics.median(p["ceiling_gbps"] for p in take))
        loop_factor = probed["k"]
    spec = resolve_model(config.model)
    layers = bench_layers(config.layers, spec)
    role = {name: kind for kind, name in pair_of(config.dtype).items()}
    kinds = {k: role[k] for k in config.kernel_list().split(",")}
    trace, trace_info = bench_trace(spec, config.trace, config.seed)
    plan, u, ns = bench_passes(spec, config, trace, layers)
    if per_n is not None and set(per_n) != set(ns):
        raise MoespecError(f"ceiling_gbps: one ceiling per n of the bench ({', '.join(map(str, ns))}), got n = "
                           f"{', '.join(map(str, sorted(per_n)))}")
    ceilings = per_n or dict.fromkeys(ns, profile.ceiling_gbps if ceiling_gbps is None else float(ceiling_gbps))
    ceiling = float(statistics.median(ceilings.values()))
    source = "profile" if ceiling_gbps is None else "probe" if probe else "given per n" if per_n else "given"
    say(f"moespec bench --predict: {spec.name} {config.dtype} from {profile_path} ({profile['device']}), at "
        f"{ceiling:.1f} GB/s ({'the median of those ' if per_n else ''}{source}); MoE layers "
        f"{', '.join(map(str, layers))}; n = {', '.join(map(str, ns))}")
    rates = {kind: r.loop_scaled(loop_factor or 1.0)
             for kind, r in kind_rates(profile["dtypes"][config.dtype], profile.ceiling_gbps).items()}
    b = {layer: spec.expert_bytes(layer, config.dtype) for layer in layers}
    if placement is not None and not set(placement) <= set(layers):
        raise MoespecError(f"placement: layers of the bench ({', '.join(map(str, layers))}), got "
                           f"{', '.join(map(str, sorted(placement)))}")
    units = predicted_units(rates, kinds, plan, b, spec.expert_rows, ceilings, profile["cache_bytes"], placement)
    device_keys = {"device": profile["device"], "device_kind": profile["device_kind"],
                   "ceiling_kind": profile["ceiling_kind"], "ceiling_gbps": ceiling, "ceiling_iqr_gbps": 0.0,
                   "ceiling_before_after_gbps": [ceiling, ceiling],
                   "matmul_peak_gflops": profile["dtypes"][config.dtype]["matmul_peak_gflops"]}
    doc = bench_document(spec, config, kinds, units, layers, ns, u, trace_info,
                         {k: implementation_of(k) for k in kinds}, device_keys)
    by_kind = profile.self_check(config.dtype, "median")
    stated = {k: by_kind[kind] for k, kind in kinds.items()}
    fit_eps = dict(doc["eps"])
    doc["eps"] = {k: fit_eps[k] + stated[k] for k in fit_eps}
    doc["eps_engine"] = eps_by_engine(doc["eps"])
    doc["protocol"] |= {"flush_bytes": profile["protocol"]["flush_bytes"], "timer": "predicted"}
    doc |= {"predicted": True,
            "prediction": {"profile": str(profile_path), "profile_sha256": sha256_file(profile_path),
                           "profile_ceiling_gbps": profile.ceiling_gbps, "ceiling_gbps": ceiling,
                           "ceiling_source": source, "placement": placement is not None,
                           "loop_factor": loop_factor, "probe": probed,
                           "error": stated, "error_source": "profile self-check (median relative error)",
                           "profile_warnings": profile_checks(profile, str(profile_path), config.dtype),
                           "fit_eps": fit_eps},
            "skipped_kernels": {}, "level": None, "contention": None, "resumed_rounds": 0,
            "elapsed_s": time.perf_counter() - started}
    doc["too_small"] = too_small(doc)
    write_json(config.out, doc)
    return Bench(doc, config.out)
