"""`moespec plan`: whole-model verify time (22), the saving with its band (18), the crossover, the AUTO kernel,
k_hat*(a) and the speedup band (21), from a bench and a trace (moespec.predict.plan)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from moespec.cli.args import MAGNITUDES, bounded, check_number
from moespec.console import NARROW, print_plain
from moespec.console import console as console_
from moespec.defaults import DEPTH, DEPTH_LIMIT, DEVICE_KINDS, KERNELS, KMAX, KMAX_LIMIT, LAYERS_LIMIT, POLICIES
from moespec.formats.planfile import TABLES, VERSION_SUFFIX
from moespec.predict.plan import PlanConfig, make_plan
from moespec.report.tables import rich_table


# the path flags kept apart before any work (moespec.cli.args.check_paths)
OUTPUTS = ("--out",)
INPUTS = {"--bench": (), "--trace": (), "--runs": (), "--draft-time": ()}


# ---- command -------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bench", required=True, help="bench.json from `moespec bench`")
    parser.add_argument("--trace", required=True, help="routing trace (.npz) of the same model")
    parser.add_argument("--tau1", type=float,
                        help=f"measured one-token pass time tau(1), seconds, of magnitude {MAGNITUDES} (default: "
                             f"--runs' dedup-off n = 1)")
    parser.add_argument("--runs", metavar="RUNS",
                        help="runs.json from `moespec run`: its dedup-off verify times give the calibrated version")
    parser.add_argument("--moe-layers", type=bounded(1, LAYERS_LIMIT), metavar="L",
                        help="MoE layers of the model the plan is for, the first L of the bench's model "
                             "(default: --runs' moe_layers, else all)")
    parser.add_argument("--device", choices=DEVICE_KINDS,
                        help="the device the plan is for; must be the one the bench timed (default: the bench's)")
    parser.add_argument("--out", help="write plan.json here")
    parser.add_argument("--kmax", type=bounded(1, KMAX_LIMIT), default=KMAX,
                        help=f"largest draft length k (default {KMAX}, at most {KMAX_LIMIT})")
    parser.add_argument("--draft-time", default="0", metavar="H",
                        help=f"draft + host time per step h(k), seconds, each 0 or of magnitude {MAGNITUDES}: one "
                             f"number, h(0..kmax), or a runs.json (its measured draft_time_s) (default 0: oracle)")
    parser.add_argument("--depth", type=bounded(0, DEPTH_LIMIT),
                        help=f"context depth for kv(k) in (16) (default: --runs' depth, else {DEPTH}; at most "
                             f"{DEPTH_LIMIT:,})")
    parser.add_argument("--for", dest="engine", choices=["llama.cpp"],
                        help="also print the answer as the engine's flags: llama.cpp's draft settings per "
                             "acceptance, from its dedup staircase (plan.json always holds them)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def print_llama_cpp(plan: Mapping[str, Any]) -> None:
    """The plan's llama_cpp block: flags per acceptance interval, and per acceptance of the grid with the band."""
    con = console_(NARROW)
    block = plan["llama_cpp"]
    con.print(rich_table(f"llama.cpp: draft settings from the {block['version']} {block['policy']} staircase "
                         "(k_hat* = k for a in (lo, hi])", ("a from", "a to", "k", "flags"),
                         [[f"{row['lo']:.4f}", f"{row['hi']:.4f}", str(row["k"]), row["flags"]]
                          for row in block["intervals"]]))
    con.print(rich_table("llama.cpp per acceptance: k_hat*, speedup [band (21)]",
                         ("a", "k_hat*", "speedup", "band", "flags"),
                         [[f"{row['a']:g}", str(row["k_hat"]), f"{row['speedup']:.3f}", _band(row), row["flags"]]
                          for row in block["table"]]))


def _band(row: Mapping[str, Any]) -> str:
    """A table row's band (21), or that it has none."""
    return "(no band)" if row["speedup_lo"] is None else f"[{row['speedup_lo']:.3f}, {row['speedup_hi']:.3f}]"


def check_flags(args: argparse.Namespace) -> None:
    """--tau1 and the numbers of --draft-time within their stated bounds (a runs.json named by --draft-time is read
    by moespec.predict.plan.draft_times)."""
    if args.tau1 is not None:
        check_number("--tau1", args.tau1, "time", positive=True)
    try:
        times = [float(x) for x in args.draft_time.split(",")]
    except ValueError:
        times = []
    for h in times:
        check_number("--draft-time", h, "time", positive=False)


