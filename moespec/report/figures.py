"""Every figure moespec draws, as a bare matplotlib Figure (no pyplot: no backend, no global figure state to
close), and `save_figure`, which writes one atomically for a command's --plot: Figure 1 (reuse), Figure 2
(bandwidth), the staircase k_hat*(a), Figure 4 (the saving) and Figure 5 (per acceptance).

Legible on the report's page. The page (moespec.report.markup) is at most PAGE_PX CSS pixels wide and shows a
PNG of FIG_DPI at one CSS pixel per image pixel, scaled down to the page when wider. A text of s points is then
s / 72 x FIG_DPI x min(1, page / image width) pixels on the page (page_scale). Every figure is drawn inside
`_style`, whose font sizes (matplotlib rcParams, set for that figure only) keep its smallest text at least
MIN_TEXT_PX on the page; no figure is wider than the page (FULL_WIDTH_IN), so none is scaled down there, and no
text is set in mathtext, whose sub- and superscripts come out smaller than their text's size.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from moespec import MoespecError, theory
from moespec.formats.files import atomic_write, check_output
from moespec.formats.planfile import VERSION_SUFFIX
from moespec.routing.reuse import ReuseStats, uniform_rho

PLOT_FORMATS = ("png", "pdf", "svg")  # what matplotlib writes without extra backends

FIG_DPI = 110  # sharp at the figures' 5.5-inch width on a laptop screen; the page stays well under 1 MB
PAGE_PX = 1150  # the report page's content width in CSS pixels (moespec.report.markup's style sheet)
IMG_BORDER_PX = 1  # the page's border around each figure, inside that width
MIN_TEXT_PX = 10  # the smallest text of a figure on the page, in CSS pixels
FULL_WIDTH_IN = 10.4  # the widest figure: 1144 pixels at FIG_DPI, inside the page with its border
# font sizes in points of a figure shown at full size: legend and notes, ticks, axis labels, titles (the legend's
# 7.5 pt is 11.5 pixels at FIG_DPI)
TEXT_PT = {"legend": 7.5, "tick": 8.5, "label": 9.0, "title": 9.5}


def page_scale(width_in: float, page_px: float = PAGE_PX, dpi: float = FIG_DPI) -> float:
    """How much the page scales a figure `width_in` inches wide drawn at `dpi` (1: shown at full size)."""
    if not (width_in > 0 and page_px > 0 and dpi > 0):
        raise ValueError(f"width_in, page_px and dpi must be positive, got {width_in}, {page_px}, {dpi}")
    return min(1.0, (page_px - 2 * IMG_BORDER_PX) / (width_in * dpi))


def _style(width_in: float) -> Any:
    """rcParams for one figure `width_in` inches wide (TEXT_PT, raised so the smallest text stays at least
    MIN_TEXT_PX on the page): a context to draw the figure in, nothing global."""
    least = MIN_TEXT_PX * 72 / (FIG_DPI * page_scale(width_in))  # points of a MIN_TEXT_PX text on the page
    raise_by = max(0.0, least - TEXT_PT["legend"])
    size = {key: pt + raise_by for key, pt in TEXT_PT.items()}
    return rc_context({"font.size": size["legend"], "legend.fontsize": size["legend"],
                       "legend.title_fontsize": size["legend"], "xtick.labelsize": size["tick"],
                       "ytick.labelsize": size["tick"], "axes.labelsize": size["label"],
                       "axes.titlesize": size["title"], "figure.titlesize": size["title"]})


def _shows_beside(ax: Axes, extent: float, linewidth: float) -> bool:
    """Whether a spread of `extent` on ax's y axis shows beside a line of `linewidth` points drawn over it (a point
    of it on each side); ax's layout and limits must be final."""
    lo, hi = ax.get_ylim()
    points_per_unit = ax.get_position().height * ax.figure.get_figheight() * 72 / (hi - lo)
    return extent * points_per_unit >= linewidth + 2


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


PANEL_IN = (5.5, 3.8)  # one panel: Figures 1 and 2, each panel of the staircase


def _ceiling(ax: Axes, doc: Any) -> Any:
    """The device's ceiling drawn where it was measured (dotted, gid "ceiling"): at each n, the median of the samples
    taken between that n's rounds (ceiling_by_n_gbps), the machine the kernels were timed on. Older files lack them:
    then the run's median of the samples before and after the timing as a level line, inside a band (gid "ceiling
    band") from the median before to the median after where the file records them. Returns the legend handle."""
    ns, kind = doc["n"], doc["ceiling_kind"]
    by_n = doc.get("ceiling_by_n_gbps") or {}
    if all(str(n) in by_n for n in ns):
        return ax.plot(ns, [by_n[str(n)] for n in ns], ":", marker="_", markersize=12, color="black", gid="ceiling",
                       label=f"{kind} ceiling at each n")[0]
    around = doc.get("ceiling_before_after_gbps")
    label = f"{kind} ceiling {doc['ceiling_gbps']:.1f} GB/s, before and after the timing"
    line = ax.axhline(doc["ceiling_gbps"], linestyle=":", color="black", gid="ceiling", label=label)
    if not around:
        return line
    lo, hi = sorted(around)
    band = ax.axhspan(lo, hi, color="black", alpha=0.1, linewidth=0, gid="ceiling band")
    line.set_label(f"{label} ({lo:.1f}-{hi:.1f})")
    return band, line


