"""The host's loop state around each measured bench of benchmarks/structure_model.py: the profile's self-check passes
timed again just before and just after the bench (moespec.measure.state_probe), and the loop factor k the model
predicts that bench at (the geometric mean of the two), kept beside the bench as state-B<batch>.json so a stored
run is predicted again at the state its bench met. Where the two disagree by more than DRIFT (a probe taken while the
host settles after another job's load can read a loop a third of its bench's), a third probe is taken at once and k is
the median of the three: one disturbed probe does not set it."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable

from moespec import MoespecError
from moespec.formats.devicefile import DeviceProfile
from moespec.formats.files import provenance, write_json
from moespec.measure.state_probe import loop_factor, time_probe
from moespec.measure.timing import timer_for

SIDES = ("before", "after")  # a state record's probes, taken just before and just after its bench
AGAIN = "again"  # the third probe, taken right after "after" where the two disagree by more than DRIFT
DRIFT = 1.5  # sides of an undisturbed bench agree within ~20%; one of them off by half is a disturbed probe


def state_path(bench_out: str) -> Path:
    """Where a bench's state record lies: beside it, bench-B<batch>.json -> state-B<batch>.json."""
    path = Path(bench_out)
    return path.with_name(path.name.replace("bench-", "state-", 1))


def read_state(bench_out: str) -> dict[str, Any] | None:
    """The state record beside the bench at bench_out (None where there is none); one line naming the file where it
    is not JSON or holds no probe before and after the bench."""
    path = state_path(bench_out)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise MoespecError(f"{path}: not a state record ({e})") from None
    if not all(isinstance(record.get(side), dict) and isinstance(record[side].get("probe"), list)
               for side in (*SIDES, *([AGAIN] if AGAIN in record else []))):
        raise MoespecError(f"{path}: a state record holds the probe before and after its bench (and a third, where "
                           f"it has one)")
    return record


def probes_of(record: dict[str, Any]) -> dict[str, list]:
    """The probes of a state record, by side (the third where it was taken)."""
    return {side: record[side]["probe"] for side in (*SIDES, AGAIN) if side in record}


def drifted(sides: dict[str, Any]) -> bool:
    """Whether the probes before and after a bench disagree by more than DRIFT."""
    ks = [sides[side]["k"] for side in SIDES]
    return max(ks) > DRIFT * min(ks)


def bracketed(profile: DeviceProfile, dtype: str, probes: dict[str, list]) -> tuple[float, dict[str, Any]]:
    """(k, each side's loop_factor) of the probes around a bench against `profile`: k the geometric mean of the two
    sides' (a bench between two states met both), or, where a third probe was taken, the median of the three."""
    sides = {side: loop_factor(profile, dtype, probe) for side, probe in probes.items()}
    if AGAIN in sides:
        return statistics.median(s["k"] for s in sides.values()), sides
    return math.sqrt(sides["before"]["k"] * sides["after"]["k"]), sides


def around_bench(bench_out: str, profile: DeviceProfile, dtype: str, measure: Callable[[], object],
                 say: Callable[[str], None] = print) -> dict[str, Any] | None:
    """The state record of the bench at bench_out: where the bench is not yet measured, the probe taken, `measure`
    run and the probe taken again, written beside it; else the stored record (None where the bench was measured
    without one). On a GPU the bench is measured without a probe (None)."""
    if Path(bench_out).exists():
        return read_state(bench_out)
    if profile["device_kind"] != "cpu":
        measure()
        return None
    timer = timer_for("cpu")
    probes = {"before": time_probe(profile, dtype, timer)}
    measure()
    probes["after"] = time_probe(profile, dtype, timer)
    k, sides = bracketed(profile, dtype, probes)
    if drifted(sides):
        probes[AGAIN] = time_probe(profile, dtype, timer)
        k, sides = bracketed(profile, dtype, probes)
    record = {"loop_factor": k, **{side: {"probe": probe} | sides[side] for side, probe in probes.items()},
              "profile": profile.path, "provenance": provenance(profile["device"], dtype)}
    write_json(state_path(bench_out), record)
    say(f"loop state: k = {sides['before']['k']:.3f} before the bench, {sides['after']['k']:.3f} after "
        f"({sides['before']['used']} and {sides['after']['used']} probe passes told it)"
        + (f"; they disagree by over {DRIFT}x: a third probe read {sides[AGAIN]['k']:.3f}, k = {k:.3f} (the median)"
           if AGAIN in sides else ""))
    return record
