"""The side by side of benchmarks/structure_model.py: a predicted bench's op times against the measured bench's;
crossover and k_hat*(a) of `moespec plan` on the measured and on the predicted bench of one model, whether they agree
within one, how far two measured crossovers move apart, and the speedup the predicted k_hat*(a) gives up on the
measured bench."""

from __future__ import annotations

from itertools import combinations
from collections.abc import Mapping
from typing import Any

from moespec import theory
from moespec.predict.plan import PlanConfig, make_plan
from moespec.predict.rules import judge_k_hat, judge_loss

PLAN_ACCEPTANCES = tuple(map(float, theory.PAPER_ACCEPTANCES))  # the 11 acceptances rules 2 and 3 are scored at


def side_state(measured: Mapping[str, Any]) -> dict[str, Any]:
    """predict_bench's state of a measured bench's side: the ceilings it sampled at each n (ceiling_by_n_gbps), where
    its passes were timed, else its one ceiling, and each layer's placement where it measured one (the memory its draw
    of the weights lay in). Its between-group ceiling can read several percent above those samples, and its weights'
    memory several percent below the ceiling's buffer, while a plan's k_hat*(a) turns on a few percent of V(k) where
    T_a(k) (9) is flat: the side by side reads the model's error at the state the bench met, as pass_errors does."""
    by_n = measured.get("ceiling_by_n_gbps")
    placed = {int(layer): p for layer, p in (measured.get("placement") or {}).items() if p is not None}
    return {"ceiling_gbps": {int(n): float(c) for n, c in by_n.items()} if by_n else float(measured["ceiling_gbps"]),
            "placement": placed or None}


def bench_errors(measured: Mapping[str, Any], predicted: Mapping[str, Any],
                 layer: int = 0) -> dict[str, dict[str, float]]:
    """Per kernel and n: the predicted bench's op time over the measured bench's, less 1 (each the mean over the
    recorded windows of that n, at MoE layer `layer`)."""
    got, want = (b["per_layer"][str(layer)]["kernels"] for b in (predicted, measured))
    return {k: {n: got[k][n]["measured_mean_s"] / v["measured_mean_s"] - 1 for n, v in by_n.items()}
            for k, by_n in want.items()}


def plan_summary(bench_path: str, trace: str, tau1: float, version: str = "prediction") -> dict[str, Any]:
    """Crossover and k_hat*(a) (AUTO) of `moespec plan` on a bench in one version: "prediction" (22), the fits' op
    times, which a plan of a bench alone answers in, or "measured-time", the bench's own op times as timed (the
    paper's primary version); or why the plan refused."""
    try:
        plan = make_plan(PlanConfig(bench=bench_path, trace=trace, tau1=tau1))
    except Exception as e:  # noqa: BLE001 - a refusal (too small to time) is a result here
        return {"refused": " ".join(str(e).split())[:300]}
    suffix = {"prediction": "", "measured-time": "_measured"}[version]
    k_hat = {str(row["a"]): row["k_hat"] for row in plan["table" + suffix]
             if row["policy"] == "auto" and any(abs(row["a"] - a) < 1e-9 for a in PLAN_ACCEPTANCES)}
    return {"version": version, "crossover": plan["crossover" + suffix], "k_hat": k_hat,
            "step_times": plan["step_times" + suffix]["auto"]}


def plan_sides(measured: str, predicted: str, alone: str, trace: str, tau1: float) -> dict[str, Any]:
    """errors.json's `plan`: the measured bench's plan in its measured-time version (the op times as timed: its
    fits (4) can miss a one-token pass by more than the structural model does, and the prediction (22) anchors on
    that pass), the predicted bench's and the profile-alone bench's as a user's plan answers (the prediction), and
    the speedup each predicted k_hat*(a) gives up on the measured one (plan_loss)."""
    sides = {"measured": plan_summary(measured, trace, tau1, "measured-time"),
             "predicted": plan_summary(predicted, trace, tau1), "from_profile": plan_summary(alone, trace, tau1)}
    return {"tau1_s": tau1, **sides, "loss": plan_loss(sides["measured"], sides["predicted"]),
            "loss_from_profile": plan_loss(sides["measured"], sides["from_profile"])}


