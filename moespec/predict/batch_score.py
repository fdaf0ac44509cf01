"""Score a plan's batch map against a run at the same batch sizes: per batch size B, k_hat*(a, B) against the best k
the run measured, the crossover against the run's, and B_stop(a) against the batch at which the run's best k first
is 0 (issue rules beyond the paper's Table 8, which is at batch one).

Rules per B (the plan's batch block, moespec.predict.batch_map; the run's, moespec.measure.batch_run):
- k_hat: k_hat*(a, B) within one of the measured best draft length at >= 9 of 11 acceptances (the same share of
  another grid): the measured best is the k of the largest throughput among the run's rows of the plan's policy;
  the acceptances scored are the plan's that the run measured at every batch size;
- crossover: the plan's crossover at B within one of the run's (both none also holds);
and over the grid:
- b_stop: at every acceptance, the plan's B_stop(a) within one grid step of the measured one (no B_stop counts as
  one step past the largest B).
The measured rate scored is the one the plan names (plan.json throughput_rate, as the batch-one rules read it):
counted, emitted tokens over the steps' time, or computed, B G_a(k) / V_B(k) with the measured V_B; the best k by
each is reported (measured_best_by_rate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from moespec import MoespecError
from moespec.formats.runsfile import RATES
from moespec.predict.acceptance import plan_rate

SHARE = 9 / 11  # k_hat rule: acceptances within one of the measured best, at least this share of the grid


def measured_rows(runs: Mapping[str, Any], batch: int, policy: str) -> list[Mapping[str, Any]]:
    """The run's throughput rows of `policy` at batch B (B = 1: its own rows; B > 1: its batch block's)."""
    if batch == 1:
        return [r for r in runs.get("throughput") or [] if r.get("policy") == policy and r.get("a") is not None]
    entry = ((runs.get("batch") or {}).get("per_batch") or {}).get(str(batch))
    return [] if entry is None else [r for r in entry["throughput"] if r["policy"] == policy]


def measured_best(rows: list[Mapping[str, Any]], acceptances: list[float], rate: str) -> list[int | None]:
    """Per acceptance: the k of the largest `rate` (a row key) among the rows at that a (the smallest k on ties),
    or None."""
    best = []
    for a in acceptances:
        at = [r for r in rows if math.isclose(r["a"], a, abs_tol=1e-9) and r.get(rate) is not None]
        best.append(None if not at else min(at, key=lambda r: (-r[rate], r["k"]))["k"])
    return best


def _step(batches: list[int], b: int | None) -> int:
    return len(batches) if b is None else batches.index(b)


VERSIONS = ("measured", "prediction")  # the batch map's versions: per_batch, and predicted (from the bench)


def score_batches(plan: Mapping[str, Any], runs: Mapping[str, Any], version: str = "measured") -> dict[str, Any]:
    """The batch rules (module docstring) of one version of the plan's batch map on the run, per B and over the
    grid."""
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {', '.join(VERSIONS)}, got {version!r}")
    block = plan.get("batch")
    if block is None:
        raise MoespecError("the plan has no batch block: make it with `moespec plan --batch`")
    source = block if version == "measured" else block.get("predicted")
    if source is None:
        raise MoespecError("the plan's batch block has no prediction (its runs lacked the outside times)")
    batches, acceptances, policy = block["batches"], block["acceptances"], block["policy"]
    rate = plan_rate(plan)
    run_batches = [1] + ((runs.get("batch") or {}).get("batches") or [])
    scored = [b for b in batches if b in run_batches and measured_rows(runs, b, policy)]
    if not scored:
        raise MoespecError(f"the run measured no throughput of policy {policy} at the plan's batch sizes {batches} "
                           f"(run with --batch {','.join(map(str, batches))} --plan PLAN)")
    index = [i for i, a in enumerate(acceptances)
             if all(any(math.isclose(r["a"], a, abs_tol=1e-9) for r in measured_rows(runs, b, policy)) for b in scored)]
    if not index:
        raise MoespecError(f"the run measured none of the plan's acceptances {acceptances} at every batch size")
    acceptances = [acceptances[i] for i in index]
    per_batch, measured_k = {}, {}
    for b in scored:
        entry, rows = source["per_batch"][str(b)], measured_rows(runs, b, policy)
        best = measured_best(rows, acceptances, RATES[rate])
        measured_k[b] = best
        k_hat = [entry["k_hat"][i] for i in index]
        near = [k is not None and abs(k - kh) <= 1 for k, kh in zip(best, k_hat)]
        crossover = runs.get("crossover") if b == 1 else runs["batch"]["per_batch"][str(b)]["crossover"]
        planned = entry["crossover"]
        per_batch[str(b)] = {
            "k_hat": k_hat, "measured_best": best,
            "measured_best_by_rate": {name: measured_best(rows, acceptances, key) for name, key in RATES.items()},
            "k_hat_within_one": sum(near), "acceptances": len(acceptances),
            "k_hat_holds": sum(near) >= math.ceil(SHARE * len(acceptances) - 1e-9),
            "crossover": planned, "measured_crossover": crossover,
            "crossover_holds": planned == crossover or (planned is not None and crossover is not None
                                                        and abs(planned - crossover) <= 1)}
    stops = [next((b for b in scored if measured_k[b][i] == 0), None) for i in range(len(acceptances))]
    planned_stops = [s if s is None or s in scored else None for s in (source["b_stop"][i] for i in index)]
    b_stop_holds = [abs(_step(scored, p) - _step(scored, m)) <= 1 for p, m in zip(planned_stops, stops)]
    return {"version": version, "rate": rate, "batches": scored, "policy": policy, "acceptances": acceptances, "per_batch": per_batch,
            "b_stop": planned_stops, "measured_b_stop": stops, "b_stop_holds": all(b_stop_holds),
            "all_hold": all(b_stop_holds) and all(e["k_hat_holds"] and e["crossover_holds"]
                                                 for e in per_batch.values())}
