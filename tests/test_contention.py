"""moespec.measure.contention: threads fitted to the free cores, contended calls flagged, the record carried
through bench.json and runs.json to their loaders."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from moespec import MoespecError, cli
from moespec.formats.benchfile import load_bench
from moespec.formats.runsfile import load_runs
from moespec.measure import bench
from moespec.measure import contention as C
from moespec.measure import run as R
from moespec.measure.contention import Cores, Snapshot

from test_run import run_cli


def fake_snapshots(monkeypatch, others: list[int], delays: list[float] | None = None, step: float = 0.01) -> None:
    """snapshot() returns the given others counts (and cumulative run delays) in turn, `step` seconds apart."""
    it = iter(range(len(others)))
    delays = delays or [0.0] * len(others)

    def snap() -> Snapshot:
        i = next(it)
        return Snapshot(others[i], delays[i], i * step)

    monkeypatch.setattr(C, "snapshot", snap)


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(C, "cores", lambda: 2)
    monkeypatch.setattr(C.os, "cpu_count", lambda: 2)  # the whole machine: its run queue is of our cores
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_snapshot_reads_this_machine():
    snap = C.snapshot()
    if snap is None:
        pytest.skip("no /proc here")
    assert snap.others >= 0 and snap.run_delay_s >= 0 and C.cores() >= 1


def test_a_busy_process_shows_in_the_run_queue():
    """A CPU-bound child is counted as another process's runnable thread, not as one of ours."""
    if C.snapshot() is None:
        pytest.skip("no /proc here")
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        # a guard against a hang, not a speed test: the loop ends at the first read that sees the child
        deadline, seen = time.monotonic() + 60, 0
        while time.monotonic() < deadline and seen < 1:
            seen = C.snapshot().others
        assert seen >= 1
    finally:
        child.kill()
        child.wait()


def test_a_sustained_load_fits_the_threads_and_a_single_read_does_not(monkeypatch, two_cores):
    # reads: call 1 before 1 and two more back to back (0, 0: no fit), after 1; call 2 before 1 (the last three
    # 0, 1, 1: no fit), after 1; call 3 before 1 (1, 1, 1: fit to the one free core), after 0; call 4 before 0 (back
    # to 2), after 0
    fake_snapshots(monkeypatch, [1, 0, 0, 1, 1, 1, 1, 0, 0, 0])
    cores = Cores(2, fit=True)
    used = []
    for _ in range(4):
        used.append(cores.before())
        assert torch.get_num_threads() == used[-1]  # the native kernels take torch's count
        cores.after()
    assert used == [2, 2, 1, 2]
    record = cores.take()  # contended: calls 1 and 2 (another thread at both ends); call 3 at its start alone
    assert record["calls"] == 4 and record["contended"] == 2 and record["fewer_threads"] == 1
    assert record["others_max"] == 1
    cores.release()


def test_release_gives_torch_its_threads_back(two_cores):
    torch.set_num_threads(2)
    cores = Cores(1)
    assert torch.get_num_threads() == 1
    cores.release()
    assert torch.get_num_threads() == 2


def test_a_watching_cores_changes_no_threads(monkeypatch, two_cores):
    fake_snapshots(monkeypatch, [1, 1, 1, 1, 1])
    torch.set_num_threads(2)
    cores = Cores(2, fit=False)
    used = []
    for _ in range(2):
        used.append(cores.before())
        cores.after()
    assert used == [2, 2] and torch.get_num_threads() == 2 and cores.take()["contended"] == 2


def test_another_thread_at_one_end_flags_a_call_only_where_ours_waited(monkeypatch, two_cores):
    # 10 ms calls, another runnable thread at the start of each: the first waited 0.1 ms (1%), the second 2 ms
    # (20%); the third waited 2 ms with nothing else runnable at either end (our own threads: not flagged)
    fake_snapshots(monkeypatch, [1, 0, 1, 0, 0, 0], [0.0, 0.0001, 0.0001, 0.0021, 0.0021, 0.0041])
    cores = Cores(2, fit=False)
    flags = []
    for _ in range(3):
        cores.before()
        flags.append(cores.after())
    assert flags == [False, True, False] and cores.take()["wait_share_max"] == pytest.approx(0.2)


