"""A profile fitted again from the calls its device.json records (moespec.measure.profile_refit, `moespec profile
--refit`): the same calls give the same profile, exactly; the rates come from the calls, not from the file's rates;
the loader refuses a damaged record in one line; the CLI refits without timing and refuses what would time."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from cli_cases import one_line, refused
from tiny_profile import make_tiny

from moespec import MoespecError, cli
from moespec.formats.devicefile import load_profile
from moespec.kernels import KERNELS
from moespec.measure import device_profile, profile_refit

FITTED = ("dtypes", "cache_bytes", "cache_probe", "self_check", "self_check_by_dtype")  # what a refit writes anew


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny profiles, timed once for the module: our kernels at bf16 and, where ggml-python is installed, ggml's pair
    at q8_0."""
    patch, folder, out = pytest.MonkeyPatch(), tmp_path_factory.mktemp("profiles"), {}
    try:
        make_tiny(patch)
        for dtype in ("bf16", "q8_0") if "ggml-mul_mat_id" in KERNELS else ("bf16",):
            out[dtype] = folder / f"{dtype}.json"
            device_profile.run_profile(device_profile.ProfileConfig(out=str(out[dtype]), dtypes=(dtype,), reps=2))
    finally:
        patch.undo()
    return out


@pytest.mark.parametrize("dtype", ["bf16", "q8_0"])
def test_the_recorded_calls_give_the_same_profile(recorded: dict[str, Path], dtype: str) -> None:
    """Every call the fit read is recorded (rate, overhead, check and probe passes), and fitting them again gives
    the timing run's rates, cache and self-check to the last digit."""
    if dtype not in recorded:
        pytest.skip("ggml-python is not installed")
    doc = load_profile(recorded[dtype])
    kinds = {call["key"][0] for call in doc["calls"][dtype]}
    assert kinds == {"cold", "hot", "overhead", "check", "cache"}
    again = profile_refit.refit(doc)
    assert {k: again[k] for k in FITTED} == {k: doc[k] for k in FITTED}
    assert again["refit"]["command"] and "refit" not in doc


def test_the_rates_come_from_the_calls(recorded: dict[str, Path]) -> None:
    """A file whose rates were altered is fitted back to the calls' rates; altering a call's times moves them: cold
    calls three times as long make a cold pass of the ramp's W bytes cost more at every G (W x_G + F_G: the fit may
    put the added time in the loop's excess or in the pass's first bytes)."""
    doc = dict(load_profile(recorded["bf16"]))
    altered = copy.deepcopy(doc)
    altered["dtypes"]["bf16"]["cold_excess_s_per_byte"] = [0.0] * 3
    assert profile_refit.refit(altered)["dtypes"] == doc["dtypes"]
    for call in altered["calls"]["bf16"]:
        if call["key"][0] == "cold":
            call["seconds"] = [3 * s for s in call["seconds"]]

    def cold_pass(entry: dict) -> list[float]:
        ramp = entry.get("cold_ramp_s") or [0.0] * len(entry["G"])
        w = entry.get("cold_ramp_bytes") or 1.0  # without a ramp, the excess alone
        return [w * x + f for x, f in zip(entry["cold_excess_s_per_byte"], ramp)]
    slower = cold_pass(profile_refit.refit(altered)["dtypes"]["bf16"])
    assert all(s > x for s, x in zip(slower, cold_pass(doc["dtypes"]["bf16"])))


def test_a_profile_without_calls_cannot_be_refitted(recorded: dict[str, Path]) -> None:
    doc = dict(load_profile(recorded["bf16"]))
    del doc["calls"]
    with pytest.raises(MoespecError, match="records no timed calls"):
        profile_refit.refit(doc)


@pytest.mark.parametrize("damage, words", [
    (lambda c: c.update(calls={"fp32": c["calls"]["bf16"]}), "calls must be an object keyed by the profile's"),
    (lambda c: c["calls"]["bf16"][0].update(key=["warm"]), "key must be a list starting with one of"),
    (lambda c: c["calls"]["bf16"][0].update(seconds=[-1.0]), "seconds must list positive numbers"),
    (lambda c: c["calls"]["bf16"][0].update(bytes=0), "bytes and rows must be whole numbers"),
    (lambda c: next(x for x in c["calls"]["bf16"] if x["key"][0] == "cold").update(ceilings=[1.0]),
     "ceilings must list one positive number per call"),
    (lambda c: next(x for x in c["calls"]["bf16"] if x["key"][0] == "check").update(info=[[1, 1, 2, 3]]),
     "does not fit a check call"),
    (lambda c: next(x for x in c["calls"]["bf16"] if x["key"][0] == "overhead").update(info=[8]),
     "does not fit a overhead call"),
    (lambda c: next(x for x in c["calls"]["bf16"] if x["key"][0] == "cold").update(info=2.5),
     "does not fit a cold call")])
def test_the_loader_refuses_a_damaged_record(recorded: dict[str, Path], tmp_path: Path, damage, words: str) -> None:
    doc = json.loads(recorded["bf16"].read_text())
    damage(doc)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(MoespecError, match=r"bad.json: .*" + words):
        load_profile(tmp_path / "bad.json")


def test_cli_refits_without_timing(recorded: dict[str, Path], tmp_path: Path, capsys) -> None:
    """`moespec profile --refit FILE --out NEW`: exit 0, NEW loads with the refit's provenance and the same rates,
    and the console says what was fitted."""
    out = tmp_path / "again.json"
    assert cli.main(["profile", "--refit", str(recorded["bf16"]), "--out", str(out)]) == 0
    again, doc = load_profile(out), load_profile(recorded["bf16"])
    assert again["dtypes"] == doc["dtypes"] and again["refit"]["timestamp"]
    assert "calls fitted again" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("extra, words", [(["--dtypes", "q8_0"], ["--refit times nothing", "--dtypes"]),
                                          (["--reps", "3", "--pin-wait", "5"], ["--reps", "--pin-wait"])])
def test_cli_refit_refuses_timing_flags(recorded: dict[str, Path], tmp_path: Path, capsys, extra: list[str],
                                        words: list[str]) -> None:
    one_line(refused(["profile", "--refit", recorded["bf16"], "--out", tmp_path / "d.json", *extra], capsys,
                     tmp_path), *words)
    assert not (tmp_path / "d.json").exists()


def test_cli_refit_refuses_its_own_file_as_out(recorded: dict[str, Path], tmp_path: Path, capsys) -> None:
    mine = tmp_path / "mine.json"
    mine.write_bytes(recorded["bf16"].read_bytes())
    one_line(refused(["profile", "--refit", mine, "--out", mine], capsys, tmp_path), "--out")
    assert load_profile(mine)["dtypes"] == load_profile(recorded["bf16"])["dtypes"]


def test_cli_refit_of_a_profile_without_calls(recorded: dict[str, Path], tmp_path: Path, capsys) -> None:
    doc = json.loads(recorded["bf16"].read_text())
    del doc["calls"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    one_line(refused(["profile", "--refit", tmp_path / "old.json", "--out", tmp_path / "d.json"], capsys, tmp_path),
             "old.json:", "records no timed calls")
