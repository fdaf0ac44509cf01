"""The report's batch section: the plan's k_hat*(a, B) map (acceptance x batch size) with B_stop(a), its step-time
curves V_B(k) per batch size, and where the runs measured throughput at batch, the measured best k beside k_hat* and
the batch rules (moespec.predict.batch_score)."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from moespec.predict.batch_score import score_batches
from moespec.report.figures import FULL_WIDTH_IN, PANEL_IN, _style
from moespec.report.markup import figure as figure_html
from moespec.report.markup import note, table

MS = 1e3


def step_time_figure(block: dict[str, Any]) -> Figure:
    """V_B(k) of the plan's policy, one curve per batch size, over the first step's time (left), and in ms (right):
    the rise of V_B(1) / V_B(0) with B is what moves k* down."""
    width = min(2 * PANEL_IN[0], FULL_WIDTH_IN)
    with _style(width):
        fig = Figure(figsize=(width, PANEL_IN[1]))
        relative, absolute = fig.subplots(1, 2)
        for b in block["batches"]:
            V = np.asarray(block["per_batch"][str(b)]["step_time_s"][block["policy"]])
            ks = np.arange(len(V))
            relative.plot(ks, V / V[0], marker="o", markersize=3, label=f"B = {b}")
            absolute.plot(ks, V * MS, marker="o", markersize=3, label=f"B = {b}")
        relative.set(xlabel="draft length k", ylabel="V_B(k) / V_B(0)", title="step time, relative")
        absolute.set(xlabel="draft length k", ylabel="V_B(k), ms", title="step time of B sequences")
        relative.legend(loc="upper left")
        fig.tight_layout()
    return fig


def batch_section(plan: dict[str, Any], runs: dict[str, Any] | None) -> str:
    """The section's HTML (module docstring); `runs` may be None or lack a batch block."""
    block = plan["batch"]
    batches, acceptances = block["batches"], block["acceptances"]
    scored = None
    if runs is not None and "batch" in runs:
        scored = score_batches(plan, runs)
    rows = []
    for i, a in enumerate(acceptances):
        cells = []
        for b in batches:
            k = block["per_batch"][str(b)]["k_hat"][i]
            measured = None if scored is None or str(b) not in scored["per_batch"] else \
                scored["per_batch"][str(b)]["measured_best"][i]
            cells.append(f"{k}" if measured is None else f"{k} / {measured}")
        stop = block["b_stop"][i]
        rows.append([f"{a:g}", *cells, "-" if stop is None else str(stop)])
    caption = (f"k_hat*(a, B) of the {block['policy']} policy{' / the measured best k' if scored else ''}; B_stop: "
               f"the least batch size at which no draft pays. Source: {block['source']}")
    parts = [table(["a", *(f"B = {b}" for b in batches), "B_stop"], rows, caption)]
    rows = [[str(b), str(e["crossover"] if e["crossover"] is not None else "none"),
             f"{e['step_time_s'][block['policy']][0] * MS:.2f}",
             f"{e['step_time_s'][block['policy']][1] / e['step_time_s'][block['policy']][0]:.3f}"]
            for b, e in ((b, block["per_batch"][str(b)]) for b in batches)]
    parts.append(table(["B", "dedup crossover n", "V_B(0), ms", "V_B(1) / V_B(0)"], rows,
                       "per batch size: the dedup kernel's crossover and the price of the first drafted token"))
    parts.append(figure_html(step_time_figure(block), "V_B(k) per batch size: each sequence accepts on its own, so "
                             "a step emits B G_a(k) tokens and k*(a, B) is the theory on V_B"))
    if scored is not None:
        verdicts = [f"B = {b}: k_hat within one at {e['k_hat_within_one']} of {e['acceptances']}"
                    f" ({'holds' if e['k_hat_holds'] else 'fails'}), crossover {e['crossover']} against "
                    f"{e['measured_crossover']} ({'holds' if e['crossover_holds'] else 'fails'})"
                    for b, e in scored["per_batch"].items()]
        parts.append(note("; ".join(verdicts) + f"; B_stop within one grid step at every acceptance: "
                          f"{'holds' if scored['b_stop_holds'] else 'fails'}"))
    return "".join(parts)
