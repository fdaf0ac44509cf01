"""The report's batch section: the plan's k_hat*(a, B) map (acceptance x batch size) with B_stop(a), from the verify
times measured at each B and, beside it, predicted from the bench; the step-time curves V_B(k) per batch size (the
prediction dashed); rule (7) at batch B, u_B(n) against r(B n), where the prediction holds them (newer plans); and
where the runs measured throughput at batch, the measured best k and the batch rules of each version: Table 8's six
at each batch size and B_stop (moespec.predict.batch_score)."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from moespec import theory
from moespec.predict.batch_score import VERSIONS, WORDING, score_batches, shown
from moespec.report.figures import FULL_WIDTH_IN, MS, PANEL_IN, _style
from moespec.report.markup import figure as figure_html
from moespec.report.markup import note, table


def step_time_figure(block: dict[str, Any]) -> Figure:
    """V_B(k) of the plan's policy, one colour per batch size (the prediction dashed), over the first step's time
    (left) and in ms (right): the rise of V_B(1) / V_B(0) with B is what moves k* down."""
    width = min(2 * PANEL_IN[0], FULL_WIDTH_IN)
    predicted = block.get("predicted") or {}
    with _style(width):
        fig = Figure(figsize=(width, PANEL_IN[1]))
        relative, absolute = fig.subplots(1, 2)
        for i, b in enumerate(block["batches"]):
            for version, style in ((block, "-"), (predicted, "--")):
                if not version:
                    continue
                V = np.asarray(version["per_batch"][str(b)]["step_time_s"][block["policy"]])
                ks = np.arange(len(V))
                label = f"B = {b}" + (" predicted" if style == "--" else "")
                relative.plot(ks, V / V[0], style, color=f"C{i}", marker="o", markersize=3, label=label)
                absolute.plot(ks, V * MS, style, color=f"C{i}", marker="o", markersize=3, label=label)
        relative.set(xlabel="draft length k", ylabel="V_B(k) / V_B(0)", title="step time, relative")
        absolute.set(xlabel="draft length k", ylabel="V_B(k), ms", title="step time of B sequences")
        relative.legend(loc="upper left", fontsize="small")
        fig.tight_layout()
    return fig


def has_ratios(block: dict[str, Any]) -> bool:
    """Whether the plan's prediction holds u_B(n) and r(B n) at every batch size (plans before them do not)."""
    predicted = block.get("predicted")
    return predicted is not None and all("union_share" in e and "r" in e for e in predicted["per_batch"].values())


