"""Timed rounds: how moespec's engines time verify passes on a noisy machine, and the statistics of what they
measure (moespec.measure.run and moespec.measure.llama_run time through it; drafting uses its bootstrap).

Physics. A verify pass is a few to a few hundred milliseconds of streaming reads. On a shared host the same pass
reads 2-10x slower now and then (another job took the memory bus or a core), and the host's bandwidth sits at
one of a few levels for seconds to minutes (moespec.measure.level). So a pass is timed many times, in rounds that
time every pass size and policy once each, and:
- the rounds' order varies (the sizes ascending and descending in turn, each size's policies rotated), so that
  drift and a change of level hit every n and policy alike;
- a reference read before every pass (after an eviction of the cache, Level.poll) leaves no weights cached and
  measures the machine; a round whose slowest read falls below DISTURBED x the kept rounds' median was disturbed,
  and one off the level is dropped;
- the rounds go on until every median's 95% bootstrap interval is within +-target of it (or a round limit or a
  time budget), and the medians are reported with those intervals.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

import numpy as np

from moespec import MoespecError, theory
from moespec.defaults import KERNELS
from moespec.formats.checkpoint import Checkpoint, is_count, require
from moespec.formats.files import check_contention_record, is_number
from moespec.measure.contention import Cores, merge
from moespec.measure.level import DROP, REPIN, Level


class RoundLimits(Protocol):
    """What stops the rounds (moespec.measure.run.RunConfig has these): at least `reps` rounds, at most
    `max_reps`, each median's 95% interval within +-`target`, `budget_s` seconds per pass size."""

    reps: int
    max_reps: int
    target: float
    budget_s: float


DISTURBED = 0.7  # a reference read below 70% of the median bandwidth so far: the round was disturbed
BOOTSTRAP = 2000  # resamples for the 95% intervals: their ends move by < 1% of the interval between seeds
CONFIDENCE = 0.95


