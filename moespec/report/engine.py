"""The report's engine facts (moespec.report.html): per runs file, the verify times per n and policy with their
intervals, the saving, AUTO's ratio, the engine's overhead, h(k) and the greedy agreement of its cells."""

from __future__ import annotations

from typing import Any, Sequence

from moespec.predict.verdict import measured_crossover
from moespec.report.folder import RUNS, RUNS_VERIFY, Folder
from moespec.report.markup import escape as _e
from moespec.report.markup import facts as _facts
from moespec.report.markup import missing as _missing
from moespec.report.markup import ms as _ms
from moespec.report.markup import policies as _policies
from moespec.report.markup import table as _table


# ---- engine facts --------------------------------------------------------------------------------------------
def _with_interval(value: float, interval: Sequence[float] | None) -> str:
    return _ms(value) + ("" if not interval else f" [{_ms(interval[0])}, {_ms(interval[1])}]")


def _engine(name: str, runs: dict[str, Any]) -> str:
    """One runs file: verify times per n and policy, the saving, AUTO ratio, overhead, h(k), greedy agreement."""
    verify, ci = runs.get("verify_time_s") or {}, runs.get("verify_time_ci_s") or {}
    policies = _policies(verify)
    ratio = runs.get("auto_ratio")
    rows = []
    for n in sorted({n for p in policies for n in verify[p]}, key=int):
        saving = runs["saving_s"].get(n) if isinstance(runs.get("saving_s"), dict) else None
        rows.append([n, *(_with_interval(verify[p][n], ci.get(p, {}).get(n)) if n in verify[p] else "-"
                          for p in policies),
                     "-" if saving is None else f"{_ms(saving['median'], '+.3f')} [{_ms(saving['lo'], '+.3f')}, "
                                                f"{_ms(saving['hi'], '+.3f')}]",
                     *([] if ratio is None else [f"{ratio[n]:.3f}" if n in ratio else "-"])])
    table = _table(("n", *(f"tau {p} ms [95%]" for p in policies), "S(n) ms [95%]",
                    *([] if ratio is None else ["AUTO ratio"])), rows,
                   "medians with 95% bootstrap intervals; AUTO ratio: tau_auto / min(tau_slot, tau_dedup)")
    cells = runs.get("throughput", []) + (runs.get("throughput_draft_model") or [])
    mismatches = [[c["policy"], str(c["k"]), "-" if c.get("a") is None else f"{c['a']:g}", str(m["prompt"]),
                   str(m["position"]), f"{m['plain_top2_gap']:.4g}"]
                  for c in cells for m in c.get("mismatches", [])]
    draft = runs.get("draft_time_s") or {}
    share = runs.get("overhead_share")
    facts = [("engine", f"{runs.get('source', '-')}; {runs.get('moe_layers')} MoE layers, depth {runs['depth']}"),
             ("replayed routing", runs.get("replay") or "none (the model's own routers)"),
             ("verify pass", f"dense weights {runs.get('dense', '-')}; "
                             f"{runs.get('verify_pass', 'not recorded (older runs.json)')}"),
             ("measured crossover", measured_crossover(runs)),
             ("engine overhead", "no throughput measured" if share is None else
              f"{share:.1%} of step time (median over cells)"),
             ("draft + host time h(k)", ", ".join(f"{k}: {_ms(v)} ms" for k, v in draft.items()) or "not measured"),
             ("greedy agreement", ("no throughput measured" if not cells else
                                   f"every run's tokens equal plain decoding's ({len(cells)} cells)"
                                   if runs.get("greedy_exact", runs.get("greedy_match")) else
                                   f"equal up to exact ties: {len(mismatches)} first difference(s) at a top-2 logit "
                                   f"gap of 0, below" if runs.get("greedy_match") else
                                   f"NO: {len(mismatches)} mismatch(es), below"))]
    out = f"<h3>{_e(name)}</h3>" + table + _facts(facts)
    if mismatches:
        out += _table(("policy", "k", "a", "prompt", "position", "plain top-2 logit gap"), mismatches,
                      "where the tokens first differ from plain decoding's; a small gap is a near tie that rounding "
                      "in a pass of another size can flip", text_columns=1)
    return out


def engine_section(f: Folder) -> str:
    """The engine facts of runs.json and of runs-verify.json, each present."""
    present = [name for name in (RUNS, RUNS_VERIFY) if name in f.docs]
    if not present:
        return _missing(f.problems[RUNS] + "; " + f.problems[RUNS_VERIFY])
    return "".join(_engine(name, f.docs[name]) for name in present) + \
        ("" if RUNS in f.docs else _missing(f.problems[RUNS]))
