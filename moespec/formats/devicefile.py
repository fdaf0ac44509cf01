"""device.json: the results file of `moespec profile` (moespec.measure.device_profile), its typed record
`DeviceProfile` and its only loader `load_profile`, which validates it; `bench --predict` reads it through here and
moespec.kernels.structure turns its rates into expert-op times.

device.json (FORMAT_NAME, FORMAT_VERSION):
  format, format_version
  device, device_kind, threads      "cpu: <model name>, <threads> threads" (moespec.measure.timing.device_name), "cpu",
                                    and the threads every timed call ran on: a prediction holds for these only; or
                                    "cuda: <name>, sm<cc>, <memory> GiB", "cuda" (the Triton kernels; threads are
                                    the host's, which a GPU's prediction does not depend on)
  ceiling_kind, ceiling_gbps, ceiling_iqr_gbps, ceiling_before_after_gbps
                                    the streaming-read ceiling (moespec.measure.timing) of this run: median and IQR
                                    over every sample taken between the timed calls, and the medians before and after
  cache_bytes                       the cache a per-slot re-read finds: a re-read of an expert with D distinct bytes
                                    read since its previous read finds min(1, cache_bytes / D) of it cached; from
                                    version 4 measured (moespec.measure.cache_probe), before it the last-level cache
  cache_nominal_bytes               (version 4) the last-level cache's size (sysfs), cache_bytes' upper bound
  cache_probe  {kernel, shape, expert_bytes, identified, distances_bytes, measured_s, ceiling_gbps, predicted_s}
                                    or null where no probe ran (a GPU: cache_bytes is its L2's size)
                                    (version 4) the probe's passes: re-read distances, measured medians and the
                                    model's times at cache_bytes; identified false: they could not tell capacities
                                    apart (cached and cold reads cost alike), cache_bytes is the nominal size
  stream_read  {chunk_bytes: [..], gbps: [..], iqr_gbps: [..]}  a cold streaming read of each chunk size the kernels
                                    read (a ~1 MiB row task, its neighbours), on all threads (null on cuda)
  threads_1    {ceiling_gbps, G: [..], speedup: [..]}  thread scaling: the 1-thread streaming read and, per G, the
                                    1-thread time of the first dtype's rate passes over the profile's threads' time
                                    (null on cuda)
  sizes        {G, cold_bytes, hot_bytes, slot_apart, cache_probe}  what the rate passes were sized to on this device
                                    kind (cold_bytes, hot_bytes: the sizes, a list; one number in files before
                                    cold_ramp_s), and whether the cache probe ran
  dtypes {dtype: {G, hot_s_per_byte, cold_excess_s_per_byte, row_s, stream_share, cold_ramp_s, cold_ramp_bytes,
          group_s, pass_s, node_s, matmul_peak_gflops}}
           per weight format timed, on synthetic shapes only: bf16, fp32 from our native expert op; the GGUF formats
           q8_0, q4_0 from ggml's pair (ggml-per-slot, ggml-mul_mat_id: the kernels that run GGUF blocks,
           moespec.kernels.peers.ggml_quantized):
           G [1, 2, ..]             tokens per group (one expert applied to G tokens), ascending from 1
           hot_s_per_byte [..]      kappa_G: seconds per weight byte of a group whose weights sit in the cache, as
                                    the hot passes measured it (the model holds it to the cold rate at ceiling_gbps)
           cold_excess_s_per_byte [..]  x_G >= 0: a cold group's seconds per byte less s_G / the ceiling sampled
                                    right after it (median) (moespec.kernels.structure)
           row_s [..]               r_G >= 0: the fixed seconds per weight row of a group: ggml's vec_dot call per
                                    row and token, fitted with x_G over rate shapes of many row lengths (required of
                                    a GGUF format); our kernels' horizontal sums and stores per row and token, fitted
                                    with kappa_G over hot shapes of short and long rows (CPU); absent: 0
           stream_share [..]        s_G in [0, 1]: the share of the stream's time 1 / C a cold group's time follows
                                    (cold per byte max(s_G / C + x_G, 1 / C)), fitted where the profile's
                                    calls met more than one state of the host, else 1; optional (absent: 1)
           cold_ramp_s [..]         F_G >= 0: what a cold pass's first cold_ramp_bytes cost past its rate and pass_s
                                    (moespec.kernels.structure), from the cold rate passes' time against their bytes;
                                    optional (absent: 0)
           cold_ramp_bytes          W > 0, with cold_ramp_s: a pass reading fewer cold bytes pays F_G x its bytes / W
           group_s, pass_s          the fixed seconds of one group and of one call
           token_s                  optional (0 where absent): the fixed seconds of each token of a call, told apart
                                    by overhead passes of 1..8 tokens (ours; ggml's per-token time is node_s)
           hot_group_s              optional (group_s where absent): the fixed seconds of a group whose expert the
                                    cache holds, from the overhead passes run hot (a per-slot re-read's)
           node_s                   the fixed seconds of each node past the first of a call that runs one node per
                                    token (ggml-per-slot); required of a GGUF format, 0 where absent (our kernels)
           matmul_peak_gflops       torch.matmul in that dtype (fp32 for a GGUF format, as a bench of it records,
                                    and on a CPU whose torch has no GEMM in it; moespec.measure.timing.matmul_peak):
                                    the compute yardstick
           slot {G, hot_s_per_byte, cold_excess_s_per_byte, stream_share, group_s, pass_s, node_s}
                                    optional: the per-slot kernel's own rates (its groups all G = 1) and fixed costs,
                                    where it is a program of its own (the Triton kernels on a GPU); absent, the rates
                                    above serve both kinds (moespec.kernels.structure.Rates.from_profile)
  shapes   {rates: {dtype: [[d, f], ..]}, hot: [[d, f], ..], rows: [[d, f], ..], overhead: [d, f], check: [d, f]}:
           the synthetic shapes timed (a GGUF format's rate shapes span more row lengths than ours; rows: the short-row
           hot shapes of our kernels on the CPU, absent in older files)
  self_check {slot|dedup: {median, max, passes}}: relative error of the model on passes of chosen ids of the check
           shape, which no rate was taken from, the worst over the dtypes; self_check_by_dtype {dtype: the same, and
           each pass} per dtype (the per-slot and deduplicating kernel of that dtype's pair): `bench --predict`
           states its median (the dtype's where the file has it, else self_check's); its `placement` [p_e]: the
           check weights' read rate per expert over the ceiling buffer's, their passes predicted with it
           (moespec.measure.placement; null or absent: none taken); the rate and cache-probe calls' ceilings were
           taken times their experts' placement before the fit
  level    optional: the host's bandwidth level every call was taken at (moespec.measure.level.Level.record; a
           pinned_gbps of null or a wait_s of 0: none pinned) and `calls`, the timed calls of the rounds
  protocol {reps, flush_bytes, timer, contention}  contention (optional): the record of the cold calls, each timed as
           the bench times one (moespec.measure.contention.Cores.cold_call, .take)
  calls    optional (absent in files before it): {dtype: [{key, bytes, rows, info, seconds, ceilings}, ..]} every
           call the fit read, so the file can be fitted again under a later model without timing anything
           (moespec.measure.profile_refit.refit): the call's key (its kind first: cold, hot, overhead, check, cache),
           its expert's bytes and weight rows, info (a rate pass's expert count, an overhead pass's [groups, nodes],
           a check or cache-probe pass's ids [n, m]), the seconds of each round and the ceilings sampled after it in
           GB/s (times its experts' placement; none for a hot call)
  refit    optional: the provenance of a fit taken again from `calls` (absent: the rates are the timing run's)
  elapsed_s, provenance (device, host, dtype, versions, git commit, timestamp, command)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from moespec import ArgumentError, MoespecError
from moespec.arguments import show
from moespec.defaults import BENCH_DTYPES, DEVICE_KINDS, KERNELS, QUANTIZED, REPS_LIMIT, THREADS_LIMIT
from moespec.formats.files import (Record, check_contention_record, check_level_record, field, format_problem,
                                   is_number, positive, read_json)

FORMAT_NAME = "moespec-device-profile"
FORMAT_VERSION = 4
CHECK_STATISTICS = ("median", "max")  # what self_check records per kernel over its passes
RATE_KEYS = ("hot_s_per_byte", "cold_excess_s_per_byte")  # per-G lists of a dtype's rates


def _fail(path: str, problem: str) -> MoespecError:
    return MoespecError(f"{path}: {problem}")


def _check_dtype(where: str, dtype: str, entry: Any) -> None:
    """One dtype's entry: its rates, the per-slot kernel's own where it has them, the matmul peak."""
    _check_rates(where, dtype, entry, dtype in QUANTIZED)
    if "slot" in entry:
        _check_rates(where, f"{dtype}.slot", entry["slot"], False)
    positive(entry, where, "matmul_peak_gflops")


def _check_rates(where: str, dtype: str, entry: Any, quantized: bool) -> None:
    """One kind's rates: G ascending whole numbers from 1, each rate list as long and positive (row_s: of a GGUF
    format, optional otherwise)."""
    if not isinstance(entry, dict):
        raise _fail(where, f"dtypes.{dtype} must be an object")
    g = entry.get("G")
    if not (isinstance(g, list) and g and g[0] == 1 and all(isinstance(v, int) and not isinstance(v, bool)
                                                            for v in g) and all(a < b for a, b in zip(g, g[1:]))):
        raise _fail(where, f"dtypes.{dtype}.G must list ascending whole numbers of tokens per group from 1, got {g!r}")
    for key in RATE_KEYS:
        _per_g(where, dtype, entry, key, lambda v: True, "")
    if not all(v > 0 for v in entry["hot_s_per_byte"]) or not all(v >= 0 for v in entry["cold_excess_s_per_byte"]):
        raise _fail(where, f"dtypes.{dtype}: hot_s_per_byte must be positive and cold_excess_s_per_byte >= 0")
    if "row_s" in entry or quantized:
        _per_g(where, dtype, entry, "row_s", lambda v: v >= 0, ">= 0")
    if "cold_ramp_s" in entry:
        _per_g(where, dtype, entry, "cold_ramp_s", lambda v: v >= 0, ">= 0")
        if not (is_number(entry.get("cold_ramp_bytes")) and entry["cold_ramp_bytes"] > 0):
            raise _fail(where, f"dtypes.{dtype}.cold_ramp_bytes = {entry.get('cold_ramp_bytes')!r} must be a number > "
                               f"0 beside cold_ramp_s")
    if "stream_share" in entry:
        _per_g(where, dtype, entry, "stream_share", lambda v: 0 <= v <= 1, "in [0, 1]")
    for key in ("group_s", "pass_s", *(("node_s",) if quantized or "node_s" in entry else ()),
                *(key for key in ("token_s", "hot_group_s") if key in entry)):
        if not (is_number(entry.get(key)) and entry[key] >= 0):
            raise _fail(where, f"dtypes.{dtype}.{key} = {entry.get(key)!r} must be a number >= 0")


def _per_g(where: str, dtype: str, entry: dict[str, Any], key: str, ok: Callable[[float], bool], words: str) -> None:
    """entry[key] lists one number per G, each ok (words says how; "" where any number is)."""
    values, count = entry.get(key), len(entry["G"])
    if not (isinstance(values, list) and len(values) == count and all(is_number(v) and ok(v) for v in values)):
        raise _fail(where, f"dtypes.{dtype}.{key} must list {count} numbers{' ' + words if words else ''}, one per G")


CALL_KINDS = ("cold", "hot", "overhead", "check", "cache")  # what a recorded call's key starts with


def _check_calls(where: str, calls: Any, dtypes: dict[str, Any]) -> None:
    """device.json `calls` where present: per dtype of the profile, its recorded calls (module docstring)."""
    if calls is None:
        return
    if not isinstance(calls, dict) or not set(calls) <= set(dtypes):
        raise _fail(where, "calls must be an object keyed by the profile's dtypes")
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    for dtype, record in calls.items():
        if not isinstance(record, list) or not record:
            raise _fail(where, f"calls.{dtype} must list the timed calls")
        for i, call in enumerate(record):
            at = f"calls.{dtype}[{i}]"
            if not isinstance(call, dict) or not isinstance(call.get("key"), list) or not call["key"] \
                    or call["key"][0] not in CALL_KINDS:
                raise _fail(where, f"{at}.key must be a list starting with one of {', '.join(CALL_KINDS)}")
            if not all(whole(call.get(k)) and call[k] > 0 for k in ("bytes", "rows")):
                raise _fail(where, f"{at}: bytes and rows must be whole numbers > 0")
            seconds, ceilings, info = call.get("seconds"), call.get("ceilings"), call.get("info")
            if not (isinstance(seconds, list) and seconds and all(is_number(v) and v > 0 for v in seconds)):
                raise _fail(where, f"{at}.seconds must list positive numbers")
            if not (isinstance(ceilings, list) and len(ceilings) in (0, len(seconds))
                    and all(is_number(v) and v > 0 for v in ceilings)):
                raise _fail(where, f"{at}.ceilings must list one positive number per call, or none")
            kind = call["key"][0]
            if kind in ("check", "cache"):
                ok = isinstance(info, list) and info and all(  # ids [n, m]: m distinct experts per token
                    isinstance(row, list) and row and all(whole(e) and e >= 0 for e in row)
                    and len(set(row)) == len(row) for row in info)
            elif kind == "overhead":
                ok = isinstance(info, list) and len(info) == 2 and all(whole(v) and v > 0 for v in info)
            else:
                ok = whole(info) and info > 0
            if not ok:
                raise _fail(where, f"{at}.info = {info!r} does not fit a {kind} call (ids, [groups, nodes] or an "
                                   f"expert count)")


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

    def self_check(self, dtype: str | None = None, statistic: str = "max") -> dict[str, float]:
        """kind (slot, dedup) -> the self-check's `statistic` (max: the largest relative error, how far the model
        can miss; median: the error `bench --predict` states, a median as the paper's eps is) over its passes: of
        `dtype`'s pair where the file has it, else the worst over its dtypes."""
        if statistic not in CHECK_STATISTICS:
            raise ArgumentError(f"statistic must be one of {', '.join(CHECK_STATISTICS)}, got {show(statistic)}")
        by_dtype = self.get("self_check_by_dtype") or {}
        check = by_dtype[dtype] if dtype in by_dtype else self["self_check"]
        return {kernel: float(check[kernel][statistic]) for kernel in KERNELS}


