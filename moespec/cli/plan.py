"""`moespec plan`: whole-model verify time (22), the saving with its band (18), the crossover, the AUTO kernel,
k_hat*(a) and the speedup band (21), from a bench and a trace (moespec.predict.plan)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from rich.table import Table

from moespec.cli.args import bounded
from moespec.console import console as console_
from moespec.defaults import DEPTH, DEPTH_LIMIT, DEVICE_KINDS, KERNELS, KMAX, KMAX_LIMIT, POLICIES
from moespec.formats.planfile import TABLES, VERSION_SUFFIX
from moespec.predict.plan import PlanConfig, make_plan


# ---- command -------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bench", required=True, help="bench.json from `moespec bench`")
    parser.add_argument("--trace", required=True, help="routing trace (.npz) of the same model")
    parser.add_argument("--tau1", type=float,
                        help="measured one-token pass time tau(1), seconds (default: --runs' dedup-off n = 1)")
    parser.add_argument("--runs", metavar="RUNS",
                        help="runs.json from `moespec run`: its dedup-off verify times give the calibrated version")
    parser.add_argument("--moe-layers", type=int, metavar="L",
                        help="MoE layers of the model the plan is for, the first L of the bench's model "
                             "(default: --runs' moe_layers, else all)")
    parser.add_argument("--device", choices=DEVICE_KINDS,
                        help="the device the plan is for; must be the one the bench timed (default: the bench's)")
    parser.add_argument("--out", help="write plan.json here")
    parser.add_argument("--kmax", type=bounded(1, KMAX_LIMIT), default=KMAX,
                        help=f"largest draft length k (default {KMAX}, at most {KMAX_LIMIT})")
    parser.add_argument("--draft-time", default="0", metavar="H",
                        help="draft + host time per step h(k), seconds: one number, h(0..kmax), or a runs.json "
                             "(its measured draft_time_s) (default 0: oracle)")
    parser.add_argument("--depth", type=bounded(0, DEPTH_LIMIT),
                        help=f"context depth for kv(k) in (16) (default: --runs' depth, else {DEPTH}; at most "
                             f"{DEPTH_LIMIT:,})")
    parser.add_argument("--for", dest="engine", choices=["llama.cpp"],
                        help="also print the answer as the engine's flags: llama.cpp's draft settings per "
                             "acceptance, from its dedup staircase (plan.json always holds them)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def print_llama_cpp(plan: Mapping[str, Any]) -> None:
    """The plan's llama_cpp block: flags per acceptance interval, and per acceptance of the grid with the band."""
    con = console_()
    block = plan["llama_cpp"]
    t = Table(title=f"llama.cpp: draft settings from the {block['version']} {block['policy']} staircase "
                    "(k_hat* = k for a in (lo, hi])")
    for name in ("a from", "a to", "k", "flags"):
        t.add_column(name, justify="right" if name != "flags" else "left")
    for row in block["intervals"]:
        t.add_row(f"{row['lo']:.4f}", f"{row['hi']:.4f}", str(row["k"]), row["flags"])
    con.print(t)
    g = Table(title="llama.cpp per acceptance: k_hat*, speedup [band (21)]")
    for name in ("a", "k_hat*", "speedup", "band", "flags"):
        g.add_column(name, justify="right" if name != "flags" else "left")
    for row in block["table"]:
        band = "(no band)" if row["speedup_lo"] is None else f"[{row['speedup_lo']:.3f}, {row['speedup_hi']:.3f}]"
        g.add_row(f"{row['a']:g}", str(row["k_hat"]), f"{row['speedup']:.3f}", band, row["flags"])
    con.print(g)


def run(args: argparse.Namespace) -> int:
    plan = make_plan(PlanConfig(bench=args.bench, trace=args.trace, tau1=args.tau1, runs=args.runs, kmax=args.kmax,
                                draft_time=args.draft_time, depth=args.depth, moe_layers=args.moe_layers,
                                device=args.device, out=args.out))
    if args.json:
        print(json.dumps(plan.doc))
    else:
        print_summary(plan, args.out)
        if args.engine == "llama.cpp":
            print_llama_cpp(plan)
    return 0


def _speedup_table(plan: Mapping[str, Any], table: str, title: str, bytes_column: bool) -> Any:
    """k_hat* and speedup [band (21)] per acceptance (rows) and policy (columns) of one version's table."""
    t = Table(title=title, caption="bytes: k_hat* of the one-bandwidth byte model (16)" if bytes_column else None)
    for name in ("a", *POLICIES, *(["bytes"] if bytes_column else [])):
        t.add_column(name, justify="right")
    rows: dict[float, dict[str, str]] = {}
    for row in plan[table]:
        band = "(no band)" if row["speedup_lo"] is None else f"({row['speedup_lo']:.3f}, {row['speedup_hi']:.3f})"
        rows.setdefault(row["a"], {})[row["policy"]] = f"{row['k_hat']}: {row['speedup']:.3f} {band}"
    for a, cells in rows.items():
        extra = [str(plan["reuse_threshold"]["k_hat_bytes"][str(a)])] if bytes_column else []
        t.add_row(f"{a:g}", *(cells[p] for p in POLICIES), *extra)
    return t


