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
