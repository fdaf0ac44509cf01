"""The plain answer: per verification-pass size n, the deduplicating ("dedup") or the per-slot expert kernel; per
acceptance a, how many tokens k the draft should propose; and, where the inputs disagree, which and what to change.
`plan`, `score` and the report print this block first; their tables are the evidence behind it.

Per n >= 2 (one token runs the per-slot kernel either way) the strongest evidence held decides:
  measured   the engine's saving S(n) = tau_slot(n) - tau_dedup(n) and its 95% bootstrap interval (runs.json
             saving_s): "dedup" where the interval lies above 0, "per-slot" where it lies below, else "no measurable
             difference", whatever the median says; a saving under SAVING_MARGIN of the per-slot pass is no
             difference either (moespec.predict.measured.measured_choice);
  predicted  where no run measured S(n): the plan's S_hat(n) and its band (18), |S_hat - S| <= band, read alike.
Per acceptance a of the plan's table: k_hat*(a) of the AUTO policy (the kernel of smaller predicted time per n), its
speedup (9) and the band (21) the true speedup lies in; for a measured acceptance profile a_1..a_kmax (a draft
model's, moespec.theory.profile), k_hat* for that profile. The version: the score's, else the plan's calibrated one
(its step times carry the engine's measured verify times), else its prediction.

Input checks, each one line naming its file and the setting to change: the bench's and the runs' own
(moespec.predict.checks: an expert operation too small to time, noisy timings, a verify time flat in n or far from
its bytes over the ceiling); a plan version without a speedup band; the plan's AUTO kernel where a measurement decides
the other; a score's failing rules and machine drift; and the lines a caller passes in (`warnings`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from moespec import theory
from moespec.formats.files import is_number
from moespec.formats.planfile import VERSION_SUFFIX
from moespec.predict.checks import RERUN_RUN, bench_checks, record_at, rerun_bench, runs_checks
from moespec.predict.draft_score import measured_profile
from moespec.predict.measured import SAVING_MARGIN, measured_choice

if TYPE_CHECKING:
    from moespec.predict.score import Score

WIDTH = 100  # columns of the printed block
DEDUP, SLOT = "dedup", "per-slot"
SAME = f"no measurable difference (interval includes 0, or under {SAVING_MARGIN:.0%} of the pass)"
KERNEL_WORDS = {"slot": SLOT, "dedup": DEDUP}
POLICY = "auto"  # the policy whose draft length the verdict gives: the kernel above at each n
DRAFT_VERSIONS = ("calibrated", "prediction")  # without a score, the first of these the plan holds


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.2g}" if 0 < abs(seconds) < 1e-4 else f"{seconds * 1e3:+.2f}"


@dataclass(frozen=True)
class KernelAnswer:
    """The kernel at pass size n: `choice` (DEDUP, SLOT or SAME) from the `evidence` ("measured": the runs' S(n) and
    its 95% interval; "predicted": the plan's S_hat(n) and its band (18)), the saving and [lo, hi] in seconds, and
    `auto`, the kernel ("slot" or "dedup") the plan's AUTO policy runs at n."""

    n: int
    choice: str
    evidence: str
    saving_s: float
    lo_s: float
    hi_s: float
    auto: str | None

    @property
    def auto_differs(self) -> bool:
        """A measurement decides the kernel AUTO does not run."""
        return self.evidence == "measured" and self.choice != SAME and KERNEL_WORDS.get(self.auto) != self.choice

    def text(self) -> str:
        what, span = ("measured S(n)", "95% interval") if self.evidence == "measured" else \
            ("predicted S_hat(n)", "band (18)")
        auto = f"; the plan's AUTO runs {self.auto}" if self.auto and (self.choice == SAME or self.auto_differs) \
            else ""
        return (f"n = {self.n}: {self.choice} ({what} = {_ms(self.saving_s)} ms, {span} [{_ms(self.lo_s)}, "
                f"{_ms(self.hi_s)}] ms{auto})")


@dataclass(frozen=True)
class DraftAnswer:
    """The draft length at acceptance `a` (or for a measured `profile` a_1..a_kmax): k, the speedup (9) over plain
    decoding it is expected to give, the band (21) the true speedup lies in (None: the plan has no band), and the
    best k a score measured there."""

    a: float | None
    profile: tuple[float, ...] | None
    k: int
    speedup: float
    lo: float | None
    hi: float | None
    measured_k: int | None = None

    def text(self) -> str:
        at = f"a = {self.a:g}" if self.profile is None else \
            f"measured profile a_1..a_{len(self.profile)} = {', '.join(f'{x:.2f}' for x in self.profile)}"
        band = "no band (21)" if self.lo is None or self.hi is None else f"band (21) [{self.lo:.3f}, {self.hi:.3f}]"
        measured = "" if self.measured_k is None else f"; measured best k* = {self.measured_k}"
        return f"{at}: draft k = {self.k}, expected speedup {self.speedup:.3f}x, {band}{measured}"


@dataclass(frozen=True)
class Verdict:
    """The answer block: what it is for (`title`), the kernel per n, the draft length per acceptance (AUTO policy,
    plan `version`), and the input checks (`warnings`). `lines()` is the plain text; `to_json()` what plan.json
    (key `verdict`) and score's --json store."""

    title: str
    kernels: tuple[KernelAnswer, ...]
    drafts: tuple[DraftAnswer, ...]
    version: str
    warnings: tuple[str, ...]

    def blocks(self) -> list[tuple[str, list[str]]]:
        """(heading, items) in print order; the report shows the same blocks as lists."""
        out = [("Kernel per pass size n (n = 1 runs the per-slot kernel either way):",
                [k.text() for k in self.kernels]),
               (f"Draft length per acceptance a (AUTO policy, {self.version} version; k = 0: do not draft):",
                [d.text() for d in self.drafts])]
        return out + ([("Check the inputs:", list(self.warnings))] if self.warnings else [])

    def lines(self, width: int = WIDTH) -> list[str]:
        """The block as plain text lines of at most `width` columns (items indented, continuations deeper)."""
        if isinstance(width, bool) or not isinstance(width, int) or width < 40:
            raise ValueError(f"width must be an integer of at least 40 columns, got {width!r}")
        out = textwrap.wrap(self.title, width)
        for heading, items in self.blocks():
            out += textwrap.wrap(heading, width)
            for item in items:
                out += textwrap.wrap(item, width, initial_indent="  ", subsequent_indent="      ",
                                     break_on_hyphens=False)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "policy": POLICY, "kernel_by_n": [asdict(k) for k in self.kernels],
                "draft": [asdict(d) | {"profile": None if d.profile is None else list(d.profile)} for d in self.drafts],
                "warnings": list(self.warnings), "lines": self.lines()}


