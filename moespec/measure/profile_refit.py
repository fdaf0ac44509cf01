"""A device profile's fit from its timed calls, and the same fit taken again from the calls a device.json records
(device.json `calls`; moespec.formats.devicefile): `moespec profile` fits what it timed through `fit_profile`, and
`refit` runs the same function on a recorded profile, so a profile taken once is read under the current model
(moespec.kernels.structure, moespec.measure.profile_fit) without timing anything.

What a profile fits from its calls (moespec.measure.device_profile times them): per weight format the rates of each
kernel kind (profile_fit.fit_rates: the deduplicating kind's rate passes give every G; the per-slot kind's own where
it is a program of its own, `apart`), the cache a per-slot re-read finds (moespec.measure.cache_probe, the first
format's probe passes) and the self-check (moespec.measure.profile_check) on those rates at the profile's ceiling.
A recorded call is its key, its expert bytes, rows and third info field (a rate pass's expert count E, an overhead
pass's [groups, nodes], a check or probe pass's ids [n, m]), its seconds and the ceilings sampled after it (GB/s,
times its experts' placement where one was taken: what the fit reads).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.defaults import QUANTIZED
from moespec.formats.devicefile import DeviceProfile, load_profile
from moespec.formats.files import provenance, write_json, writing
from moespec.kernels.structure import Rates, kind_rates
from moespec.measure import profile_check
from moespec.measure.cache_probe import measured_capacity
from moespec.measure.level import pinned_of
from moespec.measure.profile_fit import STATE_SPREAD, Item, Key, fit_rates

def rows_fit(dtype: str, device: str) -> str | None:
    """Where a dtype's per-row time is fitted on a device kind (moespec.measure.profile_fit.ROWS): ggml's pair over its
    cold rate shapes, our native kernels over the hot passes of short and long rows, the Triton kernels not at all."""
    return "cold" if dtype in QUANTIZED else "hot" if device == "cpu" else None


@dataclass
class Timed:
    """One format's timed calls: the items by key (seconds, ceilings), what each key reads (info: expert bytes, rows
    and E, [groups, nodes] or ids) and the self-check weights' placement (None: not taken)."""

    by_key: dict[Key, Item]
    info: dict[Key, Any]
    placement: list[float] | None


def entry_of(rates: Rates) -> dict[str, Any]:
    """device.json's rates of one kind (moespec.formats.devicefile `dtypes.<dtype>`)."""
    entry = {"G": list(rates.G), "hot_s_per_byte": list(rates.hot_s_per_byte),
             "cold_excess_s_per_byte": list(rates.cold_excess_s_per_byte), "group_s": rates.group_s,
             "pass_s": rates.pass_s, "node_s": rates.node_s, "token_s": rates.token_s,
             "stream_share": list(rates.stream_share), "cold_ramp_s": list(rates.ramp_s),
             "cold_ramp_bytes": rates.ramp_bytes, "hot_group_s": rates.group_hot}
    return entry | ({"row_s": list(rates.row_s)} if rates.row_s else {})


