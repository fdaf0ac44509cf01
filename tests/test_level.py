"""The host's bandwidth level (moespec.measure.level): rounds off the pinned level are dropped and waited out
within a budget, the pin travels bench -> verify-only run -> plan -> scored run, and bad values are one line."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_run import run_cli

from moespec import MoespecError
from moespec.formats.files import check_level_record
from moespec.measure import bench, bench_rounds, passes
from moespec.measure import level as L
from moespec.measure import run as R
from moespec.predict.plan import inputs_level
from moespec.measure.contention import Cores


def reads_of(values):
    it = iter(values)
    return lambda: next(it)


def test_pin_host_pins_the_median_of_a_window_only_where_none_is_pinned():
    level = L.Level(wait_s=10, read=reads_of([10.0] + [30.0] * (L.PIN_READS - 1)))
    level.pin_host()
    assert level.pinned == 30.0  # a low first read does not set the level
    given = L.Level(40.0, wait_s=10, read=reads_of([]))
    given.pin_host()
    off = L.Level(wait_s=0, read=reads_of([]))
    off.pin_host()
    assert given.pinned == 40.0 and off.pinned is None


def test_band_is_symmetric_and_pins_the_first_round():
    level = L.Level(wait_s=10, read=reads_of([]))
    assert level.judge([33.0, 34.0, 35.0]) == L.KEEP and level.pinned == 34.0  # the first round pins its median
    assert level.within(34.0 * 1.15) and level.within(34.0 / 1.15)
    assert not level.within(34.0 * 1.2) and not level.within(34.0 / 1.2)
    assert level.judge([57.0, 58.0, 34.0]) == L.DROP and level.dropped == 1  # the median is the other level
    assert level.judge([33.0, 57.0, 35.0]) == L.KEEP and level.dropped == 1  # one read off: the median holds


def test_settle_waits_for_the_level_then_the_level_follows_the_host():
    polls = []

    def read():
        polls.append(1)
        return 57.0 if len(polls) < 4 else 34.0

    level = L.Level(34.0, wait_s=10, read=read)
    level.settle()
    assert len(polls) == 4 and not level.exhausted and level.waited_s >= 0
    stuck = L.Level(34.0, wait_s=0.02, read=lambda: 57.0)
    stuck.settle()
    assert stuck.exhausted and stuck.waited_s >= 0.02
    assert stuck.judge([57.0], repin=False) == L.KEEP and stuck.kept_off == 1  # a grid's unit: kept, counted
    assert stuck.judge([57.0]) == L.REPIN and stuck.pinned == 57.0 and stuck.repins == 1
    stuck.settle()  # the budget is spent: no more waiting, whatever the level
    assert stuck.judge([58.0]) == L.KEEP
    record = stuck.record()
    assert record["repins"] == 1 and record["kept_off"] == 1 and record["pinned_gbps"] == 57.0


def test_settle_polls_back_to_back(monkeypatch):
    """A read after the cores idled reads low whatever the host does: settle never sleeps between its polls."""
    monkeypatch.setattr(L.time, "sleep", lambda s: pytest.fail("settle slept between polls"))
    level = L.Level(34.0, wait_s=10, read=reads_of([57.0, 57.0, 34.0]))
    level.settle()
    assert not level.exhausted


def test_polls_follow_an_eviction_and_judged_reads_after_a_unit_too():
    """Read twice in a row, the reference buffer is partly in the cache and reads fast: every settle poll and the
    read after a unit follow the eviction; pinning the host's level takes a window of polls."""
    events = []
    level = L.Level(30.0, wait_s=10, read=lambda: events.append("read") or 30.0,
                    evict=lambda: events.append("evict"))
    level.measured(lambda: events.append("unit"))
    assert events == ["evict", "read", "unit", "evict", "read"]
    events.clear()
    fresh = L.Level(wait_s=10, read=lambda: events.append("read") or 30.0, evict=lambda: events.append("evict"))
    fresh.pin_host()
    assert events == ["evict", "read"] * L.PIN_READS and fresh.pinned == 30.0