def print_summary(plan: Mapping[str, Any], out: str | None) -> None:
    """Verify times and saving per n, then k_hat* and speedup per acceptance and policy, for each version."""
    con = console_()
    cov = plan["coverage"]
    calibrated = plan["runs"] is not None
    con.print(f"[bold]{plan['model']}[/] {plan['dtype']} on {plan['device']}: tau(1) = {plan['tau1_s'] * 1e3:.3f} ms,"
              f" eps = {plan['eps']:.4f} (delta = {plan['delta']:.4f}); MoE layers {cov['timed_layers']} timed, "
              f"{cov['num_moe_layers']} of {cov['model_moe_layers']} covered: {cov['rule']} (x{cov['scale']:.3g})")
    if calibrated:
        con.print(f"calibrated version from {plan['runs']['path']} (depth {plan['runs']['depth']}): the dedup-off "
                  f"verify times give the growth outside the expert operation")
    t = Table(title="Verify time (22) and saving S = tau_slot - tau_dedup with band (18), ms",
              caption="decided: margin (19) > 0. bytes: the one-bandwidth model (dedup wherever u < 1); "
                      "2-bw: dedup where u < r (7)" + ("; cal.: calibrated version" if calibrated else ""))
    for name in ("n", "tau slot", "tau dedup", *(["cal. slot", "cal. dedup"] if calibrated else []), "S_hat",
                 "± (18)", "S meas.", "u(n)", "r(n)", "(19)", "decided", "bytes", "2-bw", "auto"):
        t.add_column(name, justify="right")
    ms = lambda x: f"{x * 1e3:.3f}"  # noqa: E731
    for n in plan["kernel_by_n"]:
        s = plan["saving"].get(n)
        cells = ["-"] * 9 if s is None else [
            f"{s['predicted_s'] * 1e3:+.3f}", f"{s['band_s'] * 1e3:.3f}", f"{s['measured_s'] * 1e3:+.3f}",
            f"{s['u']:.3f}", "-" if s["r"] is None else f"{s['r']:.3f}",
            "-" if s["margin"] is None else f"{s['margin']:+.3f}", "yes" if s["decided"] else "no",
            s["byte_model"], s["two_bandwidth"] or "-"]
        cal = [ms(plan["tau_calibrated"][k][n]) for k in KERNELS] if calibrated else []
        t.add_row(n, *(ms(plan["tau_hat"][k][n]) for k in KERNELS), *cal, *cells, plan["kernel_by_n"][n])
    con.print(t)
    split = [n for n, s in plan["saving"].items() if s["two_bandwidth"] not in (None, s["byte_model"])]
    con.print(f"one-bandwidth byte model vs two-bandwidth prediction: "
              f"{'disagree at n = ' + ', '.join(split) if split else 'agree at every n'}")
    con.print(f"predicted crossover: n = {plan['crossover']} (measured-time version: {plan['crossover_measured']});"
              f" AUTO runs the kernel of smaller predicted time at each n")
    for table, (version, _) in TABLES.items():
        if table in plan:
            deltas = ", ".join(f"{p} {'none' if d is None else f'{d:.4f}'}"
                               for p, d in plan["delta_steps"][version].items())
            con.print(_speedup_table(plan, table, f"Best draft length k_hat*(a) and {version} speedup (band (21); "
                                                  f"delta {deltas})", bytes_column=version == "prediction"))
    reuse = plan["reuse_threshold"]
    b = Table(title=f"One-bandwidth reuse threshold (16) at depth {reuse['depth']}: the trace's rho_bar_k vs "
                    f"rho*_k(a)", caption="*: rho_bar_k > rho*_k(a), the byte model says drafting k beats plain")
    for name in ("k", "rho_bar_k", *(f"a={a}" for a in reuse["rho_star"])):
        b.add_column(name, justify="right")
    for k, rb in reuse["rho_bar"].items():
        b.add_row(k, f"{rb:.3f}", *(f"{per_k[k]:.3f}{'*' if rb > per_k[k] else ''}"
                                    for per_k in reuse["rho_star"].values()))
    con.print(b)
    for version, suffix in VERSION_SUFFIX.items():
        for p in POLICIES if f"staircase{suffix}" in plan else ():
            pts = ", ".join(f"{x:.4f}" for x in plan[f"staircase{suffix}"][p]["step_points"])
            con.print(f"step points (B.31) {p} {version}: {pts}")
    if out:
        con.print(f"plan -> {out}")