def test_a_cold_call_flushes_then_reads_the_machine_around_the_timed_call(monkeypatch, two_cores):
    """Cores.cold_call, the bench's and the profile's timed call: the flush, a read (threads fitted), the call timed
    alone, a read after it judging the call; the call's seconds come back."""
    fake_snapshots(monkeypatch, [1, 1, 1, 1])  # another thread at both ends: contended
    steps = []
    timer = SimpleNamespace(flush=lambda: steps.append("flush"),
                            time=lambda fn: (steps.append(f"reads {cores.calls}"), fn(), 0.25)[-1])
    cores = Cores(2, fit=False)
    assert cores.cold_call(timer, lambda: steps.append("call")) == 0.25
    assert steps == ["flush", "reads 0", "call"] and cores.take()["contended"] == 1


def test_a_cold_call_reads_its_weights_before_the_flush(monkeypatch, two_cores):
    """`reads`: the call's weights are read once, then the cache is flushed, then the call is timed; no reads, no
    read."""
    fake_snapshots(monkeypatch, [0] * 4)
    steps = []
    monkeypatch.setattr(C, "read_pages", lambda parts: steps.append(("read", len(parts))))
    timer = SimpleNamespace(flush=lambda: steps.append("flush"), time=lambda fn: (fn(), 0.5)[-1])
    cores = Cores(2, fit=False)
    weights = [torch.zeros(4), torch.zeros(2)]
    assert cores.cold_call(timer, lambda: steps.append("call"), weights) == 0.5
    assert cores.cold_call(timer, lambda: steps.append("call")) == 0.5
    assert steps == [("read", 2), "flush", "call", "flush", "call"]


def test_take_starts_the_counts_again_and_merge_adds_them(monkeypatch, two_cores):
    fake_snapshots(monkeypatch, [1, 1, 0, 0])
    cores = Cores(2, fit=False)
    cores.before()
    cores.after()
    first = cores.take()
    cores.before()
    cores.after()
    second = cores.take()
    assert (first["calls"], first["contended"], second["calls"], second["contended"]) == (1, 1, 1, 0)
    merged = C.merge([first, second])
    assert merged["calls"] == 2 and merged["contended"] == 1 and C.merge([]) is None


def test_describe_says_what_to_do_past_the_share():
    base = {"cores": 2, "threads": 2, "fitted": True, "calls": 100, "fewer_threads": 0, "others_max": 1,
            "wait_share_max": 0.3}
    assert C.describe(base | {"contended": 0}) is None and C.describe(None) is None
    few = C.describe(base | {"contended": 5})
    many = C.describe(base | {"contended": 40, "fewer_threads": 40}, "verify passes")
    assert "medians stand" in few and not C.contended(base | {"contended": 5})
    assert "40 of 100 verify passes" in many and "--fresh" in many and "fewer than 2 threads" in many
    assert C.contended(base | {"contended": 40})


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_cores_refuses_a_bad_thread_count(threads):
    with pytest.raises(ValueError, match="threads"):
        Cores(threads)


def run_with_others(tiny_checkpoints, tmp_path, monkeypatch, others: int) -> tuple[int, str, dict]:
    """`run` of three rounds at n = 2 on the tiny OLMoE with `others` runnable threads elsewhere at every read."""
    monkeypatch.setattr(C, "snapshot", lambda: Snapshot(others, 0.0, time.monotonic()))
    monkeypatch.setattr(C, "attributable", lambda: True)  # the run queue is of our cores, on any test machine
    monkeypatch.setattr(R.speculative, "timed_forward", lambda *args: next(passes))
    passes = itertools.cycle([0.010, 0.011, 0.012])
    out = tmp_path / "runs.json"
    code, stdout, _ = run_cli(["--model", str(tiny_checkpoints["olmoe"]), "--depth", "8", "--n", "2", "--reps",
                               "3", "--max-reps", "3", "--no-throughput", "--dtype", "fp32", "--pin-wait", "0",
                               "--out", str(out)])
    return code, stdout, json.loads(out.read_text())