def test_after_a_dropped_round_settle_waits_for_a_window_at_the_level():
    """One read in the band is noise on a busy host: after a drop, settle ends on the median of the last
    SETTLE_READS reads; with no drop since, on one read at the level."""
    polls = []

    def read():
        polls.append(1)
        return ([34.0] + [57.0] * (L.SETTLE_READS - 1) + [34.0] * 100)[len(polls) - 1]

    level = L.Level(34.0, wait_s=10, read=read)
    assert level.judge([57.0]) == L.DROP
    level.settle()  # 34, then four 57s: a lucky read does not end it; the window's median is 34 once three more
    assert len(polls) == L.SETTLE_READS + (L.SETTLE_READS + 1) // 2 and not level.exhausted
    level.settle()
    assert len(polls) == L.SETTLE_READS + (L.SETTLE_READS + 1) // 2 + 1


def test_repins_are_bounded():
    level = L.Level(30.0, wait_s=1e-6, read=lambda: 90.0)
    verdicts = []
    for gbps in [60.0, 30.0] * (L.MAX_REPINS + 1):
        level.exhausted = True  # each level stays past the wait
        verdicts.append(level.judge([gbps]))
    assert verdicts[:L.MAX_REPINS] == [L.REPIN] * L.MAX_REPINS and level.repins == L.MAX_REPINS
    assert L.REPIN not in verdicts[L.MAX_REPINS:] and level.kept_off >= 1  # then kept off the level, counted


def test_no_wait_keeps_every_round_and_pins_nothing():
    level = L.Level(wait_s=0, read=lambda: pytest.fail("an inactive level reads nothing to settle"))
    level.settle()
    assert level.judge([10.0]) == L.KEEP and level.judge([90.0]) == L.KEEP and level.pinned is None
    assert not level.active
    assert level.measured(lambda: 7) == 7  # a unit runs once, with no read after it


def test_measured_reruns_a_unit_whose_after_read_is_off():
    runs = []
    # settle reads 34 (at the level); the first run's after-read is 57 (off): settle reads its window, then run
    # again; the second's is 34
    level = L.Level(34.0, wait_s=10, read=reads_of([34.0, 57.0] + [34.0] * L.SETTLE_READS + [34.0]))
    assert level.measured(lambda: runs.append(1) or len(runs)) == 2 and level.dropped == 1
    always_off = L.Level(34.0, wait_s=0.0001, read=lambda: 57.0)
    count = []
    always_off.measured(lambda: count.append(1))
    assert len(count) <= L.ATTEMPTS and always_off.kept_off >= 1 and always_off.repins == 0  # never re-pinned


def test_a_unit_thrown_away_counts_against_the_waiting_budget(monkeypatch):
    """A unit run off the level and thrown away is time spent waiting: one that outlasts the budget spends it, so
    the next run of the unit is kept (off the level) instead of run a third time."""
    clock = iter(range(0, 1000, 10))  # every perf_counter call 10 s later
    monkeypatch.setattr(L.time, "perf_counter", lambda: float(next(clock)))
    runs = []
    # settle's read at the level (10 s), the first run (10 s) and its after-read off (57): 20 s of the 15 spent, so
    # no settle, and the second run's after-read, off again, is kept off
    level = L.Level(34.0, wait_s=15, read=reads_of([34.0, 57.0, 57.0]))
    level.measured(lambda: runs.append(1))
    assert len(runs) == 2 and level.dropped == 1 and level.kept_off == 1
    assert level.exhausted and level.waited_s >= 15


def test_restore_continues_a_checkpointed_pin():
    saved = L.Level(40.0, wait_s=10, read=reads_of([])).record() | {"dropped": 3, "waited_s": 1.5, "repins": 1}
    level = L.Level(35.0, wait_s=10, read=reads_of([]))
    level.restore(SimpleNamespace(units={L.LEVEL_UNIT: saved}))  # the saved pin wins: a re-pinned run goes on
    # at its new level
    assert level.pinned == 40.0 and level.dropped == 3 and level.waited_s == 1.5 and level.repins == 1


