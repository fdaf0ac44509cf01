"""Every figure moespec draws, as a bare matplotlib Figure (no pyplot: no backend, no global figure state to
close), and `save_figure`, which writes one atomically for a command's --plot: Figure 1 (reuse), Figure 2
(bandwidth), the staircase k_hat*(a), Figure 4 (the saving) and Figure 5 (per acceptance)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure

from moespec import MoespecError, theory
from moespec.formats.files import atomic_write, check_output
from moespec.formats.planfile import VERSION_SUFFIX
from moespec.routing.reuse import ReuseStats, uniform_rho

PLOT_FORMATS = ("png", "pdf", "svg")  # what matplotlib writes without extra backends


def plot_format(path: str) -> str:
    """The image format named by a --plot path's suffix; one clear error line for anything else."""
    fmt = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if fmt not in PLOT_FORMATS:
        raise MoespecError(f"--plot {path}: the file name must end in one of .{', .'.join(PLOT_FORMATS)}")
    return fmt


def check_plot(path: str) -> str:
    """A --plot path checked before any work: an image suffix matplotlib writes, and a place moespec may write."""
    plot_format(path)
    check_output(path, "--plot")
    return path


def save_figure(fig: Figure, path: str) -> None:
    """Write `fig` to `path` atomically, in the format its suffix names."""
    fmt = plot_format(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt))


def bandwidth_figure(doc: Any) -> Figure:
    """The paper's Figure 2 as a matplotlib Figure (no pyplot: nothing global to close): each kernel's effective
    bandwidth vs n (median and IQR over recorded windows); per-slot kind solid with filled markers, dedup kind
    dashed with open markers; the ceiling dotted."""
    ns = doc["n"]
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.subplots()
    for i, (name, k) in enumerate(doc["kernels"].items()):
        med = np.array([k["beta_gbps"][str(n)] for n in ns])
        half = np.array([k["beta_iqr_gbps"][str(n)] for n in ns]) / 2
        slot = k["kind"] == "slot"
        ax.errorbar(ns, med, yerr=half, fmt="o-" if slot else "o--", color=f"C{i}", capsize=2,
                    markerfacecolor=f"C{i}" if slot else "white", label=f"{name} ({k['kind']})")
    ax.axhline(doc["ceiling_gbps"], linestyle=":", color="black",
               label=f"{doc['ceiling_kind']} (ceiling) {doc['ceiling_gbps']:.1f} GB/s")
    ax.set(xlabel="tokens per pass n", ylabel="effective bandwidth (GB/s)", xticks=ns, ylim=(0, None),
           title=f"{doc['model']} {doc['dtype']}, MoE layers {', '.join(map(str, doc['layers']))}")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig

def reuse_figure(stats: ReuseStats, label: str) -> Figure:
    """The paper's Figure 1 as a matplotlib Figure: layer-mean rho(n) with its interval band, each layer faint,
    uniform routing dotted. A bare Figure (no pyplot): nothing global to close, any caller may save it."""
    n = np.arange(1, stats.n_max + 1)
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.subplots()
    for layer, layer_rho in enumerate(stats.rho[:, 1:]):
        ax.plot(n, layer_rho, color="tab:blue", alpha=0.12, linewidth=0.8, label=None if layer else "each layer")
    if "rho_mean" in stats.ci:
        lo, hi = stats.ci["rho_mean"]
        ax.fill_between(n, lo[1:], hi[1:], color="tab:blue", alpha=0.25, linewidth=0,
                        label=f"{stats.level:.0%} bootstrap interval")
    ax.plot(n, stats.rho_mean[1:], "o-", color="tab:blue", label=f"{label}, layer mean")
    q = 1 - stats.m / stats.num_experts
    ax.plot(n, uniform_rho(stats.n_max, stats.num_experts, stats.m)[1:], ":", color="black",
            label=f"uniform, m/N = {stats.m}/{stats.num_experts}: $1 - q^{{n-1}}$, q = {q:.4g}")
    ax.set(xlabel="consecutive tokens n", ylabel=r"reuse $\rho_l(n)$", ylim=(0, 1), xticks=n)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig

# one color, line and marker per policy in every figure
STYLE = {"slot": dict(color="C0", linestyle="-", marker="o"), "dedup": dict(color="C1", linestyle="--", marker="s"),
         "auto": dict(color="C2", linestyle=":", marker="^")}

# Draft lengths of different policies often coincide; these vertical offsets (in draft lengths) keep each visible.
K_OFFSET = {"slot": -0.06, "dedup": 0.0, "auto": 0.06}

FIG_DPI = 110  # sharp at the figures' 5.5-inch width on a laptop screen; the page stays well under 1 MB

MS = 1e3  # times are stored in seconds and shown in milliseconds


# plan.json version -> (its staircase key, its step-time key)
PLAN_VERSIONS = {v: (f"staircase{s}", f"step_times{s}") for v, s in VERSION_SUFFIX.items()}


