"""README's recipe "Plan for your own model", run as written through the CLI entry point on the trained pair's target
(moespec/data/pair/target) as "your model": the local-folder chain twice, and the GGUF chain, whose llama.cpp steps
need llama-cpp-python. The commands are read from the README's two blocks, so the recipe a user copies is the one
tested; small settings are appended to each command (argparse keeps the last of a repeated flag).

The pair's target is too small to time: an expert is 24 KB (hidden 128, width 32, bf16), and our kernels reach a few
percent of the streaming-read ceiling, where fixed per-call costs set the time (moespec.formats.benchfile.too_small).
So `plan` builds on the verify-only run's measured times of both kernels (moespec.predict.measured), and two runs of
the recipe must give plans that agree: the same kernel verdict at every n and k_hat within one at every acceptance.
llama.cpp's runs time its one kernel, so the GGUF chain's plan has no measured basis and refuses in one line."""

from __future__ import annotations

import importlib.util
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from moespec.cli import main
from moespec.defaults import SAMPLE_TEXT
from moespec.formats import benchfile
from moespec.formats.benchfile import TOO_SMALL_SHARE, load_bench, too_small
from moespec.predict.verdict import SAME
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import load_runs
from moespec.formats.trace import load_trace
from moespec.model.gguf import read_gguf

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "moespec" / "data" / "pair" / "target"
HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
pytestmark = pytest.mark.skipif(not (TARGET / "model.safetensors").is_file(), reason="no trained pair")

# Small settings per step: one bench layer at n = 1..3 (kmax 2), verify passes at depth 64 for at most 1 s per n,
# a throughput grid of k = 0..2 at two acceptances, two prompts of 6 tokens per cell (the oracle's prompts take the
# acceptances in turn, so every k is decoded at both: the counted rate then has a row for whatever k_hat* the noisy
# verify times give); score and staircase print JSON.
VERIFY = ["--n", "1-3", "--depth", "64", "--reps", "5", "--max-reps", "10", "--budget", "1"]
SMALL = {"export": [], "trace": [], "report": [], "plan": ["--kmax", "2"], "score": ["--json"],
         "staircase": ["--json"],
         "bench": ["--layers", "0", "--n", "1-3", "--reps", "1", "--windows", "2", "--u-values", "2"],
         "verify": VERIFY, "run": [*VERIFY, "--k", "0-2", "--a", "0.5,0.9", "--prompts", "2", "--tokens", "6"]}
NEEDS_LLAMA = "--gguf"  # the flag of the steps that run llama.cpp itself (trace, run --engine llama.cpp)
PRINTS_JSON = ("score", "staircase")  # the steps that write no file: their --json output is read instead


def recipe(first: str) -> list[list[str]]:
    """The `moespec` command lines of README's fenced block that starts with `first` (e.g. "M="), as argv lists
    without the leading `moespec` and with the comments dropped."""
    blocks = (ROOT / "README.md").read_text(encoding="utf-8").split("```")[1::2]
    found = [b for b in blocks if b.strip().startswith(first)]
    assert len(found) == 1, f"README has {len(found)} fenced blocks starting with {first!r}, not one"
    lines = [shlex.split(line, comments=True) for line in found[0].splitlines() if line.startswith("moespec ")]
    assert lines, f"README's {first} block has no moespec command"
    return [argv[1:] for argv in lines]


def step(argv: list[str]) -> str:
    """The step's name (its key in SMALL): the command, with `run` split into the verify-only run and the planned."""
    return "verify" if argv[0] == "run" and "--no-throughput" in argv else argv[0]


def concrete(argv: list[str], names: dict[str, str], work: Path) -> list[str]:
    """argv with the block's shell variables ($M, $G) and its work folder w/ put in, and the small settings."""
    def one(arg: str) -> str:
        for name, value in names.items():
            arg = arg.replace(f"${name}", value)
        return str(work) if arg == "w" else str(work / arg[2:]) if arg.startswith("w/") else arg
    return [one(a) for a in argv] + SMALL[step(argv)]


def output(argv: list[str]) -> Path | None:
    """The file a (concrete) command line writes: its --out, report's DIR/report.html; None where it prints."""
    if argv[0] == "report":
        return Path(argv[1]) / "report.html"
    return Path(argv[argv.index("--out") + 1]) if "--out" in argv else None


def check_output(path: Path) -> None:
    """The file exists and loads with the loader of its kind (each validates its format)."""
    assert path.is_file(), f"{path} was not written"
    if path.suffix == ".npz":  # the recipe gives no text: the sample's six documents
        trace = load_trace(path)
        assert trace.meta["source"].startswith(f"{SAMPLE_TEXT.name}:") and trace.num_documents == 6, trace.meta
    elif path.suffix == ".gguf":
        assert read_gguf(str(path)).spec.m == 8
    elif path.name == "bench.json":
        assert set(load_bench(path)["r"]) == {"1", "2", "3"}
    elif path.name == "plan.json":
        assert set(load_plan(path)["kernel_by_n"]) == {"1", "2", "3"}
    elif path.name.startswith("runs"):
        times = load_runs(path)["verify_time_s"]  # slot and dedup; llama.cpp's one kernel, dedup
        assert "dedup" in times and all(set(t) == {"1", "2", "3"} for t in times.values()), times
    else:
        assert path.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")


@dataclass
class Outcome:
    """What a recipe run did: the steps that ran (their files written and loading), the steps refused (exit 2) with
    their one line, the steps not run (llama.cpp absent, or an input a refused or skipped step would have written),
    and the JSON the printing steps printed."""

    ran: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    printed: dict[str, dict] = field(default_factory=dict)