@pytest.mark.parametrize("pinned, wait, needle", [(-1.0, None, "--pin-gbps"), (float("nan"), None, "--pin-gbps"),
                                                  (None, -1.0, "--pin-wait"), (None, float("inf"), "--pin-wait")])
def test_bad_values_name_the_flag(pinned, wait, needle):
    with pytest.raises(MoespecError, match=needle):
        L.Level(pinned, wait)


@pytest.mark.parametrize("flag, value", [("--pin-gbps", "-3"), ("--pin-wait", "-1"), ("--pin-gbps", "x")])
def test_cli_bad_level_is_one_line(flag, value, tiny_checkpoints, tmp_path):
    code, _, err = run_cli(["--model", str(tiny_checkpoints["olmoe"]), flag, value, "--no-throughput",
                            "--out", str(tmp_path / "r.json")])
    assert code == 2 and flag in err and len(err.strip().splitlines()) == 1


def run_timed(tiny_checkpoints, tmp_path, monkeypatch, read, *flags: str) -> tuple[int, str, dict]:
    """`run FLAGS` of three rounds at n = 2 on the tiny OLMoE, the reference read being `read` and the passes
    10-12 ms: (exit code, stdout, runs.json)."""
    monkeypatch.setattr(L, "StreamRead", lambda nbytes: read)
    passes = itertools.cycle([0.010, 0.011, 0.012])
    monkeypatch.setattr(R.speculative, "timed_forward", lambda *args: next(passes))
    out = tmp_path / "runs.json"
    code, stdout, _ = run_cli(["--model", str(tiny_checkpoints["olmoe"]), "--depth", "8", "--n", "2", "--reps",
                               "3", "--max-reps", "3", "--no-throughput", "--dtype", "fp32", *flags,
                               "--out", str(out)])
    return code, stdout, json.loads(out.read_text())


def run_at_level(tiny_checkpoints, tmp_path, monkeypatch, read, wait: str) -> tuple[int, str, dict]:
    """run_timed with `--pin-gbps 20 --pin-wait WAIT`."""
    return run_timed(tiny_checkpoints, tmp_path, monkeypatch, read, "--pin-gbps", "20", "--pin-wait", wait)


def settling_reads(monkeypatch) -> list[int]:
    """The reference reads each Level.settle call makes from now on, one count per call (Level.poll counted)."""
    counts: list[int] = []
    original = L.Level.settle

    def settle(self):
        before = self.reads_seen = getattr(self, "reads_seen", 0)
        original(self)
        counts.append(self.reads_seen - before)

    def poll(self):
        self.reads_seen = getattr(self, "reads_seen", 0) + 1
        return original_poll(self)

    original_poll = L.Level.poll
    monkeypatch.setattr(L.Level, "settle", settle)
    monkeypatch.setattr(L.Level, "poll", poll)
    return counts


@pytest.mark.parametrize("flags, pinned", [([], False), (["--pin-wait", "30"], True)])
def test_run_pins_only_when_asked(tiny_checkpoints, tmp_path, monkeypatch, flags, pinned):
    """Pinning is opt-in: a run with no flags waits for no level even where WAIT_S is not 0 (no reference read
    settles, the record says wait_s 0 and nothing pinned); --pin-wait turns it on, pinning the first round's."""
    monkeypatch.setattr(L, "WAIT_S", 30.0)
    settles = settling_reads(monkeypatch)
    code, stdout, doc = run_timed(tiny_checkpoints, tmp_path, monkeypatch, lambda: 20.0, *flags)
    assert code == 0
    if pinned:
        assert doc["level"]["wait_s"] == 30.0 and doc["level"]["pinned_gbps"] == 20.0 and sum(settles) > 0
        assert "level: rounds kept at the first round" in stdout
    else:
        assert doc["level"]["wait_s"] == 0 and doc["level"]["pinned_gbps"] is None and sum(settles) == 0
        assert "level:" not in stdout


