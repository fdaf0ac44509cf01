"""`moespec plan`: whole-model verify time (22), the saving with its band (18), the crossover, the AUTO kernel,
k_hat*(a) and the speedup band (21), from a bench and a trace (moespec.predict.plan)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from moespec import MoespecError
from moespec.cli.args import MAGNITUDES, bounded, check_number, parse_ints
from moespec.cli.staircase import parse_numbers
from moespec.console import NARROW, print_plain
from moespec.console import console as console_
from moespec.defaults import (BATCH_LIMIT, DEPTH, DEPTH_LIMIT, DEVICE_KINDS, DRAFT_LIMIT, KERNELS, KMAX, KMAX_LIMIT,
                              LAYERS_LIMIT, POLICIES)
from moespec.formats.files import check_output
from moespec.formats.planfile import TABLES, VERSION_SUFFIX
from moespec.formats.runsfile import RATES
from moespec.predict.acceptance import DEFAULT_RATE
from moespec.predict.engines import FORMS, engine_form, write_engine_config
from moespec.predict.plan import PlanConfig, make_plan
from moespec.report.tables import rich_table


# the path flags kept apart before any work (moespec.cli.args.check_paths)
OUTPUTS = ("--out", "--engine-out")
BATCH_ENGINES = ("vllm", "tensorrt-llm", "sglang")  # engines whose form is per batch size: they need --batch
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
    parser.add_argument("--batch", metavar="B,..",
                        help=f"also plan each batch size B (1..{BATCH_LIMIT}): the step times V_B(k) of B sequences, "
                             f"k_hat*(a, B), the crossover per B and B_stop(a), from --runs' verify times at each B "
                             f"(`moespec run --batch`); plan.json `batch`")
    parser.add_argument("--rate", choices=list(RATES), default=DEFAULT_RATE,
                        help="the throughput `moespec score` reads for this plan: counted (default, the paper's: "
                             "every emitted token over the steps' time; needs cells of many steps per acceptance) "
                             "or computed (G_a(k) over the median step time: ranks k on short cells)")
    parser.add_argument("--for", dest="engine", choices=list(FORMS),
                        help="also print the answer in the engine's form: llama.cpp's draft settings per acceptance "
                             "from its dedup staircase (plan.json always holds them), with --batch also its "
                             "--parallel slots per batch size; vllm (num_speculative_tokens_per_batch_size), "
                             "tensorrt-llm (draft_len_schedule) and sglang (--speculative-adaptive-config) need "
                             "--batch: k*(a, B) per batch size B of its grid (moespec.predict.engines)")
    acceptance = parser.add_mutually_exclusive_group()
    acceptance.add_argument("--acceptance", metavar="A",
                            help="with --for and --batch: the engine's form at this acceptance, 0 <= A <= 1 "
                                 "(default: one row per acceptance of the batch grid; --engine-out needs one)")
    acceptance.add_argument("--acceptance-profile", metavar="A1,A2,...",
                            help="instead of --acceptance: a measured per-position acceptance profile a_1..a_m, "
                                 "m >= --kmax, each in [0, 1]")
    parser.add_argument("--engine-out", metavar="FILE",
                        help="with --for, --batch and --acceptance or --acceptance-profile: write the engine's "
                             "config JSON here (vllm: keys for --speculative-config; tensorrt-llm: an "
                             "--extra_llm_api_options file; sglang: the --speculative-adaptive-config file; "
                             "llama.cpp: the --parallel and draft arguments per batch size)")
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


def check_engine_flags(args: argparse.Namespace) -> Fraction | list[Fraction] | None:
    """Before any work: --for, --acceptance, --acceptance-profile and --engine-out fit together (an engine form per
    batch size needs the plan's batch block, --batch; --engine-out writes one config, at one acceptance), and the
    acceptance or profile lies in [0, 1]. Returns it (None: the form at every acceptance of the batch grid)."""
    given = [flag for flag, value in (("--acceptance", args.acceptance), ("--acceptance-profile",
                                      args.acceptance_profile), ("--engine-out", args.engine_out)) if value]
    if given and args.engine is None:
        raise MoespecError(f"{given[0]} needs --for ENGINE ({', '.join(FORMS)})")
    if args.batch is None and (args.engine in BATCH_ENGINES or (args.engine and given)):
        raise MoespecError(f"--for {args.engine}{f' with {given[0]}' if given else ''} answers per batch size: give "
                           f"--batch, so the plan holds the step times of B sequences per batch size B")
    if args.engine_out:
        if not (args.acceptance or args.acceptance_profile):
            raise MoespecError("--engine-out writes one config: give --acceptance A or --acceptance-profile A1,A2,...")
        check_output(args.engine_out, "--engine-out")
    if not (args.acceptance or args.acceptance_profile):
        return None
    flag, text = ("--acceptance", args.acceptance) if args.acceptance else \
        ("--acceptance-profile", args.acceptance_profile)
    values = parse_numbers(text, flag, 1 if flag == "--acceptance" else DRAFT_LIMIT)
    if not all(0 <= a <= 1 for a in values):
        raise MoespecError(f"{flag} {text}: every acceptance must lie in [0, 1]")
    if flag == "--acceptance":
        return values[0]
    if len(values) < args.kmax:
        raise MoespecError(f"{flag} {text}: {len(values)} positions, drafts up to --kmax {args.kmax} need {args.kmax}")
    return values


def print_engine_forms(forms: list[Mapping[str, Any]]) -> None:
    """Engine forms (moespec.predict.engines) of one engine and batch block, one row each: the acceptance (or
    profile), k*(a, B) per batch size B and the config the engine takes; then how to pass it, the notes and the
    source followed."""
    first = forms[0]
    acceptance = lambda a: ",".join(f"{x:g}" for x in a) if isinstance(a, list) else f"{a:g}"  # noqa: E731
    notes = dict.fromkeys(note for form in forms for note in form["notes"])
    con = console_(NARROW)
    con.print(rich_table(f"{first['engine']}: k*(a, B) per acceptance a and batch size B, and the engine's config "
                         f"({first['policy']} step times)", ("a", *(f"B={b}" for b in first["k_by_batch"]), "config"),
                         [[acceptance(form["acceptance"]), *map(str, form["k_by_batch"].values()),
                           json.dumps(form["config"], separators=(",", ":"))] for form in forms],
                         first["step_times_from"]))
    print_plain(con, [f"usage: {first['usage']}", *(f"note: {note}" for note in notes), f"source: {first['source']}"])


def answer_engine(plan: Mapping[str, Any], args: argparse.Namespace, acceptance: Fraction | list[Fraction] | None
                  ) -> None:
    """The plan's batch block in the engine's form (--for), at the given acceptance or else at every acceptance of
    the block's grid: printed unless --json, its config written to --engine-out. A plan without the block has
    nothing here (llama.cpp's staircase form is print_llama_cpp's)."""
    if args.engine is None or plan.get("batch") is None or (args.json and not args.engine_out):
        return
    batch = plan["batch"]
    forms = [engine_form(args.engine, batch, a) for a in (batch["acceptances"] if acceptance is None
                                                          else [acceptance])]
    if not args.json:
        print_engine_forms(forms)
    if args.engine_out:  # check_engine_flags made sure of one acceptance
        write_engine_config(args.engine_out, forms[0])


def batch_sizes(text: str | None) -> tuple[int, ...]:
    """--batch as batch sizes (none when not given)."""
    return () if text is None else tuple(parse_ints(text, "--batch", 1, BATCH_LIMIT, "batch sizes"))


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    acceptance = check_engine_flags(args)
    plan = make_plan(PlanConfig(bench=args.bench, trace=args.trace, tau1=args.tau1, runs=args.runs, kmax=args.kmax,
                                draft_time=args.draft_time, depth=args.depth, moe_layers=args.moe_layers,
                                device=args.device, out=args.out, batch=batch_sizes(args.batch),
                                rate=args.rate))
    if args.json:
        print(json.dumps(plan.doc))
    else:
        print_summary(plan, args.out)
        if args.engine == "llama.cpp":
            print_llama_cpp(plan)
    answer_engine(plan, args, acceptance)
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