def fit_profile(timed: Mapping[str, Timed], g_values: tuple[int, ...], device: str, apart: bool, pinned: bool,
                ceiling_gbps: float, nominal_bytes: int, probe: tuple[str, tuple[int, int]] | None
                ) -> tuple[dict[str, dict[str, Any]], int, dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """(dtypes' rate entries, cache_bytes, cache_probe, self_check_by_dtype) of device.json from each format's timed
    calls (in the order timed: the first holds the cache probe's passes, `probe` the kernel they ran through and
    their experts' shape), at the profile's G and ceiling; `pinned`: its calls were taken at one level of the host,
    so the stream's share is 1, not fitted (moespec.measure.device_profile)."""
    spread = math.inf if pinned else STATE_SPREAD
    entries, model = {}, {}
    for dtype, t in timed.items():
        rates = fit_rates(t.by_key, t.info, g_values, rows_fit(dtype, device), state_spread=spread, apart=apart)
        entries[dtype] = entry_of(rates)
        if apart:
            entries[dtype]["slot"] = entry_of(fit_rates(t.by_key, t.info, (1,), None, spread, kind="slot", apart=True))
        model[dtype] = kind_rates(entries[dtype], ceiling_gbps)  # as a prediction loads them
    cache, record = nominal_bytes, None
    first, t = next(iter(timed.items()))
    if keys := sorted(k for k in t.info if k[0] == "cache"):
        if probe is None:
            raise MoespecError("the cache probe's passes need the kernel they ran through and their shape")
        b, rows = t.info[keys[0]][:2]
        cache, record = measured_capacity(model[first]["slot"], *probe, [
            (t.info[k][2], t.by_key[k].seconds, t.by_key[k].ceilings) for k in keys], b, rows, nominal_bytes)
    checks = {dtype: profile_check.self_check(model[dtype], t.by_key, t.info, cache, t.placement)
              for dtype, t in timed.items()}
    return entries, cache, record, checks


def record_calls(t: Timed) -> list[dict[str, Any]]:
    """device.json `calls.<dtype>`: every call the fit reads, as JSON."""
    def extra(value: Any) -> Any:
        return value.tolist() if isinstance(value, np.ndarray) else list(value) if isinstance(value, tuple) else value

    return [{"key": list(k), "bytes": int(b), "rows": int(r), "info": extra(third),
             "seconds": [float(s) for s in t.by_key[k].seconds], "ceilings": [float(c) for c in t.by_key[k].ceilings]}
            for k, (b, r, third) in t.info.items()]


def recorded_calls(calls: list[dict[str, Any]], placement: list[float] | None) -> Timed:
    """A format's timed calls from device.json `calls.<dtype>` (validated by moespec.formats.devicefile)."""
    by_key, info = {}, {}
    for call in calls:
        key, third = tuple(call["key"]), call["info"]
        info[key] = (call["bytes"], call["rows"],
                     np.asarray(third, dtype=np.int64) if key[0] in ("check", "cache") else
                     tuple(third) if key[0] == "overhead" else third)
        by_key[key] = Item(key, lambda: None, seconds=list(call["seconds"]), ceilings=list(call["ceilings"]))
    return Timed(by_key, info, placement)


def refit(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A device.json document fitted again from the calls it records under the current model: its rates (each
    format's matmul peak kept), cache_bytes and probe, and self-check, with `refit` the provenance of this fit;
    a profile without `calls` (written before they were recorded) cannot be."""
    if not doc.get("calls"):
        raise MoespecError("the profile records no timed calls (device.json `calls`): take it again with this "
                           "version of `moespec profile` to refit it")
    checks = doc.get("self_check_by_dtype") or {}
    timed = {dtype: recorded_calls(calls, (checks.get(dtype) or {}).get("placement"))
             for dtype, calls in doc["calls"].items()}
    probe = doc.get("cache_probe")
    entries, cache, probe, checks = fit_profile(
        timed, tuple(doc["sizes"]["G"]), doc["device_kind"], bool(doc["sizes"]["slot_apart"]),
        pinned_of(doc.get("level")) is not None, doc["ceiling_gbps"], doc["cache_nominal_bytes"],
        (probe["kernel"], tuple(probe["shape"])) if probe else None)
    dtypes = {d: entry | {"matmul_peak_gflops": doc["dtypes"][d]["matmul_peak_gflops"]} for d, entry in entries.items()}
    return dict(doc) | {"dtypes": dtypes, "cache_bytes": cache, "cache_probe": probe,
                        "self_check": profile_check.worst(checks), "self_check_by_dtype": checks,
                        "refit": provenance(doc["device"], ",".join(dtypes))}


def refit_file(path: str | os.PathLike, out: str | os.PathLike) -> DeviceProfile:
    """The device.json at `path` fitted again from its calls (refit), written to `out` (held while it is written)."""
    with writing(out):
        try:
            profile = DeviceProfile(refit(load_profile(path)), out)
        except MoespecError as e:  # refit's own refusal, of this file
            raise MoespecError(str(e) if str(e).startswith(f"{path}:") else f"{path}: {e}") from None
        write_json(out, profile)
    return profile
