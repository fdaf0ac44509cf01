"""device.json: the results file of `moespec profile` (moespec.measure.device_profile), its typed record
`DeviceProfile` and its only loader `load_profile`, which validates it; `bench --predict` reads it through here and
moespec.predict.structure turns its rates into expert-op times.

device.json (FORMAT_NAME, FORMAT_VERSION):
  format, format_version
  device, device_kind, threads      "cpu: <model name>, <threads> threads" (moespec.measure.timing.device_name), "cpu",
                                    and the threads every timed call ran on: a prediction holds for these only
  ceiling_kind, ceiling_gbps, ceiling_iqr_gbps, ceiling_before_after_gbps
                                    the streaming-read ceiling (moespec.measure.timing) of this run: median and IQR
                                    over every sample taken between the timed calls, and the medians before and after
  cache_bytes                       the last-level cache (sysfs): a per-slot re-read of an expert with fewer distinct
                                    bytes read since its previous read than this is served by the cache
  stream_read  {chunk_bytes: [..], gbps: [..], iqr_gbps: [..]}  a cold streaming read of each chunk size the kernels
                                    read (a ~1 MiB row task, its neighbours), on all threads
  threads_1    {ceiling_gbps, G: [..], speedup: [..]}  thread scaling: the 1-thread streaming read and, per G, the
                                    1-thread time of the first dtype's rate passes over the profile's threads' time
  dtypes {dtype: {G, hot_s_per_byte, cold_excess_s_per_byte, group_s, pass_s, matmul_peak_gflops}}
           per weight format timed (bf16, fp32), from the native expert op on synthetic shapes only:
           G [1, 2, ..]             tokens per group (one expert applied to G tokens), ascending from 1
           hot_s_per_byte [..]      kappa_G: seconds per weight byte of a group whose weights sit in the cache
           cold_excess_s_per_byte [..]  x_G >= 0: a cold group's seconds per byte less 1 / the ceiling sampled right
                                    after it (median), so a cold group takes max(1 / ceiling + x_G, kappa_G) per byte
                                    (moespec.predict.structure). Version 1 held efficiency e_G (a cold group's GB/s
                                    over the ceiling) instead; the loader reads it as x_G = (1 / e_G - 1) / ceiling_gbps
           group_s, pass_s          the fixed seconds of one group and of one call
           matmul_peak_gflops       torch.matmul in that dtype (moespec.measure.timing.matmul_peak): the compute yardstick
  shapes   {rates: [[d, f], ..], hot: [[d, f], ..], overhead: [d, f], check: [d, f]}: the synthetic shapes timed
  self_check {slot|dedup: {median, max, passes}}: relative error of the model on passes of chosen ids of the check
           shape, which no rate was taken from: the error `bench --predict` states when given none
  protocol {reps, flush_bytes, timer}, elapsed_s, provenance (device, host, dtype, versions, git commit, timestamp,
           command)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moespec import MoespecError
from moespec.defaults import DEVICE_KINDS, DTYPES, KERNELS, REPS_LIMIT, THREADS_LIMIT
from moespec.formats.files import Record, field, is_number, positive, read_json, version_problem

FORMAT_NAME = "moespec-device-profile"
FORMAT_VERSION = 2
RATE_KEYS = ("hot_s_per_byte", "cold_excess_s_per_byte")  # per-G lists of a dtype's rates


def _fail(path: str, problem: str) -> MoespecError:
    return MoespecError(f"{path}: {problem}")


def _check_dtype(where: str, dtype: str, entry: Any) -> None:
    """One dtype's rates: G ascending whole numbers from 1, each rate list as long and positive."""
    if not isinstance(entry, dict):
        raise _fail(where, f"dtypes.{dtype} must be an object")
    g = entry.get("G")
    if not (isinstance(g, list) and g and g[0] == 1 and all(isinstance(v, int) and not isinstance(v, bool)
                                                            for v in g) and all(a < b for a, b in zip(g, g[1:]))):
        raise _fail(where, f"dtypes.{dtype}.G must list ascending whole numbers of tokens per group from 1, got {g!r}")
    for key in RATE_KEYS:
        values = entry.get(key)
        if not (isinstance(values, list) and len(values) == len(g) and all(is_number(v) for v in values)):
            raise _fail(where, f"dtypes.{dtype}.{key} must list {len(g)} numbers, one per G")
    if not all(v > 0 for v in entry["hot_s_per_byte"]) or not all(v >= 0 for v in entry["cold_excess_s_per_byte"]):
        raise _fail(where, f"dtypes.{dtype}: hot_s_per_byte must be positive and cold_excess_s_per_byte >= 0")
    for key in ("group_s", "pass_s"):
        if not (is_number(entry.get(key)) and entry[key] >= 0):
            raise _fail(where, f"dtypes.{dtype}.{key} = {entry.get(key)!r} must be a number >= 0")
    positive(entry, where, "matmul_peak_gflops")