def bootstrap_median(samples: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    """(median, lo, hi): the 95% percentile-bootstrap interval of the median."""
    x = np.asarray(samples, dtype=float)
    meds = np.median(rng.choice(x, size=(BOOTSTRAP, x.size)), axis=1)
    lo, hi = np.quantile(meds, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return float(np.median(x)), float(lo), float(hi)


def bootstrap_rate(counts: list[float], seconds: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    """(rate, lo, hi): sum(counts) / sum(seconds) over steps, with the 95% percentile-bootstrap interval of that
    ratio over the steps resampled in pairs (a step's count and its time)."""
    c, t = np.asarray(counts, dtype=float), np.asarray(seconds, dtype=float)
    if c.size < 2 or c.size != t.size or not (t > 0).all():
        raise ValueError(f"counts and seconds must pair at least 2 steps of positive time, got {c.size} and {t.size}")
    picks = rng.integers(0, c.size, size=(BOOTSTRAP, c.size))
    lo, hi = np.quantile(c[picks].sum(axis=1) / t[picks].sum(axis=1), [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return float(c.sum() / t.sum()), float(lo), float(hi)


def bootstrap_saving(slot: list[float], dedup: list[float], rng: np.random.Generator) -> dict[str, float]:
    """S = median(slot) - median(dedup) with the 95% bootstrap interval (both sample sets resampled)."""
    a, b = np.asarray(slot, dtype=float), np.asarray(dedup, dtype=float)
    diffs = (np.median(rng.choice(a, size=(BOOTSTRAP, a.size)), axis=1)
             - np.median(rng.choice(b, size=(BOOTSTRAP, b.size)), axis=1))
    lo, hi = np.quantile(diffs, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return {"median": float(np.median(a) - np.median(b)), "lo": float(lo), "hi": float(hi)}


def verify_statistics(samples: dict[str, dict[int, list[float]]], rng: np.random.Generator) -> dict[str, Any]:
    """runs.json's verify keys from the samples per policy and n: verify_time_s (medians), verify_time_ci_s (95%
    bootstrap intervals), and where both kernels were timed saving_s (S(n) with its interval) and the crossover
    (moespec.formats.runsfile)."""
    stats = {p: {n: bootstrap_median(v, rng) for n, v in by_n.items()} for p, by_n in samples.items()}
    both = all(k in samples for k in KERNELS)
    saving = {n: bootstrap_saving(samples["slot"][n], samples["dedup"][n], rng) for n in samples["slot"]} \
        if both else {}
    return {"verify_time_s": {p: {str(n): m for n, (m, _, _) in by_n.items()} for p, by_n in stats.items()},
            "verify_time_ci_s": {p: {str(n): [lo, hi] for n, (_, lo, hi) in by_n.items()} for p, by_n in stats.items()},
            "saving_s": {str(n): v for n, v in saving.items()},
            "crossover": theory.crossover({n: v["median"] for n, v in saving.items()}) if both else None}


def _interval_ok(samples: list[float], rng: np.random.Generator, target: float) -> bool:
    """The 95% bootstrap interval of the median lies within +-target of it."""
    med, lo, hi = bootstrap_median(samples, rng)
    return max(med - lo, hi - med) <= target * med


VERIFY_UNIT = "verify rounds"  # the checkpoint unit of the verify rounds so far (all pass sizes share each round)


STOPS = ("target", "max_reps", "budget", "disturbed")  # what ends the verify rounds (timed_rounds)


def verify_unit_check(ns: list[int], policies: list[str]) -> Callable[[Any, str], None]:
    """The check of a resumed VERIFY_UNIT (timed_rounds' state) of the rounds over `ns` and `policies`: its counts,
    and in every kept round a positive time for each (n, policy), a reference read and a contention record."""
    passes = {f"{n} {p}" for n in ns for p in policies}

    def check(unit: Any, where: str) -> None:
        require(isinstance(unit, dict) and isinstance(unit.get("rounds"), list), where, "no list of rounds")
        require(all(is_count(unit.get(k)) for k in ("repeated", "off_level", "discarded")), where,
                "repeated, off_level and discarded must be whole numbers >= 0")
        require(is_number(unit.get("seconds")) and unit["seconds"] >= 0 and unit.get("stopped_by") in (None, *STOPS),
                where, "seconds must be a time >= 0 and stopped_by null or one of " + ", ".join(STOPS))
        for i, r in enumerate(unit["rounds"]):
            times = r.get("times") if isinstance(r, dict) else None
            require(isinstance(times, dict) and set(times) == passes and
                    all(is_number(t) and t > 0 for t in times.values()) and
                    is_number(r.get("reference_gbps")) and r["reference_gbps"] > 0, where,
                    f"rounds[{i}] must time every pass size and policy of this run once, and read the reference")
            check_contention_record(r.get("contention"), where, f"rounds[{i}].contention")
    return check


def verify_done(checkpoint: Checkpoint, unit: str = VERIFY_UNIT) -> bool:
    """The checkpoint holds finished verify rounds `unit` (a resumed run times no pass, warm-up included)."""
    return bool((checkpoint.units.get(unit) or {}).get("stopped_by"))


def _round_order(ns: list[int], policies: list[str], rep: int) -> list[tuple[int, str]]:
    """Round rep's passes: the pass sizes ascending on even rounds and descending on odd ones, each size's
    policies rotated by the round."""
    sizes = ns if rep % 2 == 0 else ns[::-1]
    return [(n, p) for n in sizes for p in policies[rep % len(policies):] + policies[:rep % len(policies)]]


def timed_rounds(time_pass: Callable[[int, str, int], float], ns: list[int], policies: list[str],
                 config: RoundLimits, rng: np.random.Generator, advance: Any, level: Level,
                 checkpoint: Checkpoint, cores: Cores, unit: str = VERIFY_UNIT) -> dict[int, dict[str, Any]]:
    """Rounds over every pass size: each round times every (n, policy) once (`time_pass(n, policy, round)`:
    seconds of one pass, its inputs set up outside the clock) in _round_order, so drift and the host's changes of
    level hit every n and policy alike instead of the sizes measured last; before each timed pass the level's
    reference read (moespec.measure.level) evicts the last-level cache and measures the machine's bandwidth, and
    `cores` fits the pass's threads to the free cores and notes another process beside it (each kept round
    carries its `contention` record, moespec.measure.contention).

    A round is dropped and repeated when its slowest reference read falls below DISTURBED x the median of the
    kept rounds' (another job took the memory bus or a core) or when its reads are off the pinned level (the host
    in another state; the level waits for it before the next round, and the dropped round's time counts as
    waiting, Level.thrown_away). When the level's wait runs out, the level
    moves to the host's (REPIN) and the rounds kept so far are discarded and measured again: a run's verify times
    are all of one state of the machine. Rounds go on, past config.reps, until every (n, policy) median has a 95%
    interval within +-config.target of it, or config.max_reps rounds are kept, or config.budget_s per pass size is
    spent, or more than config.max_reps rounds were dropped (once reps are kept; before that the level stops
    waiting and follows the host, Level.follow). The rounds so far are checkpointed after each round
    (`unit`, VERIFY_UNIT unless the run has several sets of rounds): a resumed run continues them.
    Returns, per n, the samples per policy and the noise record (rounds, repeated, off_level, discarded, met,
    seconds, reference_gbps, stopped_by, contention: the kept rounds' passes)."""
    state = checkpoint.units.get(unit) or {"rounds": [], "repeated": 0, "off_level": 0, "discarded": 0,
                                                    "seconds": 0.0, "stopped_by": None}
    rounds, budget = state["rounds"], config.budget_s * len(ns)
    started = time.perf_counter() - state["seconds"]

    def samples(n: int, policy: str) -> list[float]:
        return [r["times"][f"{n} {policy}"] for r in rounds]

    def met(n: int) -> bool:
        return len(rounds) >= config.reps and all(_interval_ok(samples(n, p), rng, config.target) for p in policies)

    while state["stopped_by"] is None:
        rep = len(rounds)
        times, reads = {}, []
        level.settle()
        began = time.perf_counter()
        for n, policy in _round_order(ns, policies, rep):
            reads.append(level.poll())  # after an eviction: a pass that read little leaves the reference buffer cached
            cores.before()
            times[f"{n} {policy}"] = time_pass(n, policy, rep)
            cores.after()
        contention = cores.take()
        mins = [r["reference_gbps"] for r in rounds]
        verdict = DROP if mins and min(reads) < DISTURBED * float(np.median(mins)) else level.judge(reads)
        if verdict == DROP:
            state["repeated"] += 1
            if not level.within(float(np.median(reads))):  # off the level: its time was spent waiting for it
                state["off_level"] += 1
                level.thrown_away(time.perf_counter() - began)
        else:
            if verdict == REPIN:
                state["discarded"] += len(rounds)
                rounds.clear()
            rounds.append({"times": times, "reference_gbps": min(reads), "contention": contention})
            advance(len(times))
        state["seconds"] = time.perf_counter() - started
        kept = len(rounds)
        if all(met(n) for n in ns):
            state["stopped_by"] = "target"
        elif kept >= config.max_reps:
            state["stopped_by"] = "max_reps"
        elif kept >= config.reps and state["seconds"] > budget:
            state["stopped_by"] = "budget"
        elif state["repeated"] > config.max_reps:
            if kept >= config.reps or state["repeated"] > 2 * config.max_reps:
                state["stopped_by"] = "disturbed"
            else:  # dropped before reps were kept: the host has left the level for good (seen: pinned at
                level.follow()  # 7.8 GB/s, the host at 16-21, 41 rounds dropped and none kept), so follow it
        checkpoint.save(unit, state)
        level.save(checkpoint)
    if not rounds:
        raise MoespecError(f"verify rounds: none kept of {state['repeated']} (each dropped as disturbed or off the "
                           "level)")
    reference = float(np.median([r["reference_gbps"] for r in rounds]))
    noise = {k: state[k] for k in ("repeated", "off_level", "discarded", "seconds", "stopped_by")}
    noise["contention"] = merge([r["contention"] for r in rounds if "contention" in r])
    return {n: {"samples": {p: samples(n, p) for p in policies},
                "noise": noise | {"rounds": len(rounds), "met": met(n), "reference_gbps": reference}} for n in ns}
