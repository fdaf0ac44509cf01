"""moespec.measure.rounds: timed rounds read the machine before every pass, each read after a cache flush."""

from types import SimpleNamespace

import numpy as np

from moespec.formats.checkpoint import Checkpoint
from moespec.measure.contention import Cores
from moespec.measure.level import Level
from moespec.measure.rounds import timed_rounds


def test_every_pass_follows_a_flushed_reference_read(tmp_path):
    """A pass that reads little (the pair's) leaves the 64 MiB reference buffer in the cache: each pass's read must
    follow an eviction, or the next read is of the cache, not the machine. Two rounds of two sizes and two
    policies: evict, read, pass, four times a round, and the rounds kept with the reads' minimum."""
    events, reads = [], iter([30.0, 31.0, 29.0, 32.0, 30.5, 28.0, 31.5, 30.0])

    def read():
        events.append("read")
        return next(reads)

    def time_pass(n, policy, rep):
        events.append(f"pass {n} {policy}")
        return 0.01 * n

    limits = SimpleNamespace(reps=2, max_reps=2, target=1.0, budget_s=60.0)
    checkpoint = Checkpoint(tmp_path / "run.json", {"test": 1}, "run")
    result = timed_rounds(time_pass, [1, 2], ["slot", "dedup"], limits, np.random.default_rng(0), lambda n: None,
                          Level(wait_s=0, read=read, evict=lambda: events.append("evict")), checkpoint, Cores())
    passes = [e for e in events if e.startswith("pass")]
    assert len(passes) == 8
    assert events == [x for p in passes for x in ("evict", "read", p)]
    assert result[1]["noise"]["rounds"] == 2 and result[1]["noise"]["reference_gbps"] == (29.0 + 28.0) / 2
    assert result[2]["samples"] == {"slot": [0.02, 0.02], "dedup": [0.02, 0.02]}


def test_rounds_thrown_away_off_the_level_spend_the_waiting_budget(tmp_path, monkeypatch):
    """A host at the edge of the band: settled back at the level before every round, off it by the round's read.
    Each dropped round's 3 s count as waiting, so after 4 of them the 10 s budget is spent and the next round
    re-pins to the host, instead of rounds dropped until the drop limit."""
    import moespec.measure.rounds as R

    clock = [0.0]
    monkeypatch.setattr(R.time, "perf_counter", lambda: clock[0])  # the level reads the same time module

    settling = [False]
    settle = Level.settle

    def settled(self):
        settling[0] = True
        settle(self)
        settling[0] = False

    monkeypatch.setattr(Level, "settle", settled)

    def time_pass(n, policy, rep):
        clock[0] += 3.0
        return 0.01

    level = Level(34.0, wait_s=10, read=lambda: 34.0 if settling[0] else 50.0, evict=lambda: None)
    limits = SimpleNamespace(reps=1, max_reps=20, target=1.0, budget_s=1e6)
    checkpoint = Checkpoint(tmp_path / "run.json", {"test": 1}, "run")
    result = timed_rounds(time_pass, [1], ["slot"], limits, np.random.default_rng(0), lambda n: None, level,
                          checkpoint, Cores())
    noise = result[1]["noise"]
    assert (noise["repeated"], noise["off_level"], noise["rounds"]) == (4, 4, 1)
    assert level.exhausted and level.waited_s == 12.0 and level.repins == 1 and level.pinned == 50.0