class DeviceProfile(Record):
    """A validated device.json: read it as its JSON object."""

    @property
    def threads(self) -> int:
        return int(self["threads"])

    @property
    def ceiling_gbps(self) -> float:
        return float(self["ceiling_gbps"])

    @property
    def dtypes(self) -> list[str]:
        """The weight formats the profile timed."""
        return list(self["dtypes"])

    def self_check(self) -> dict[str, float]:
        """kernel -> the largest relative error of the profile's self-check (its stated error)."""
        return {kernel: float(self["self_check"][kernel]["max"]) for kernel in KERNELS}


def load_profile(path: str | Path) -> DeviceProfile:
    """Read and validate a device.json (format, version, device, threads, ceiling, every dtype's rates, the
    self-check); one line naming the file and the problem otherwise."""
    where = str(path)
    doc = read_json(path, "device profile")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise _fail(where, f"not a moespec device profile (format is not {FORMAT_NAME!r})")
    problem = version_problem(doc, "device profile", FORMAT_VERSION)
    if problem:
        raise _fail(where, problem)
    field(doc, where, "device", str)
    if doc.get("device_kind") not in DEVICE_KINDS:
        raise _fail(where, f"device_kind {doc.get('device_kind')!r} is not one of {', '.join(DEVICE_KINDS)}")
    threads = doc.get("threads")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= THREADS_LIMIT:
        raise _fail(where, f"threads = {threads!r} must be a whole number in 1..{THREADS_LIMIT}")
    for key in ("ceiling_gbps", "cache_bytes"):
        positive(doc, where, key)
    field(doc, where, "ceiling_kind", str)
    dtypes = field(doc, where, "dtypes", dict)
    if not dtypes or not set(dtypes) <= set(DTYPES):
        raise _fail(where, f"dtypes must time some of {', '.join(DTYPES)}, got {sorted(dtypes)}")
    for dtype, entry in dtypes.items():
        if doc["format_version"] == 1:  # e_G, a cold group's share of the ceiling, as the excess at this ceiling
            efficiency = entry.get("efficiency") if isinstance(entry, dict) else None
            if not (isinstance(efficiency, list) and all(is_number(v) and v > 0 for v in efficiency)):
                raise _fail(where, f"dtypes.{dtype}.efficiency must list positive numbers, one per G")
            entry["cold_excess_s_per_byte"] = [max(1 / e - 1, 0.0) / (doc["ceiling_gbps"] * 1e9) for e in efficiency]
        _check_dtype(where, dtype, entry)
    for kernel in KERNELS:
        for key in ("median", "max"):
            value = field(doc, where, f"self_check.{kernel}.{key}")
            if value < 0:
                raise _fail(where, f"self_check.{kernel}.{key} = {value!r} must be >= 0")
    reps = field(doc, where, "protocol.reps", int)
    if not 1 <= reps <= REPS_LIMIT:
        raise _fail(where, f"protocol.reps = {reps!r} must lie in 1..{REPS_LIMIT}")
    field(doc, where, "provenance", dict)
    return DeviceProfile(doc, path)
