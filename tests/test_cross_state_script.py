"""benchmarks/bench_state.py and cross_state.py: the loop's state kept beside each bench, and a profile carried to a
bench's state by it, exactly on synthetic takes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_cases import load_script
from test_state_probe import LOOPY, takes

from moespec import MoespecError
from moespec.formats.devicefile import FORMAT_NAME, FORMAT_VERSION, load_profile
from moespec.formats.files import write_json
from moespec.measure.bench import BenchConfig
from moespec.measure.contention import default_threads
from moespec.measure.timing import device_name
from moespec.predict.structure_bench import predict_bench

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def cross():
    return load_script(BENCHMARKS / "cross_state.py")


@pytest.fixture(scope="module")
def state():
    return load_script(BENCHMARKS / "bench_state.py")


def profile_file(path: Path) -> Path:
    """A device.json of this machine whose bf16 rates are LOOPY's and whose check passes were taken at its own loop."""
    threads = default_threads()
    passes = [p | {"predicted_s": 0.0} for p in takes(LOOPY, 1.0, 40.0)]
    doc = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "device_kind": "cpu", "threads": threads,
           "device": f"{device_name().rsplit(',', 1)[0]}, {threads} threads", "ceiling_kind": "streaming read",
           "ceiling_gbps": 40.0, "ceiling_iqr_gbps": 1.0, "cache_bytes": 64 << 20, "cache_nominal_bytes": 64 << 20,
           "dtypes": {"bf16": LOOPY | {"matmul_peak_gflops": 500.0}},
           "self_check": {k: {"median": 0.1, "max": 0.6, "passes": 18} for k in ("slot", "dedup")},
           "protocol": {"reps": 5, "flush_bytes": 64 << 20, "timer": "perf_counter"}, "provenance": {}}
    doc["self_check_by_dtype"] = {"bf16": doc["self_check"] | {"passes": passes, "placement": None}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, doc)
    return path


def test_the_state_record_is_kept_beside_its_bench(state, tmp_path, monkeypatch):
    """A bench measured now: the probe before and after it, k their geometric mean, the record beside the bench; a
    stored bench: its record as kept, or None where it was measured without one."""
    profile = load_profile(profile_file(tmp_path / "device.json"))
    probes = iter([takes(LOOPY, 1.2, 35.0), takes(LOOPY, 1.5, 30.0)])
    monkeypatch.setattr(state, "time_probe", lambda *args, **kwargs: next(probes))
    bench = tmp_path / "olmoe" / "bench-B1.json"
    bench.parent.mkdir()
    record = state.around_bench(str(bench), profile, "bf16", lambda: bench.write_text("{}"), say=lambda _: None)
    assert record["before"]["k"] == pytest.approx(1.2, rel=1e-6) and record["after"]["k"] == pytest.approx(1.5, 1e-6)
    assert record["loop_factor"] == pytest.approx(math.sqrt(1.8), rel=1e-6)
    assert json.loads(state.state_path(str(bench)).read_text())["loop_factor"] == record["loop_factor"]
    assert state.around_bench(str(bench), profile, "bf16", lambda: pytest.fail("measured again")) == record
    other = tmp_path / "other" / "bench-B1.json"
    other.parent.mkdir()
    other.write_text("{}")
    assert state.around_bench(str(other), profile, "bf16", lambda: pytest.fail("measured")) is None


def test_a_probe_off_by_more_than_the_drift_is_outvoted_by_a_third(state, tmp_path, monkeypatch):
    """Probes before and after a bench at k = 0.34 and 1.15 (off by more than DRIFT): a third probe is taken right
    after, k is the median of the three, all three are kept and read back; sides within DRIFT take no third."""
    profile = load_profile(profile_file(tmp_path / "device.json"))
    probes = iter([takes(LOOPY, 0.34, 40.0), takes(LOOPY, 1.15, 40.0), takes(LOOPY, 1.1, 38.0)])
    monkeypatch.setattr(state, "time_probe", lambda *args, **kwargs: next(probes))
    bench = tmp_path / "olmoe" / "bench-B1.json"
    bench.parent.mkdir()
    said = []
    record = state.around_bench(str(bench), profile, "bf16", lambda: bench.write_text("{}"), say=said.append)
    assert record["loop_factor"] == pytest.approx(1.1, rel=1e-6) and record[state.AGAIN]["k"] == pytest.approx(1.1)
    assert "a third probe read 1.100, k = 1.100" in said[0]
    assert next(probes, None) is None
    assert state.read_state(str(bench)) == json.loads(json.dumps(record))
    kept = state.probes_of(state.read_state(str(bench)))
    assert list(kept) == ["before", "after", state.AGAIN]
    assert state.bracketed(profile, "bf16", kept)[0] == pytest.approx(1.1, rel=1e-6)
    assert not state.drifted({"before": {"k": 1.0}, "after": {"k": state.DRIFT}})
    assert state.drifted({"before": {"k": 1.0}, "after": {"k": state.DRIFT * 1.01}})


def test_a_profile_is_carried_to_its_benchs_state(cross, state, tmp_path, monkeypatch, capsys):
    """A run whose bench ran with the loop 1.3x the profile's (a bench predicted at k = 1.3 stands for the measured one)
    and whose probe saw 1.3 around it: predicted with the probe, every error 0; with the profile's loop, 30% or so."""
    sm = cross.structure_model
    monkeypatch.setattr(sm, "MODELS", ("olmoe-1b-7b",))
    monkeypatch.setattr(sm, "TRACES", tmp_path / "traces")
    run = tmp_path / "run-1"
    profile = profile_file(run / "device.json")
    (run / "table.json").write_text("{}")
    config = sm.configs("olmoe-1b-7b", run, "bf16", (1,))[1]
    Path(config.out).parent.mkdir(parents=True)
    predict_bench(BenchConfig(**config.__dict__), str(profile), 40.0, loop_factor=1.3)
    probe = {"probe": takes(LOOPY, 1.3, 40.0)}
    write_json(state.state_path(config.out), {"loop_factor": 1.3, "before": probe, "after": probe})
    code = cross.cross(cross.argparse.ArgumentParser(), ["--profiles", str(profile), "--runs", str(run), "--dtype",
                                                         "bf16", "--out", str(tmp_path / "out")])
    assert code == 0
    result = json.loads((tmp_path / "out" / "cross.json").read_text())
    [pairing] = result["pairings"]
    assert pairing["own"] and pairing["k"] == [pytest.approx(1.3, rel=1e-6)]
    assert all(r["max_error"] < 1e-6 for r in pairing["probed"]) and pairing["within"] == [0, 2]
    assert all(0.1 < r["median_error"] < 0.3 for r in pairing["unprobed"])
    assert "| all | | | | 0 of 2 | 2 of 2 |" in (tmp_path / "out" / "cross.md").read_text()


def test_a_broken_state_record_is_named_in_one_line(state, tmp_path):
    """A state record that is not JSON, or holds no probe on one side (or on its third), is refused naming the
    file."""
    bench = tmp_path / "bench-B1.json"
    path = state.state_path(str(bench))
    path.write_text("{not json")
    with pytest.raises(MoespecError, match="state-B1.json: not a state record"):
        state.read_state(str(bench))
    for record in ({"before": {"probe": []}, "after": {}}, {"before": {"probe": []}, "after": {"probe": []},
                                                              "again": {"k": 1.0}}):
        path.write_text(json.dumps(record))
        with pytest.raises(MoespecError, match="state-B1.json: a state record holds the probe before and after"):
            state.read_state(str(bench))