def run_recipe(first: str, names: dict[str, str], work: Path, capsys) -> Outcome:
    """Run README's block `first` in `work`, each command through the entry point."""
    done = Outcome()
    for argv in recipe(first):
        argv, name = concrete(argv, names, work), step(argv)
        reads = [Path(a) for a in argv[1:] if a.startswith(str(work)) and Path(a) != output(argv)]
        if (NEEDS_LLAMA in argv and not HAVE_LLAMA) or not all(path.exists() for path in reads):
            done.skipped.append(name)
            continue
        code = main(argv)
        out, err = capsys.readouterr()
        if code == 2:
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
            done.refused[name] = err.strip()
            continue
        assert code == 0, (argv, err[-2000:])
        if name in PRINTS_JSON:
            done.printed[name] = json.loads(out)
        else:
            check_output(output(argv))
        done.ran.append(name)
    return done


def k_star(staircase: dict) -> dict[float, int]:
    """acceptance -> k*(a) of `staircase --json`."""
    return {row["a"]: row["k_star"] for row in staircase["table"]}


def verdict_of(plan_path: Path) -> tuple[dict[int, str], dict[float, int]]:
    """A plan's verdict: n -> the kernel (dedup, per-slot or no measurable difference), a -> the draft length."""
    verdict = load_plan(plan_path)["verdict"]
    return ({row["n"]: row["choice"] for row in verdict["kernel_by_n"]},
            {row["a"]: row["k"] for row in verdict["draft"] if row["a"] is not None})


@pytest.mark.slow
def test_the_recipe_on_the_trained_pair_twice_agrees(tmp_path, capsys):
    """Every step of the block runs and writes a file that loads (or prints its JSON); the bench is too small to
    time, so the plan stands on the verify-only run's measured times and says so; two runs of the recipe give plans
    whose kernel verdicts never oppose each other and whose draft lengths are within one at every acceptance."""
    outcomes = {work: run_recipe("M=", {"M": str(TARGET)}, tmp_path / work, capsys) for work in ("one", "two")}
    for work, done in outcomes.items():
        assert done.ran == ["trace", "bench", "verify", "plan", "run", "score", "staircase", "report"], (work, done)
        assert not done.refused and not done.skipped, (work, done)
        small = too_small(load_bench(tmp_path / work / "bench.json"))
        assert small["flag"] and small["share_of_ceiling"] < TOO_SMALL_SHARE, (work, small)
        plan = load_plan(tmp_path / work / "plan.json")
        title = " ".join(plan["verdict"]["lines"][:2])  # the title, wrapped at 100 columns
        assert plan["basis"]["kind"] == "runs" and "too small to time" in title, plan["basis"]
    (k1, d1), (k2, d2) = (verdict_of(tmp_path / work / "plan.json") for work in ("one", "two"))
    # never opposite kernels: a verdict of one run is the other's, or one of them found no measurable difference
    # (an interval that a noisy host widens to include 0 in one run and not in the other)
    assert set(k1) == set(k2) == {2, 3} and all(k1[n] == k2[n] or SAME in (k1[n], k2[n]) for n in k1), (k1, k2)
    assert d1.keys() == d2.keys() and d1 and all(abs(d1[a] - d2[a]) <= 1 for a in d1), (d1, d2)
    assert all(k_star(done.printed["staircase"]) for done in outcomes.values())


@pytest.mark.slow
@pytest.mark.parametrize("share", [None, 0.0], ids=["as-measured", "never-too-small"])
def test_the_gguf_recipe(tmp_path, capsys, monkeypatch, share):
    """The GGUF block: export and bench run here; trace --gguf and the llama.cpp runs need llama-cpp-python (without
    it the bench reads the folder's trace: llama.cpp routes as transformers does, tests/test_llama_tracer.py). The
    bench of the pair's target is too small to time and llama.cpp's runs time dedup alone, so plan refuses in one
    line naming the verify-only runs of both kernels it would stand on; a host where the bench is not flagged plans
    on it, and the run, score and report that follow take llama.cpp's one kernel (forced here by a share of 0), or
    refuses it in one line where its times fall below the one-token pass."""
    if share is not None:
        monkeypatch.setattr(benchfile, "TOO_SMALL_SHARE", share)
        monkeypatch.setattr(benchfile, "TOO_SMALL_FLOOR", share)
    work, names = tmp_path / "w", {"M": str(TARGET), "G": str(tmp_path / "target.gguf")}
    if not HAVE_LLAMA:
        assert main(concrete(["trace", "--model", "$M", "--out", "w/trace.npz"], names, work)) == 0
    done = run_recipe("G=", names, work, capsys)
    if not HAVE_LLAMA:
        assert done.ran == ["export", "bench", "report"] and not done.refused, done
        pytest.skip(f"llama-cpp-python is not installed: ran export, bench and report; not {', '.join(done.skipped)}")
    small = too_small(load_bench(work / "bench.json"))
    assert share is None or not small["flag"], small  # forced: the fits (eps) stand, so the share alone decided
    if not small["flag"] and "plan" in done.ran:
        assert done.ran == ["export", "trace", "bench", "verify", "plan", "run", "score", "staircase", "report"], done
        assert not done.refused, done
        return
    if not small["flag"]:  # a bench this small can fall faster from n = 1 than llama.cpp's one-token pass takes
        assert list(done.refused) == ["plan"] and "a predicted verify time is not positive" in done.refused["plan"]
        return
    assert done.ran == ["export", "trace", "bench", "verify", "staircase", "report"], done
    assert list(done.refused) == ["plan"] and "too small to time" in done.refused["plan"], done
    assert "--no-throughput" in done.refused["plan"], done