@pytest.mark.parametrize("flags, pinned", [([], False), (["--pin-wait", "30"], True), (["--pin-gbps", "20"], True)])
def test_bench_pins_only_when_asked(bench_argv, tmp_path, monkeypatch, flags, pinned):
    """The bench alike; --pin-gbps alone pins with the default wait."""
    from moespec import cli

    monkeypatch.setattr(L, "WAIT_S", 30.0)
    monkeypatch.setattr(L, "StreamRead", lambda nbytes: lambda: 20.0)
    settles = settling_reads(monkeypatch)
    assert cli.main(bench_argv(tmp_path / "b.json", *flags)) == 0
    record = json.loads((tmp_path / "b.json").read_text())["level"]
    if pinned:
        assert record["wait_s"] == 30.0 and record["pinned_gbps"] == 20.0 and sum(settles) > 0
    else:
        assert record["wait_s"] == 0 and record["pinned_gbps"] is None and sum(settles) == 0


def test_the_bench_pins_a_window_of_reads_not_its_first(bench_argv, tmp_path, monkeypatch):
    """A read after idle cores reads low: the bench pins the median of PIN_READS polls before its rounds, so one low
    first read leaves the pin at the host's level."""
    from moespec import cli

    reads = itertools.chain([8.0], itertools.repeat(20.0))
    monkeypatch.setattr(L, "StreamRead", lambda nbytes: lambda: next(reads))
    assert cli.main(bench_argv(tmp_path / "b.json", "--pin-wait", "30")) == 0
    record = json.loads((tmp_path / "b.json").read_text())["level"]
    assert record["pinned_gbps"] == 20.0 and record["kept_off"] == 0 and record["dropped"] == 0


@pytest.mark.parametrize("flag, new", [("--level", "--pin-gbps"), ("--level-wait", "--pin-wait")])
def test_the_old_flag_names_are_refused_naming_the_new(flag, new, tiny_checkpoints, bench_argv, tmp_path, capsys):
    """--level is an interval level in `reuse`; in bench and run the bandwidth to pin is --pin-gbps."""
    from moespec import cli

    code, _, err = run_cli(["--model", str(tiny_checkpoints["olmoe"]), flag, "20", "--no-throughput",
                            "--out", str(tmp_path / "r.json")])
    assert code == 2 and new in err and len(err.strip().splitlines()) == 1
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:  # argparse's one line
        cli.main(bench_argv(tmp_path / "b.json", flag, "20"))
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert new in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("gbps, wait", [(None, 10.0), (50.0, None)])
def test_no_pinning_on_a_gpu_whatever_was_asked(gbps, wait):
    """On a CUDA device the reference read measures the host, not the device: a run's level is inactive, and one
    line says that what was asked is ignored; nothing is said where nothing was asked."""
    said = []
    ckpt = type("C", (), {"units": {}})()
    config = R.RunConfig(level_gbps=gbps, level_wait_s=wait)
    level = R.run_level(config, {"level_gbps": 34.5}, ckpt, said.append, "cuda")
    assert not level.active and level.record()["pinned_gbps"] is None and level.record()["wait_s"] == 0
    assert len(said) == 1 and "--pin-gbps/--pin-wait ignored on cuda" in said[0]
    assert R.run_level(R.RunConfig(level_wait_s=wait), None, ckpt, said.append, "cpu").active == bool(wait)
    quiet = []
    assert not R.run_level(R.RunConfig(), {"level_gbps": 34.5}, ckpt, quiet.append, "cuda").active and not quiet


def test_pin_wait_is_opt_in(monkeypatch):
    monkeypatch.setattr(L, "WAIT_S", 30.0)
    assert L.pin_wait(None, None) == 0 and L.pin_wait(20.0, None) == 30.0 and L.pin_wait(None, 5) == 5.0
    assert L.pin_wait(20.0, 0) == 0  # an explicit 0 turns it off whatever the level