# ---- the answers ---------------------------------------------------------------------------------------------
def kernel_answers(plan: Mapping[str, Any], runs: Mapping[str, Any] | None = None) -> list[KernelAnswer]:
    """Per n >= 2 of the plan's saving: the runs' measured S(n) and 95% interval where they hold one, else the plan's
    S_hat(n) and band (18) (module docstring)."""
    measured = record_at(runs, "saving_s")
    out = []
    for key in sorted((k for k in plan["saving"] if k.isdigit() and int(k) >= 2), key=int):
        m, entry = measured.get(key), plan["saving"][key]
        if isinstance(m, Mapping) and all(is_number(m.get(k)) for k in ("median", "lo", "hi")):
            s, lo, hi, evidence = m["median"], m["lo"], m["hi"], "measured"
        elif is_number(entry.get("predicted_s")):
            s, band = entry["predicted_s"], abs(entry["band_s"]) if is_number(entry.get("band_s")) else 0.0
            lo, hi, evidence = s - band, s + band, "predicted"
        else:
            continue
        tau = record_at(runs, "verify_time_s", "slot").get(key)
        if evidence == "measured" and is_number(tau):  # moespec.predict.measured's rule: a margin of the pass
            choice = {"dedup": DEDUP, "slot": SLOT, None: SAME}[measured_choice(s, lo, hi, tau)]
        else:
            choice = DEDUP if lo > 0 else SLOT if hi < 0 else SAME
        out.append(KernelAnswer(int(key), choice, evidence, float(s), float(lo), float(hi),
                                plan["kernel_by_n"].get(key)))
    return out


def draft_answers(plan: Mapping[str, Any], version: str, measured_k: Mapping[float, int] | None = None,
                  profile: Sequence[float] | None = None) -> list[DraftAnswer]:
    """The AUTO rows of the `version`'s table (k_hat*, speedup, band (21)), each with the best k measured at its
    acceptance where `measured_k` gives one; then, for a measured `profile`, k_hat* and its band on the same step
    times (moespec.theory.profile)."""
    if version not in VERSION_SUFFIX:
        raise ValueError(f"version must be one of {', '.join(VERSION_SUFFIX)}, got {version!r}")
    suffix = VERSION_SUFFIX[version]
    known = {round(a, 6): k for a, k in (measured_k or {}).items()}
    out = [DraftAnswer(row["a"], None, row["k_hat"], row["speedup"], row["speedup_lo"], row["speedup_hi"],
                       known.get(round(row["a"], 6)))
           for row in plan.get(f"table{suffix}", []) if row["policy"] == POLICY]
    V = record_at(plan, f"step_times{suffix}").get(POLICY)
    if profile and V:
        k = int(theory.best_draft_length_for(V, profile))
        s = float(theory.profile_speedup(V, profile, k))
        d = record_at(plan, "delta_steps", version).get(POLICY)
        lo, hi = (None, None) if not is_number(d) else map(float, theory.speedup_band(s, d))
        out.append(DraftAnswer(None, tuple(float(a) for a in profile), k, s, lo, hi))
    return out