def test_a_run_beside_another_process_is_flagged_in_its_file_and_its_output(tiny_checkpoints, tmp_path,
                                                                             monkeypatch):
    code, stdout, doc = run_with_others(tiny_checkpoints, tmp_path, monkeypatch, 1)
    verify = doc["contention"]["verify"]
    assert code == 0 and verify["calls"] == 9 and verify["contended"] == 9  # 3 rounds x (slot, dedup, outside)
    assert verify["fitted"] is True
    assert doc["noise"]["per_n"]["2"]["contention"] == verify and doc["contention"]["throughput"] is None
    assert "9 of 9 verify passes" in stdout and "--fresh" in stdout
    assert C.contended(load_runs(str(tmp_path / "runs.json"))["contention"]["verify"])


def test_a_quiet_run_says_nothing_of_contention(tiny_checkpoints, tmp_path, monkeypatch):
    code, stdout, doc = run_with_others(tiny_checkpoints, tmp_path, monkeypatch, 0)
    assert code == 0 and doc["contention"]["verify"]["contended"] == 0 and "contention" not in stdout


@pytest.mark.parametrize("record, needle", [
    ({"calls": -1}, "calls"),
    ({"contended": 10}, "more contended calls"),
    ({"wait_share_max": "x"}, "wait_share_max"),
    ({"threads": 1.5}, "threads"),
])
def test_the_runs_loader_refuses_a_bad_contention_record(tiny_checkpoints, tmp_path, monkeypatch, record, needle):
    _, _, doc = run_with_others(tiny_checkpoints, tmp_path, monkeypatch, 0)
    doc["contention"]["verify"] |= record
    bad = Path(tmp_path / "bad.json")
    bad.write_text(json.dumps(doc))
    with pytest.raises(MoespecError, match=needle):
        load_runs(str(bad))


def test_a_bench_beside_another_process_is_flagged(bench_argv, tmp_path, monkeypatch, capsys):
    """Every timed call of the bench (2 layers x 3 n, their passes, 2 kernels, the probe's aside) is counted in
    bench.json's record, on one thread where one of two cores is taken, and the output says what to do."""
    monkeypatch.setattr(C, "cores", lambda: 2)
    monkeypatch.setattr(C, "attributable", lambda: True)  # a machine of 2 cores, whatever this one has
    monkeypatch.setattr(C, "snapshot", lambda: Snapshot(1, 0.0, time.monotonic()))
    threads = []
    run = bench.LayerWeights.run
    monkeypatch.setattr(bench.LayerWeights, "run", lambda self, *a: threads.append(torch.get_num_threads())
                        or run(self, *a))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert cli.main(bench_argv(tmp_path / "bench.json")) == 0
        assert torch.get_num_threads() == 2  # given back
    finally:
        torch.set_num_threads(before)
    record = load_bench(tmp_path / "bench.json")["contention"]
    assert record["calls"] > 0 and record["contended"] == record["calls"] == record["fewer_threads"]
    assert 1 in threads and "--fresh" in capsys.readouterr().out  # timed calls on 1 (the warm-up untimed, on 2)


def test_pinned_to_some_cores_the_run_queue_is_not_read(monkeypatch, two_cores):
    """On 2 of 8 cores (taskset, a container's cpuset) the machine's run queue is the host's: no fit on it and no
    flag from it; our threads' waiting alone flags a call."""
    monkeypatch.setattr(C.os, "cpu_count", lambda: 8)
    fake_snapshots(monkeypatch, [5] * 6, [0.0, 0.0, 0.0, 0.0, 0.0, 0.002])  # call 2 waited 2 ms of 10
    cores = Cores(2, fit=True)
    used, flags = [], []
    for _ in range(2):
        used.append(cores.before())
        flags.append(cores.after())
    assert used == [2, 2] and flags == [False, True] and cores.take()["others_max"] == 0


@pytest.mark.parametrize("env, want", [(None, 2), ("1", 1), ("3", 3), ("0", 2), ("two", 2), (" 1 ", 1)])
def test_default_threads_follow_omp_num_threads_else_the_cores(monkeypatch, two_cores, env, want):
    monkeypatch.setattr(C, "cores", lambda: 2)
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    assert C.default_threads() == want