def staircase_figure(plan: Any, versions: Sequence[str], policies: Sequence[str]) -> Figure:
    """k_hat*(a) of each policy as a step function with its step points (markers), one panel per plan version."""
    fig = Figure(figsize=(5.5 * len(versions), 3.8))
    axes = fig.subplots(1, len(versions), squeeze=False)[0]
    for ax, version in zip(axes, versions):
        stairs = plan[PLAN_VERSIONS[version][0]]
        for p in policies:
            intervals = stairs[p]["intervals"]
            xs = [iv["lo"] for iv in intervals] + [intervals[-1]["hi"]]
            ys = np.array([iv["k"] for iv in intervals] + [intervals[-1]["k"]]) + K_OFFSET[p]
            style = STYLE[p]
            ax.step(xs, ys, where="post", color=style["color"], linestyle=style["linestyle"], label=p)
            points = [(a, j) for j, a in enumerate(stairs[p]["step_points"], start=1) if a < 1]
            if points:
                a, j = zip(*points)
                ax.plot(a, np.array(j) + K_OFFSET[p], linestyle="none", marker=style["marker"],
                        color=style["color"], markersize=4)
        ax.set(xlabel="acceptance a", ylabel=r"best draft length $\hat k^*(a)$", xlim=(0, 1),
               yticks=range(plan["kmax"] + 1), title=f"{version}: step points (markers) a_j, k* >= j for a > a_j")
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def saving_figure(plan: Any, runs: Any | None) -> Figure:
    """Figure 4: the plan's predicted saving with its band (18), its measured-time and calibrated versions, and,
    given runs, the engine's measured saving with its 95% interval."""
    saving = plan["saving"]
    ns = sorted(map(int, saving))
    series = lambda key: np.array([saving[str(n)][key] for n in ns]) * MS  # noqa: E731
    fig = Figure(figsize=(6.5, 4.0))
    ax = fig.subplots()
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.fill_between(ns, series("lo_s"), series("hi_s"), color="C0", alpha=0.18, linewidth=0,
                    label="predicted band (18)")
    ax.plot(ns, series("predicted_s"), "o-", color="C0", label="predicted S_hat(n)")
    ax.plot(ns, series("measured_s"), "s--", color="C1", markerfacecolor="white",
            label="measured-time version (bench medians)")
    if all("calibrated_s" in saving[str(n)] for n in ns):
        ax.plot(ns, series("calibrated_s"), "^:", color="C2", label="calibrated version")
    if runs is not None:
        measured = [n for n in ns if str(n) in runs["saving_s"]]
        med, lo, hi = (np.array([runs["saving_s"][str(n)][key] for n in measured]) * MS
                       for key in ("median", "lo", "hi"))
        # a percentile interval of a difference of medians need not contain the point estimate: clip at it
        ax.errorbar(measured, med, yerr=np.maximum([med - lo, hi - med], 0), fmt="D", color="black", capsize=3,
                    label="engine: measured S(n), 95% interval")
    ax.set(xlabel="tokens per pass n", ylabel="saving S(n) = tau_slot - tau_dedup (ms)", xticks=ns,
           title=f"{plan['model']} {plan['dtype']}, {plan['device']}")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def acceptance_figure(per_policy: dict[str, list[dict]], predicted: dict[tuple[str, float], float],
                      deltas: dict[str, float | None], kmax: int, loss_limit: float) -> Figure:
    """Figure 5: per policy and acceptance, k_hat* vs the measured best k, the throughput lost at k_hat* vs the
    bound (20), and the speedup error vs the band (21) (moespec.predict.score.acceptance_rows gives the rows)."""
    fig = Figure(figsize=(13, 3.9))
    ax_k, ax_loss, ax_err = fig.subplots(1, 3)
    for p, entries in per_policy.items():
        style = STYLE[p]
        a = [r["a"] for r in entries]
        error = [r["speedup"] / predicted[p, r["a"]] - 1 for r in entries]
        ax_k.plot(a, np.array([r["k_hat"] for r in entries]) + K_OFFSET[p], linestyle=style["linestyle"],
                  marker=style["marker"], color=style["color"], markerfacecolor="white", label=f"{p}: k_hat* (plan)")
        ax_k.plot(a, np.array([r["k_star"] for r in entries]) + K_OFFSET[p], linestyle="none",
                  marker=style["marker"], color=style["color"], markersize=4, label=f"{p}: measured best k")
        ax_loss.plot(a, [100 * r["loss"] for r in entries], marker=style["marker"], color=style["color"],
                     linestyle=style["linestyle"], label=p)
        ax_err.plot(a, [100 * e for e in error], marker=style["marker"], color=style["color"],
                    linestyle=style["linestyle"], label=p)
        delta = deltas.get(p)
        if delta is not None:
            floor = float(theory.throughput_floor(delta))
            ax_loss.axhline(100 * float(theory.throughput_loss_bound(delta)), color=style["color"], linewidth=0.8,
                            alpha=0.6)
            ax_err.axhspan(100 * (floor - 1), 100 * (1 / floor - 1), color=style["color"], alpha=0.08)
    ax_loss.axhline(100 * loss_limit, color="black", linestyle=":", linewidth=1, label=f"rule 3: {loss_limit:.0%}")
    ax_err.axhline(0, color="grey", linewidth=0.8)
    ax_k.set(xlabel="acceptance a", ylabel="draft length k", title="k_hat* (open) vs measured best k (filled)",
             yticks=range(kmax + 1))
    ax_loss.set(xlabel="acceptance a", ylabel="throughput lost at k_hat* (%)", ylim=(0, None),
                title="loss vs bound (20) 2d/(1+d) (thin lines)")
    ax_err.set(xlabel="acceptance a", ylabel="measured / predicted best speedup - 1 (%)",
               title="speedup error vs band (21) (shaded)")
    for ax in (ax_k, ax_loss, ax_err):
        ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    return fig