def test_the_demo_caps_all_its_waiting(monkeypatch):
    """A host that stays off the level through every measurement of the demo: each waits its share of the cap and
    no more, all of them together the cap, and the demo says in one line that it goes on."""
    from moespec import demo as D

    cap_s = 0.3
    said = []
    cap = D.WaitCap(said.append, cap_s)
    units = []
    for artifact in D.WAIT_SHARES:
        level = L.Level(30.0, D.wait_share(artifact, cap_s), read=lambda: 60.0)
        for _ in range(5):  # settles and units thrown away off the level, as rounds and prompts would
            level.settle()
            level.measured(lambda: units.append(1))
        cap.charge(level.record())
    assert cap_s <= cap.waited_s < cap_s + 0.1  # a read or a unit past it at most
    assert len(said) == len(D.WAIT_SHARES)
    assert all("for the host's bandwidth level, the cap" in line and "going on at the level it has" in line
               for line in said)
    configs = [D.bench_config(D.DemoConfig()), *D.engine_configs(D.DemoConfig())[::2]]
    assert sum(c.level_wait_s for c in configs) == pytest.approx(D.DEMO_WAIT_CAP_S)  # the real cap, split


def test_run_drops_rounds_off_the_pinned_level(tiny_checkpoints, tmp_path, monkeypatch):
    """With --pin-gbps 20, a round whose reference reads sit at 35 GB/s is dropped and counted off_level; settle's
    polls wait until the reads return; the file records the level and what it cost."""
    # per round: one settle poll, then one read per policy (slot, dedup, outside: 3)
    at, off = [20.0] * 4, [20.0] + [35.0] * 3
    code, stdout, doc = run_at_level(tiny_checkpoints, tmp_path, monkeypatch, reads_of(at + off + at * 100), "30")
    unit = doc["noise"]["per_n"]["2"]
    assert code == 0 and unit["rounds"] == 3 and unit["repeated"] == 1 and unit["off_level"] == 1
    assert doc["level"]["pinned_gbps"] == 20.0 and doc["level"]["dropped"] == 1 and not doc["level"]["exhausted"]
    assert "1 dropped off it" in stdout and "20.0 GB/s" in stdout


def test_a_run_follows_a_level_that_stays_away_and_measures_its_rounds_again(tiny_checkpoints, tmp_path,
                                                                             monkeypatch):
    """Two rounds at the pinned 20 GB/s, then the host stays at 35: after the wait the level moves, the two rounds
    are discarded, and every kept round is of the new level."""
    count = []

    def read():
        count.append(1)
        return 20.0 if len(count) <= 8 else 35.0  # per round: a settle poll and three passes' reads

    code, stdout, doc = run_at_level(tiny_checkpoints, tmp_path, monkeypatch, read, "0.01")
    assert code == 0 and doc["noise"]["discarded"] == 2 and doc["noise"]["rounds"] == 3
    assert doc["level"]["repins"] == 1 and doc["level"]["pinned_gbps"] == 35.0
    assert doc["noise"]["per_n"]["2"]["reference_gbps"] == 35.0 and "re-pinned 1 time" in stdout


def test_the_pin_travels_from_bench_and_runs_to_the_plan_and_its_scored_run():
    bench = {"level": {"pinned_gbps": 33.0, "wait_s": 45.0}}
    runs = {"level": {"pinned_gbps": 34.5, "wait_s": 45.0}}
    assert inputs_level(bench, None) == 33.0 and inputs_level(bench, runs) == 34.5  # the calibration's wins
    assert inputs_level({"level": {"pinned_gbps": 33.0, "wait_s": 0.0}}, None) is None  # nothing pinned
    assert inputs_level({}, {}) is None  # older files
    said = []
    config = R.RunConfig(level_wait_s=10)
    ckpt = type("C", (), {"units": {}})()
    assert R.run_level(config, {"level_gbps": 34.5}, ckpt, said.append).pinned == 34.5
    assert R.run_level(R.RunConfig(level_gbps=50.0, level_wait_s=10), {"level_gbps": 34.5}, ckpt,
                       said.append).pinned == 50.0  # --pin-gbps wins over the plan's
    assert "34.5 GB/s" in said[0]