def load_profile(path: str | Path) -> DeviceProfile:
    """Read and validate a device.json (format, version, device, threads, ceiling, every dtype's rates, the
    self-check); one line naming the file and the problem otherwise."""
    where = str(path)
    doc = read_json(path, "device profile")
    problem = format_problem(doc, "device profile", FORMAT_NAME, FORMAT_VERSION, "device profile")
    if problem:
        raise _fail(where, problem)
    field(doc, where, "device", str)
    if doc.get("device_kind") not in DEVICE_KINDS:
        raise _fail(where, f"device_kind {doc.get('device_kind')!r} is not one of {', '.join(DEVICE_KINDS)}")
    threads = doc.get("threads")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= THREADS_LIMIT:
        raise _fail(where, f"threads = {threads!r} must be a whole number in 1..{THREADS_LIMIT}")
    for key in ("ceiling_gbps", "cache_bytes", *(("cache_nominal_bytes",) if doc["format_version"] >= 4 else ())):
        positive(doc, where, key)
    if not isinstance(doc.get("cache_probe", {}), (dict, type(None))):
        raise _fail(where, "cache_probe must be an object or null")
    if doc["format_version"] >= 4 and doc["cache_bytes"] > doc["cache_nominal_bytes"]:
        raise _fail(where, f"cache_bytes = {doc['cache_bytes']} exceeds cache_nominal_bytes = "
                           f"{doc['cache_nominal_bytes']}, the last-level cache")
    field(doc, where, "ceiling_kind", str)
    dtypes = field(doc, where, "dtypes", dict)
    if not dtypes or not set(dtypes) <= set(BENCH_DTYPES):
        raise _fail(where, f"dtypes must time some of {', '.join(BENCH_DTYPES)}, got {sorted(dtypes)}")
    for dtype, entry in dtypes.items():
        _check_dtype(where, dtype, entry)
    by_dtype = doc.get("self_check_by_dtype", {})
    if not isinstance(by_dtype, dict) or not set(by_dtype) <= set(dtypes):
        raise _fail(where, "self_check_by_dtype must be an object keyed by the profile's dtypes")
    for check in ("self_check", *(f"self_check_by_dtype.{dtype}" for dtype in by_dtype)):
        for kernel in KERNELS:
            for key in ("median", "max"):
                value = field(doc, where, f"{check}.{kernel}.{key}")
                if value < 0:
                    raise _fail(where, f"{check}.{kernel}.{key} = {value!r} must be >= 0")
    for dtype, check in by_dtype.items():
        placed = check.get("placement") if isinstance(check, dict) else None
        if placed is not None and not (isinstance(placed, list) and placed
                                       and all(is_number(v) and v > 0 for v in placed)):
            raise _fail(where, f"self_check_by_dtype.{dtype}.placement must be null or positive ratios, one per "
                               f"expert")
    _check_calls(where, doc.get("calls"), dtypes)
    check_level_record(doc, where)
    reps = field(doc, where, "protocol.reps", int)
    if not 1 <= reps <= REPS_LIMIT:
        raise _fail(where, f"protocol.reps = {reps!r} must lie in 1..{REPS_LIMIT}")
    check_contention_record(doc["protocol"].get("contention"), where, "protocol.contention")
    field(doc, where, "provenance", dict)
    return DeviceProfile(doc, path)
