"""The device profile's self-check (moespec.measure.device_profile): both kernels on chosen ids of one shape no model
has, predicted by the structural model (moespec.kernels.structure) from the profile's own rates at each pass's
ceiling; the median and largest relative error per kernel are the profile's stated error (device.json `self_check`,
the worst format's, and `self_check_by_dtype`, each format's passes). A recorded profile's check can be taken again
under the current rules from the passes it recorded (recheck): nothing is timed, so a change of the model is read
on the same calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moespec.defaults import KERNELS
from moespec.kernels.structure import Rates, kind_rates, pass_time
from moespec.measure.passes import chosen_ids
from moespec.measure.profile_fit import Item, Key
from moespec.model.weights import expert_matrix_bytes, expert_rows

CHECK_SHAPE = (2304, 896)  # the self-check's shape: no rate is taken from it
CHECK_EXPERTS, CHECK_SLOTS, CHECK_N = 32, 4, (2, 5, 9)
CHECK_SEED = 0  # the same passes in every profile, so a recorded profile's passes can be drawn again


def check_passes() -> list[tuple[int, int, np.ndarray]]:
    """The self-check's passes, (n, U, ids [n, CHECK_SLOTS]) on CHECK_EXPERTS experts: at each of CHECK_N, chosen
    ids at the smallest, a middle and the largest U, seeded."""
    rng, out = np.random.default_rng(CHECK_SEED), []
    for n in CHECK_N:
        top = min(n * CHECK_SLOTS, CHECK_EXPERTS)
        out += [(n, u, chosen_ids(n, CHECK_SLOTS, CHECK_EXPERTS, u, rng))
                for u in sorted({CHECK_SLOTS, (CHECK_SLOTS + top) // 2, top})]
    return out


def self_check(rates: dict[str, Rates], by_key: dict[Key, Item], info: dict[Key, Any],
               cache_bytes: int, placement: list[float] | None = None) -> dict[str, Any]:
    """Per kernel kind: median and largest relative error of the model (rates[kind]) on the check passes (keys
    ("check", kind, n, U), info (expert bytes, rows, ids)), each predicted at the median ceiling of its own calls and
    the check weights' `placement` (moespec.measure.placement; None: 1 for every expert); every pass's numbers and
    the placement."""
    rows = []
    for k, (b, rows_per_expert, ids) in info.items():
        if k[0] == "check":
            item = by_key[k]
            ceiling = float(np.median(item.ceilings))
            rows.append({"kernel": k[1], "n": k[2], "U": k[3], "ceiling_gbps": ceiling,
                         "measured_s": float(np.median(item.seconds)),
                         "predicted_s": pass_time(rates[k[1]], k[1], ids, b, rows_per_expert, ceiling, cache_bytes,
                                                  placement)})
    out: dict[str, Any] = {"passes": rows, "placement": placement}
    for kernel in KERNELS:
        errors = [abs(r["predicted_s"] / r["measured_s"] - 1) for r in rows if r["kernel"] == kernel]
        out[kernel] = {"median": float(np.median(errors)), "max": float(max(errors)), "passes": len(errors)}
    return out


def worst(checks: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """device.json `self_check` from each format's self_check: per kernel kind the largest median, maximum and pass
    count over the formats."""
    return {kernel: {key: max(check[kernel][key] for check in checks.values()) for key in ("median", "max", "passes")}
            for kernel in KERNELS}


def recheck(doc: dict[str, Any]) -> dict[str, Any]:
    """A profile document (device.json) with its self-check taken again from the check passes it recorded (each at
    its recorded median time and ceiling, and the check weights' placement where recorded) under the current rules:
    its rates as a prediction loads them (kind_rates at its ceiling) and its cache_bytes."""
    doc = dict(doc)
    by_dtype = {}
    for dtype, check in doc["self_check_by_dtype"].items():
        b, rows = expert_matrix_bytes(*CHECK_SHAPE, dtype), expert_rows(*CHECK_SHAPE)
        recorded = {(r["kernel"], r["n"], r["U"]): r for r in check["passes"]}
        by_key, info = {}, {}
        for n, u, ids in check_passes():
            for kind in ("slot", "dedup"):
                row, key = recorded[(kind, n, u)], ("check", kind, n, u)
                by_key[key] = Item(key, lambda: None, seconds=[row["measured_s"]], ceilings=[row["ceiling_gbps"]])
                info[key] = (b, rows, ids)
        by_dtype[dtype] = self_check(kind_rates(doc["dtypes"][dtype], doc["ceiling_gbps"]), by_key, info,
                                     doc["cache_bytes"], check.get("placement"))
    return doc | {"self_check_by_dtype": by_dtype, "self_check": worst(by_dtype)}