# ---- the verdict ---------------------------------------------------------------------------------------------
def _plan_checks(plan: Mapping[str, Any], version: str, kernels: Sequence[KernelAnswer], plan_path: str,
                 runs_path: str) -> list[str]:
    """A version without a speedup band, and AUTO running the kernel a measurement rejects."""
    out = []
    no_band = [p for p, d in record_at(plan, "delta_steps", version).items() if d is None]
    if no_band:
        out.append(f"{plan_path}: the {version} version has no speedup band (21) for {', '.join(no_band)}: the error "
                   f"bound of its step times (the bench's eps, the runs' intervals) reaches half a step time; "
                   f"{rerun_bench()}, and {RERUN_RUN}")
    differ = [str(k.n) for k in kernels if k.auto_differs]
    if differ:
        out.append(f"{plan_path} and {runs_path} disagree at n = {', '.join(differ)}: the plan's AUTO follows the "
                   f"predicted saving (22) and runs the kernel the measured one rejects; use the kernel named above, "
                   f"and for a prediction that follows this machine, {rerun_bench()}")
    return out


def _score_checks(score: Score) -> list[str]:
    failing = [r.rule for r in score.rules if r.holds is False]
    out = [score.machine_note] if score.machine_note else []
    if failing:
        out.append(f"score: the plan's {score.version} version and these runs disagree on: {'; '.join(failing)}; "
                   f"the kernel lines above follow the measurement where it decides")
    return out


def _measured_k(score: Score | None) -> dict[float, int]:
    """The best k measured per acceptance for the AUTO policy, from a score's k_hat rule."""
    rule = next((r for r in (score.rules if score else []) if r.name == "k_hat"), None)
    rows = record_at(rule.detail if rule else {}, "per_policy", POLICY).get("per_acceptance", [])
    return {row["a"]: row["k_star"] for row in rows}


def _profile(runs: Mapping[str, Any] | None, kmax: int) -> list[float] | None:
    """A draft model's measured acceptance profile (draft_score.measured_profile) from the runs' rows that carry
    one as it is recorded (k an integer, a_j in [0, 1]), else None."""
    rows = (runs or {}).get("throughput_draft_model")
    rows = [r for r in rows if isinstance(r, Mapping) and isinstance(r.get("k"), int)
            and isinstance(r.get("acceptance_profile"), list)
            and all(a is None or (is_number(a) and 0 <= a <= 1) for a in r["acceptance_profile"])] \
        if isinstance(rows, list) else []
    return measured_profile(rows, kmax) if rows else None


def build_verdict(plan: Mapping[str, Any], runs: Mapping[str, Any] | None = None, score: Score | None = None,
                  warnings: Sequence[str] = (), bench: Mapping[str, Any] | None = None, plan_path: str = "plan",
                  runs_path: str = "runs", bench_path: str = "bench") -> Verdict:
    """The verdict of a plan (a validated plan document), with the measured runs and a score where given (the
    score's version; its runs should be `runs`), the plan's bench for its checks, and the caller's own warning
    lines (appended as given, e.g. a measurement's contention). The plan's stored warnings (plan.json
    verdict.warnings) are kept; the paths name the files in the warnings."""
    if isinstance(warnings, str) or not all(isinstance(w, str) for w in warnings):
        raise ValueError(f"warnings must be a sequence of strings, got {warnings!r}")
    version = score.version if score is not None else \
        next((v for v in DRAFT_VERSIONS if f"table{VERSION_SUFFIX[v]}" in plan), "prediction")
    kernels = kernel_answers(plan, runs)
    stored = record_at(plan, "verdict").get("warnings") or []
    redone = [*(bench_checks(bench, bench_path) if bench is not None else []),
              *(runs_checks(runs, runs_path, plan) if runs is not None else []),
              *_plan_checks(plan, version, kernels, plan_path, runs_path)]
    seen = {line.partition(": ")[2] for line in stored}  # a check redone on a file the plan named otherwise
    found = [*stored, *(line for line in redone if line.partition(": ")[2] not in seen),
             *(_score_checks(score) if score else []), *warnings]
    title = f"VERDICT for {plan['model']} {plan['dtype']} on {plan.get('device_kind') or plan['device']}"
    if record_at(plan, "basis").get("kind") == "runs":  # moespec.predict.measured: no bench behind the times
        title += " (its times are the verify-only runs' measured ones: the bench is too small to time)"
    drafts = draft_answers(plan, version, _measured_k(score), _profile(runs, plan["kmax"]))
    return Verdict(title, tuple(kernels), tuple(drafts), version, tuple(dict.fromkeys(found)))


def measured_crossover(runs: Mapping[str, Any]) -> str:
    """The runs' crossover in words: the median saving's point estimate, and whether any S(n) interval excludes 0
    (a crossover of medians whose every interval includes 0 is no measured difference)."""
    saving = record_at(runs, "saving_s")
    decided = [n for n, s in saving.items() if isinstance(s, Mapping) and is_number(s.get("lo"))
               and is_number(s.get("hi")) and (s["lo"] > 0 or s["hi"] < 0)]
    point = "none" if runs.get("crossover") is None else f"n = {runs['crossover']}"
    if saving and not decided:
        return f"{point} of the medians, but every S(n) 95% interval includes 0: no measurable difference at any n"
    return f"{point} (the smallest n from which the median saving stays positive)"