def bandwidth_figure(doc: Any) -> Figure:
    """The paper's Figure 2 as a matplotlib Figure (no pyplot: nothing global to close): each kernel's effective
    bandwidth vs n (median and IQR over recorded windows); per-slot kind solid with filled markers, dedup kind
    dashed with open markers; the ceiling dotted, where it was measured (_ceiling)."""
    ns = doc["n"]
    with _style(PANEL_IN[0]):
        fig = Figure(figsize=PANEL_IN)
        ax = fig.subplots()
        for i, (name, k) in enumerate(doc["kernels"].items()):
            med = np.array([k["beta_gbps"][str(n)] for n in ns])
            half = np.array([k["beta_iqr_gbps"][str(n)] for n in ns]) / 2
            slot = k["kind"] == "slot"
            ax.errorbar(ns, med, yerr=half, fmt="o-" if slot else "o--", color=f"C{i}", capsize=2,
                        markerfacecolor=f"C{i}" if slot else "white", label=f"{name} ({k['kind']})")
        ceiling = _ceiling(ax, doc)
        ax.set(xlabel="tokens per pass n", ylabel="effective bandwidth (GB/s)", xticks=ns, ylim=(0, None),
               title=f"{doc['model']} {doc['dtype']}, MoE layers {', '.join(map(str, doc['layers']))}")
        handles, labels = ax.get_legend_handles_labels()
        line = ceiling[-1] if isinstance(ceiling, tuple) else ceiling
        ax.legend([ceiling if h is line else h for h in handles], labels, loc="best")  # the band with its line
        fig.tight_layout()
    return fig


def reuse_figure(stats: ReuseStats, label: str) -> Figure:
    """The paper's Figure 1 as a matplotlib Figure: layer-mean rho(n) with its interval band, each layer faint,
    uniform routing dotted. A bare Figure (no pyplot): nothing global to close, any caller may save it. The legend
    names the layers and the band only where they show beside the mean's line; where they hide under it, a note in
    the panel says so and how narrow they are."""
    n = np.arange(1, stats.n_max + 1)
    per_layer = stats.rho[:, 1:]
    with _style(PANEL_IN[0]):
        fig = Figure(figsize=PANEL_IN)
        ax = fig.subplots()
        layers = [ax.plot(n, layer_rho, color="tab:blue", alpha=0.3, linewidth=0.8)[0]
                  for layer_rho in per_layer] if len(per_layer) > 1 else []
        band = None
        if "rho_mean" in stats.ci:
            lo, hi = stats.ci["rho_mean"]
            band = ax.fill_between(n, lo[1:], hi[1:], color="tab:blue", alpha=0.25, linewidth=0)
        mean = ax.plot(n, stats.rho_mean[1:], "o-", color="tab:blue", label=f"{label}, layer mean")[0]
        q = 1 - stats.m / stats.num_experts
        ax.plot(n, uniform_rho(stats.n_max, stats.num_experts, stats.m)[1:], ":", color="black",
                label=f"uniform, m/N = {stats.m}/{stats.num_experts}: 1 - q^(n-1), q = {q:.4g}")
        ax.set(xlabel="consecutive tokens n", ylabel="reuse rho(n)", ylim=(0, 1), xticks=n)
        fig.tight_layout()
        hidden = []
        if layers:
            spread = float(np.ptp(per_layer, axis=0).max())
            if _shows_beside(ax, spread, mean.get_linewidth()):
                layers[0].set_label("each layer")
            else:
                hidden.append(f"the {len(layers)} layers (spread at most {spread:.3f})")
        if band is not None:
            width = float((hi - lo)[1:].max())
            if _shows_beside(ax, width, mean.get_linewidth()):
                band.set_label(f"{stats.level:.0%} bootstrap interval")
            else:
                hidden.append(f"the {stats.level:.0%} bootstrap interval (width at most {width:.3f})")
        if hidden:
            ax.text(0.02, 0.97, "Too narrow to show beside the layer mean's line:\n" + ",\n".join(hidden),
                    transform=ax.transAxes, va="top", ha="left")
        ax.legend(loc="lower right")
    return fig