def _ratios(entry: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n = 1..kmax + 1, u_B(n) and r(B n) of one batch size's predicted entry (r NaN where the plan has null)."""
    u = np.asarray(entry["union_share"], dtype=float)
    return np.arange(1, len(u) + 1), u, np.array([np.nan if r is None else r for r in entry["r"]], dtype=float)


def union_share_figure(block: dict[str, Any]) -> Figure:
    """Rule (7) at batch B from the prediction: u_B(n) solid and r(B n) dashed (open markers), one colour per batch
    size, over a sequence's n; dedup is predicted faster where a solid line lies below the dashed one of its
    colour. The block must hold them (has_ratios)."""
    with _style(PANEL_IN[0]):
        fig = Figure(figsize=PANEL_IN)
        ax = fig.subplots()
        for i, b in enumerate(block["batches"]):
            ns, u, r = _ratios(block["predicted"]["per_batch"][str(b)])
            ax.plot(ns, u, "-", color=f"C{i}", marker="o", markersize=3, label=f"B = {b}: u_B(n)")
            ax.plot(ns, r, "--", color=f"C{i}", marker="s", markersize=3, markerfacecolor="white",
                    label=f"B = {b}: r(B n)")
        ax.set(xlabel="tokens per sequence n", ylabel="ratio", xticks=ns, ylim=(0, None),
               title="u_B(n) against r(B n): dedup faster where u_B < r (7)")
        ax.legend(loc="best", ncol=2)
        fig.tight_layout()
    return fig


def _versus(u: float, r: float) -> str:
    """One cell: u_B(n) against r(B n) with the side it falls on; "-" for an r not evaluated."""
    return f"{u:.3f} / -" if not np.isfinite(r) else f"{u:.3f} {'<' if u < r else '>='} {r:.3f}"


def union_share_table(block: dict[str, Any]) -> str:
    """Per batch size: u_B(n) against r(B n) at each n and the least n from which u_B < r at every larger n (the
    crossover of theory.crossover on r - u, over the n where r is evaluated)."""
    rows = []
    for b in block["batches"]:
        ns, u, r = _ratios(block["predicted"]["per_batch"][str(b)])
        held = {int(n): float(r_n - u_n) for n, u_n, r_n in zip(ns, u, r) if np.isfinite(r_n)}
        first = theory.crossover(held)
        rows.append([str(b), "none" if first is None else str(first), *map(_versus, u, r)])
    return table(["B", "dedup faster from n", *(f"n = {n}" for n in range(1, block["kmax"] + 2))], rows,
                 "u_B(n) against r(B n), predicted from the bench's fits on its timed layers at the pass's B n "
                 "tokens: dedup is faster where u_B(n) < r(B n) (7); -: r not evaluated (a fitted time not positive)")


def batch_section(plan: dict[str, Any], runs: dict[str, Any] | None) -> str:
    """The section's HTML (module docstring); `runs` may be None or lack a batch block."""
    block = plan["batch"]
    batches, acceptances, predicted = block["batches"], block["acceptances"], block.get("predicted")
    scored = {}
    if runs is not None and "batch" in runs:
        scored = {version: score_batches(plan, runs, version) for version in VERSIONS
                  if version == "measured" or predicted is not None}
    best = scored.get("measured")
    rows = []
    for i, a in enumerate(acceptances):
        cells = []
        for b in batches:
            cell = str(block["per_batch"][str(b)]["k_hat"][i])
            if predicted is not None:
                cell += f" [{predicted['per_batch'][str(b)]['k_hat'][i]}]"
            if best is not None and str(b) in best["per_batch"] and a in best["acceptances"]:
                measured = best["per_batch"][str(b)]["measured_best"][best["acceptances"].index(a)]
                cell += f" / {'-' if measured is None else measured}"
            cells.append(cell)
        stops = [block["b_stop"][i]] + ([predicted["b_stop"][i]] if predicted is not None else [])
        rows.append([f"{a:g}", *cells, " [".join("-" if s is None else str(s) for s in stops)
                     + ("]" if predicted is not None else "")])
    caption = (f"k_hat*(a, B) of the {block['policy']} policy from the verify times measured at each B"
               f"{' [predicted from the bench]' if predicted is not None else ''}"
               f"{' / the best k the run measured' if best else ''}; B_stop: the least batch size from which no draft "
               f"pays at any larger one. Source: {block['source']}")
    parts = [table(["a", *(f"B = {b}" for b in batches), "B_stop"], rows, caption)]
    policy = block["policy"]
    rows = []
    for b in batches:
        e = block["per_batch"][str(b)]
        V = e["step_time_s"][policy]
        row = [str(b), "none" if e["crossover"] is None else str(e["crossover"]), f"{V[0] * MS:.2f}",
               f"{V[1] / V[0]:.3f}"]
        if predicted is not None:
            p = predicted["per_batch"][str(b)]
            W = p["step_time_s"][policy]
            row += ["none" if p["crossover"] is None else str(p["crossover"]), f"{W[0] * MS:.2f}",
                    f"{W[-1] / V[-1] - 1:+.1%}"]
        rows.append(row)
    columns = ["B", "dedup crossover n", "V_B(0), ms", "V_B(1) / V_B(0)"]
    if predicted is not None:
        columns += ["predicted crossover", "predicted V_B(0), ms", "predicted V_B(kmax) error"]
    parts.append(table(columns, rows, "per batch size: the dedup kernel's crossover, the price of the first drafted "
                                      "token, and the prediction from the bench against the measured times"))
    parts.append(figure_html(step_time_figure(block), "V_B(k) per batch size: each sequence accepts on its own, so "
                             "a step emits B G_a(k) tokens and k*(a, B) is the theory on V_B"))
    if has_ratios(block):
        parts.append(figure_html(union_share_figure(block), "u_B(n) (solid) against r(B n) (dashed) per batch size, "
                                 "predicted from the bench: dedup is faster where u_B(n) < r(B n) (7), the union of B "
                                 "sequences' experts against the kernels' bandwidth ratio at the pass's B n tokens"))
        parts.append(union_share_table(block))
    verdict = {True: " (holds)", False: " (fails)", None: ""}
    for version, result in scored.items():
        verdicts = [f"B = {b}: " + ", ".join(f"{name} {text}{verdict[holds]}" for name, text, holds in shown(e))
                    for b, e in result["per_batch"].items()]
        parts.append(note(f"{version} version, Table 8's rules at each batch size: " + "; ".join(verdicts) +
                          f"; B_stop within one grid step at every acceptance: "
                          f"{'holds' if result['b_stop_holds'] else 'fails'}; all hold: "
                          f"{'yes' if result['all_hold'] else 'no'}"))
    if scored:
        parts.append(note("; ".join(f"{name}: {wording}" for name, wording in WORDING.items())))
    return "".join(parts)