@pytest.mark.parametrize("level, needle", [([], "level must be an object"), ({"pinned_gbps": -1}, "pinned_gbps"),
                                           ({"pinned_gbps": 30, "band": 0.15, "wait_s": "x", "waited_s": 0},
                                            "wait_s")])
def test_loaders_refuse_a_bad_level_record(level, needle):
    with pytest.raises(MoespecError, match=needle) as info:
        check_level_record({"level": level}, "runs.json")
    assert "runs.json" in str(info.value)


def test_bench_repeats_a_round_off_the_level():
    """The bench's rounds: settled before, a reference read after; a round whose read is off is timed again and
    only the kept rounds' samples count."""
    calls = []
    layer = SimpleNamespace(shape=(4, 8), x_dtype=torch.float32, gate_up=torch.zeros(1), tensors=[],
                            run=lambda kernel, *inp: calls.append(kernel))
    timer = SimpleNamespace(flush=lambda: None, time=lambda fn: fn() or 0.001, ceiling=lambda repeats: [30.0])
    two = [passes.Pass("chosen", np.zeros((2, 2), dtype=np.int64), 2)]
    # round 1: nothing pinned, so PIN_READS polls at 30 pin it, settle 30, after 30; round 2: settle 30, after 50
    # (off: again), settle's window at 30, after 30
    level = L.Level(wait_s=10, read=reads_of([30.0] * (L.PIN_READS + 3) + [50.0] + [30.0] * L.SETTLE_READS + [30.0]))
    inputs = [bench.pass_inputs(two, 8, torch.float32, "cpu")]
    bench_rounds.warm_up(inputs, ["slot", "dedup"], layer)
    rounds = [bench_rounds.time_round(inputs, ["slot", "dedup"], layer, rep, 2, timer, lambda n: None, level, Cores())
              for rep in range(2)]
    unit = bench_rounds.unit_records(0, [2], ["slot", "dedup"], {(0, 2): two}, rounds)[0, 2]
    assert level.pinned == 30.0 and level.dropped == 1
    assert len(unit["passes"]) == 1 and len(unit["ceiling_gbps"]) == 2
    assert [row[0] for r in rounds for row in r[0]["times"]] == [0.001, 0.001]
    assert len(calls) == 2 + 3 * 2  # the warm-up, two kept rounds and the dropped one


def test_a_run_whose_rounds_all_fall_off_the_level_follows_the_host(tiny_checkpoints, tmp_path, monkeypatch):
    """The host comes back to the pinned 20 GB/s only between rounds (settle's polls) and is at 35 during every
    round: each round is dropped. Once more rounds are dropped than --max-reps before any is kept, the level stops
    waiting and follows the host, so the run keeps rounds and writes finite verify times (it once wrote NaN)."""
    between = [20.0] * L.SETTLE_READS + [35.0] * 3  # settle's window after a dropped round, then a round's reads
    code, stdout, doc = run_at_level(tiny_checkpoints, tmp_path, monkeypatch,
                                     reads_of([20.0, 35.0, 35.0, 35.0] + between * 3 + [35.0] * 200), "30")
    assert code == 0, stdout
    assert doc["noise"]["per_n"]["2"]["repeated"] == 4 and doc["level"]["exhausted"]
    assert doc["level"]["repins"] == 1 and doc["level"]["pinned_gbps"] == 35.0
    times = [t for per_n in doc["verify_time_s"].values() for t in per_n.values()]
    assert times and all(np.isfinite(times)) and doc["noise"]["per_n"]["2"]["rounds"] >= 1