def run(args: argparse.Namespace) -> int:
    check_flags(args)
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
    rows: dict[float, dict[str, str]] = {}
    for row in plan[table]:
        rows.setdefault(row["a"], {})[row["policy"]] = f"{row['k_hat']}: {row['speedup']:.3f} {_band(row)}"
    return rich_table(title, ("a", *POLICIES, *(["bytes"] if bytes_column else [])),
                      [[f"{a:g}", *(cells[p] for p in POLICIES),
                        *([str(plan["reuse_threshold"]["k_hat_bytes"][str(a)])] if bytes_column else [])]
                       for a, cells in rows.items()],
                      "bytes: k_hat* of the one-bandwidth byte model (16)" if bytes_column else None)


def print_summary(plan: Mapping[str, Any], out: str | None) -> None:
    """The verdict first (moespec.predict.verdict), then its evidence: verify times and the saving per n, k_hat* and
    the speedup per acceptance and policy for each version, the byte model's threshold, the step points; every
    table within NARROW columns where the output is not a terminal."""
    con = console_(NARROW)
    if "verdict" in plan:  # absent in older plans
        print_plain(con, [*plan["verdict"]["lines"], ""])
    cov = plan["coverage"]
    calibrated = plan["runs"] is not None
    con.print(f"[bold]{plan['model']}[/] {plan['dtype']} on {plan['device']}: tau(1) = {plan['tau1_s'] * 1e3:.3f} ms,"
              f" eps = {plan['eps']:.4f} (delta = {plan['delta']:.4f}); MoE layers {cov['timed_layers']} timed, "
              f"{cov['num_moe_layers']} of {cov['model_moe_layers']} covered: {cov['rule']} (x{cov['scale']:.3g})")
    if calibrated:
        con.print(f"calibrated version from {plan['runs']['path']} (depth {plan['runs']['depth']}): the dedup-off "
                  f"verify times give the growth outside the expert operation")
    ms = lambda x: f"{x * 1e3:.3f}"  # noqa: E731
    versions = [("tau_hat", "")] + ([("tau_calibrated", "cal. ")] if calibrated else [])
    con.print(rich_table("Verify time (22), ms" + ("; cal.: the calibrated version" if calibrated else ""),
                         ("n", *(f"{label}{k}" for _, label in versions for k in KERNELS), "auto runs"),
                         [[n, *(ms(plan[key][k][n]) for key, _ in versions for k in KERNELS), kernel]
                          for n, kernel in plan["kernel_by_n"].items()]))
    rows = [[n, f"{s['predicted_s'] * 1e3:+.3f} ± {s['band_s'] * 1e3:.3f}", f"{s['measured_s'] * 1e3:+.3f}",
             f"{s['u']:.3f}", "-" if s["r"] is None else f"{s['r']:.3f}",
             "-" if s["margin"] is None else f"{s['margin']:+.3f}", "yes" if s["decided"] else "no",
             s["byte_model"], s["two_bandwidth"] or "-"] for n, s in plan["saving"].items()]
    con.print(rich_table("Saving S = tau_slot - tau_dedup, ms: predicted with band (18), measured-time version",
                         ("n", "S_hat ± (18)", "S meas.", "u(n)", "r(n)", "(19)", "decided", "bytes", "2-bw"), rows,
                         "decided: margin (19) > 0. bytes: the one-bandwidth model (dedup wherever u < 1); 2-bw: "
                         "dedup where u < r (7)"))
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
    rho_bar = reuse["rho_bar"]
    con.print(rich_table(f"One-bandwidth reuse threshold (16) at depth {reuse['depth']}: rho*_k(a) per acceptance a "
                         f"(rows) and draft length k (columns) against the trace's rho_bar_k (first row)",
                         ("a", *(f"k={k}" for k in rho_bar)),
                         [["rho_bar_k", *(f"{rb:.3f}" for rb in rho_bar.values())],
                          *([f"{float(a):g}", *(f"{per_k[k]:.3f}{'*' if rb > per_k[k] else ''}"
                                                for k, rb in rho_bar.items())]
                            for a, per_k in reuse["rho_star"].items())],
                         "*: rho_bar_k > rho*_k(a), the byte model says drafting k beats plain"))
    for version, suffix in VERSION_SUFFIX.items():
        for p in POLICIES if f"staircase{suffix}" in plan else ():
            pts = ", ".join(f"{x:.4f}" for x in plan[f"staircase{suffix}"][p]["step_points"])
            con.print(f"step points (B.31) {p} {version}: {pts}")
    if out:
        con.print(f"plan -> {out}")