def plan_loss(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, float] | None:
    """Per acceptance a: the speedup the measured bench's plan gives up at the predicted k_hat*(a) against its own
    k_hat*(a), 1 - T_a(k_pred) / T_a(k_meas) (9) on the measured plan's AUTO step times (None where either plan
    refused): where T_a is flat in k, a k_hat* off by more than one can cost a fraction of a percent."""
    if "k_hat" not in measured or "k_hat" not in predicted:
        return None
    V = measured["step_times"]
    return {a: 1.0 - float(theory.speedup(V, float(a), predicted["k_hat"][a]) / theory.speedup(V, float(a), k))
            for a, k in measured["k_hat"].items()}


def within_one(side: dict[str, Any], which: str = "predicted") -> dict[str, bool | None]:
    """Whether the predicted bench's crossover (B = 1) and the k_hat*(a) of side `which` ("predicted", or
    "from_profile": the profile alone) lie within one of the measured bench's (every acceptance), and whether that
    k_hat*(a) meets the paper's rules 2 and 3 (Table 8: within one at 9 of 11 acceptances, scaled to those present,
    and at most 6% of the measured plan's throughput given up at every one); None where a plan refused either or the
    side is not recorded."""
    plan = side.get("plan") or {}
    measured, predicted = plan.get("measured", {}).get("k_hat"), (plan.get(which) or {}).get("k_hat")
    crossover, loss = side["crossover"], plan.get("loss" if which == "predicted" else f"loss_{which}")
    both = bool(measured and predicted)
    return {"crossover": None if None in (crossover["measured"], crossover["predicted"])
            else abs(crossover["measured"] - crossover["predicted"]) <= 1,
            "k_hat": None if not both else all(abs(measured[a] - predicted[a]) <= 1 for a in measured),
            "paper_rules": None if not (both and loss) else
            judge_k_hat([{"k_hat": predicted[a], "k_star": k} for a, k in measured.items()])[1]
            and judge_loss([{"a": float(a), "loss": v} for a, v in loss.items()])[1]}


def repeatability(crossings: list[int | None]) -> dict[str, int]:
    """How far two measurements of one crossover move apart: of the pairs of runs, how many measured crossovers
    within one of each other (None, no crossover, agrees only with None). The predicted crossover's target is read
    against this: where the saving's sign at some n lies inside the bench's own noise, two benches disagree too."""
    pairs = list(combinations(crossings, 2))
    return {"pairs": len(pairs), "within": sum(a == b if None in (a, b) else abs(a - b) <= 1 for a, b in pairs)}


KHAT_VERDICTS = ("k_hat", "paper_rules", "k_hat_alone", "paper_rules_alone")  # agreement's k_hat*(a) counts


def agreement(sides: list[dict[str, Any]]) -> dict[str, Any]:
    """One model's side by sides over runs (table.json's side_by_side entries): per verdict of within_one (the
    crossover; k_hat*(a) at every a and by the paper's rules, of the predicted bench and of the profile alone) the
    runs within, refused and in all; the measured crossover per run with its repeatability, the measured bench's own
    k_hat*(a) per a over the runs (how far two measurements of one model move apart), and each run's largest speedup
    given up at the predicted k_hat*(a) (runs whose errors.json has it)."""
    verdicts = [within_one(s) | {f"{k}_alone": v for k, v in within_one(s, "from_profile").items() if k != "crossover"}
                for s in sides]
    out: dict[str, Any] = {}
    for key in ("crossover", *KHAT_VERDICTS):  # the profile alone: the runs that recorded that side
        got = [v[key] for s, v in zip(sides, verdicts) if not key.endswith("_alone") or "from_profile" in
               (s.get("plan") or {})]
        out[key] = {"within": sum(g is True for g in got), "refused": sum(g is None for g in got), "runs": len(got)}
    measured = [k for s in sides if (k := ((s.get("plan") or {}).get("measured") or {}).get("k_hat"))]
    out["measured_k_hat"] = {a: [k[a] for k in measured] for a in (measured[0] if measured else {})}
    crossings = [s["crossover"]["measured"] for s in sides]
    out["measured_crossover"] = {"runs": crossings, **repeatability(crossings)}
    out["loss"] = [max(loss.values()) for s in sides if (loss := (s.get("plan") or {}).get("loss"))]
    return out