# one color, line and marker per policy in every figure
STYLE = {"slot": dict(color="C0", linestyle="-", marker="o"), "dedup": dict(color="C1", linestyle="--", marker="s"),
         "auto": dict(color="C2", linestyle=":", marker="^")}

# Draft lengths of different policies often coincide; these vertical offsets (in draft lengths) keep each visible.
K_OFFSET = {"slot": -0.06, "dedup": 0.0, "auto": 0.06}

MS = 1e3  # times are stored in seconds and shown in milliseconds


# plan.json version -> (its staircase key, its step-time key)
PLAN_VERSIONS = {v: (f"staircase{s}", f"step_times{s}") for v, s in VERSION_SUFFIX.items()}


def staircase_figure(plan: Any, versions: Sequence[str], policies: Sequence[str]) -> Figure:
    """k_hat*(a) of each policy as a step function with its step points (markers: a_j, from which k_hat* >= j),
    one panel per plan version, side by side within the page's width."""
    width = min(PANEL_IN[0] * len(versions), FULL_WIDTH_IN)
    with _style(width):
        fig = Figure(figsize=(width, PANEL_IN[1]))
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
            ax.set(xlabel="acceptance a", ylabel="best draft length k_hat*(a)", xlim=(0, 1),
                   yticks=range(plan["kmax"] + 1), title=version)
            ax.legend(loc="upper left")
        fig.tight_layout()
    return fig


def saving_figure(plan: Any, runs: Any | None) -> Figure:
    """Figure 4: the plan's predicted saving with its band (18), its measured-time and calibrated versions, and,
    given runs, the engine's measured saving with its 95% interval."""
    saving = plan["saving"]
    ns = sorted(map(int, saving))
    series = lambda key: np.array([saving[str(n)][key] for n in ns]) * MS  # noqa: E731
    size = (6.5, 4.0)
    with _style(size[0]):
        fig = Figure(figsize=size)
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
        ax.legend(loc="best")
        fig.tight_layout()
    return fig


def acceptance_figure(per_policy: dict[str, list[dict]], predicted: dict[tuple[str, float], float],
                      deltas: dict[str, float | None], kmax: int, loss_limit: float) -> Figure:
    """Figure 5: per policy and acceptance, k_hat* vs the measured best k, the throughput lost at k_hat* vs the
    bound (20), and the speedup error vs the band (21) (moespec.predict.acceptance.acceptance_rows gives the rows);
    three panels across the page's width, one legend below them."""
    with _style(FULL_WIDTH_IN):
        fig = Figure(figsize=(FULL_WIDTH_IN, 4.2), layout="constrained")
        ax_k, ax_loss, ax_err = fig.subplots(1, 3)
        handles = []
        for p, entries in per_policy.items():
            style = STYLE[p]
            a = [r["a"] for r in entries]
            error = [r["speedup"] / predicted[p, r["a"]] - 1 for r in entries]
            ax_k.plot(a, np.array([r["k_hat"] for r in entries]) + K_OFFSET[p], linestyle=style["linestyle"],
                      marker=style["marker"], color=style["color"], markerfacecolor="white")
            ax_k.plot(a, np.array([r["k_star"] for r in entries]) + K_OFFSET[p], linestyle="none",
                      marker=style["marker"], color=style["color"], markersize=4)
            handles += ax_loss.plot(a, [100 * r["loss"] for r in entries], marker=style["marker"],
                                    color=style["color"], linestyle=style["linestyle"], label=p)
            ax_err.plot(a, [100 * e for e in error], marker=style["marker"], color=style["color"],
                        linestyle=style["linestyle"])
            delta = deltas.get(p)
            if delta is not None:
                floor = float(theory.throughput_floor(delta))
                ax_loss.axhline(100 * float(theory.throughput_loss_bound(delta)), color=style["color"],
                                linewidth=0.8, alpha=0.6)
                ax_err.axhspan(100 * (floor - 1), 100 * (1 / floor - 1), color=style["color"], alpha=0.08)
        handles.append(ax_loss.axhline(100 * loss_limit, color="black", linestyle=":", linewidth=1,
                                       label=f"rule 3: {loss_limit:.0%}"))
        ax_err.axhline(0, color="grey", linewidth=0.8)
        ax_k.set(xlabel="acceptance a", ylabel="draft length k", title="k_hat* (open) vs best k (filled)",
                 yticks=range(kmax + 1))
        ax_loss.set(xlabel="acceptance a", ylabel="throughput lost at k_hat* (%)", ylim=(0, None),
                    title="loss vs bound (20) (thin lines)")
        ax_err.set(xlabel="acceptance a", ylabel="measured / predicted speedup - 1 (%)",
                   title="speedup error vs band (21) (shaded)")
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles))
    return fig
