"""`moespec score`: a plan against an engine's runs by the six rules of Table 8 (moespec.predict.score), and where
both were made at several batch sizes, its batch map by the six rules at each batch size and B_stop
(moespec.predict.batch_score)."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from moespec.console import NARROW, print_plain
from moespec.console import console as console_
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import RATES
from moespec.predict.batch_score import VERSIONS as BATCH_VERSIONS
from moespec.predict.batch_score import WORDING, score_batches, shown
from moespec.predict.score import DEFAULT_VERSION, VERSIONS, Score, score_files


# ---- command -------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="plan.json from `moespec plan`")
    parser.add_argument("--runs", required=True, help="runs.json from `moespec run` (same model, device, dtype)")
    parser.add_argument("--version", choices=tuple(VERSIONS), default=DEFAULT_VERSION,
                        help="the plan version to score: its prediction (default), its measured-time version "
                             "(the bench's measured op times in place of the fits, the paper's primary one) or, for "
                             "a plan made with --runs, its calibrated version, or its whole-pass version (runs that "
                             "timed the pass with the expert operation taken out)")
    parser.add_argument("--rate", choices=list(RATES),
                        help="score rules 2, 3 and 6 on this throughput instead of the one the plan names "
                             "(plan --rate); the score is then not pre-registered")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    result = score_files(args.plan, args.runs, args.version, rate=args.rate)
    plan = load_plan(args.plan)
    batch = []
    if "batch" in plan and "batch" in result.runs:
        batch = [score_batches(plan, result.runs, version, args.plan, args.runs) for version in BATCH_VERSIONS
                 if version == "measured" or plan["batch"].get("predicted") is not None]
    if args.json:
        print(json.dumps(result.to_json() | ({"batch": batch} if batch else {})))
    else:
        print_score(result)
        for version in batch:
            print_batch_score(version)
    return 0


def print_batch_score(batch: dict) -> None:
    """The batch rules: per acceptance (rows) and batch size (columns) k_hat*(a, B) against the measured best k,
    B_stop(a) planned and measured; then per B (rows) the six rules of Table 8 at that B (columns, with their wording
    below), B_stop and whether all hold."""
    con = console_(NARROW)
    verdict = {True: "[green]holds[/]", False: "[red]fails[/]", None: ""}
    t = Table(title=f"Batch rules, {batch['version']} version ({batch['policy']}, {batch['rate']} rate): "
                    f"k_hat*(a, B) / measured best k; B_stop planned / measured")
    for name in ("a", *(f"B={b}" for b in batch["batches"]), "B_stop"):
        t.add_column(name, overflow="fold")
    show = lambda x: "-" if x is None else str(x)  # noqa: E731
    for i, a in enumerate(batch["acceptances"]):
        t.add_row(f"{a:g}", *(f"{e['k_hat'][i]}/{show(e['measured_best'][i])}" for e in batch["per_batch"].values()),
                  f"{show(batch['b_stop'][i])}/{show(batch['measured_b_stop'][i])}")
    con.print(t)
    t = Table(title=f"Table 8's rules at each batch size, {batch['version']} version")
    t.add_column("B")
    for name in WORDING:
        t.add_column(name, overflow="fold")
    for b, e in batch["per_batch"].items():
        t.add_row(b, *(f"{text} {verdict[holds]}".strip() for _, text, holds in shown(e)))
    con.print(t)
    print_plain(con, [f"  {name}: {wording}" for name, wording in WORDING.items()])
    con.print(f"B_stop within one grid step at every acceptance: {verdict[batch['b_stop_holds']]}; batch rules hold: "
              f"{'yes' if batch['all_hold'] else 'no'}")


def print_score(result: Score) -> None:
    """The verdict first (moespec.predict.verdict), then the rules as a table (rule, predicted, measured, verdict)
    within NARROW columns where the output is not a terminal, then all-hold and pre-registration lines."""
    runs = result.runs
    con = console_(NARROW)
    if result.verdict is not None:
        print_plain(con, [*result.verdict.lines(), ""])
    t = Table(title=f"Scoring rules (Table 8), {result.version} version: {runs['model']} {runs['dtype']} on "
                    f"{runs['device_kind']}, depth {runs['depth']}")
    for name in ("rule", "predicted", "measured", "verdict"):
        t.add_column(name, overflow="fold")
    for rule in result.rules:
        t.add_row(rule.rule, *rule.shown, {True: "[green]holds[/]", False: "[red]fails[/]", None: "n/a"}[rule.holds])
    for rule in result.variants:  # reported beside the six, not counted
        t.add_row(f"variant: {rule.rule}", *rule.shown,
                  {True: "[green]holds[/]", False: "[red]fails[/]", None: "n/a"}[rule.holds])
    con.print(t)
    which = "all six" if result.applicable == 6 else f"all {result.applicable} applicable"
    con.print(f"{which} hold: {'yes' if result.all_hold else 'no'}")
    con.print(f"throughput scored (rules 2, 3, 6): the {result.rate} rate ({RATES[result.rate]})")
    con.print(result.pre_registration)
    if result.machine_note:
        con.print(f"[yellow]{result.machine_note}[/]")
    con.print(f"plan sha256: {result.plan_sha256}")
