"""Lost work (issue 14, class 6, and the interrupt of class 7): a rerun resumes OUT.partial/ by default and refuses
other settings in one line; a resumed run draws what a clean run draws; list options are compared normalized; an
interrupt says how to resume; a second writer of the same output is refused; the demo checks all its steps first."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_cases import contents as snapshot
from cli_cases import one_line
from cli_cases import run_cli as main

from moespec import MoespecError, cli
from moespec.demo import DemoConfig, step_settings
from moespec.formats.checkpoint import Checkpoint
from moespec.formats.demofile import Steps
from moespec.formats.lock import lock_file
from moespec.measure import bench, rounds
from moespec.measure.run import RunConfig, run_engine
from moespec.model import speculative

SYNTH = ["synth", "--model", "olmoe-1b-7b", "--process", "uniform", "--tokens", "200", "--docs", "2"]
RUN = ["run", "--depth", "8", "--reps", "2", "--max-reps", "2", "--no-throughput", "--dtype", "fp32"]






# ---- resuming --------------------------------------------------------------------------------------------
def test_an_interrupted_bench_says_how_to_resume_and_a_plain_rerun_resumes(bench_argv, tmp_path, bench_stopper):
    out = tmp_path / "bench.json"
    code, err = main(bench_argv(out))
    assert code == 130 and not out.exists() and len(bench_stopper.timed) == 1
    one_line(err, "interrupted", f"{out}.partial", "rerun the same command to resume")
    bench_stopper.resume()
    bench_stopper.timed.clear()
    assert main(bench_argv(out))[0] == 0  # no flag: the finished round is kept
    assert len(bench_stopper.timed) == 2 - 1 and not Path(f"{out}.partial").exists() and not lock_file(out).exists()


def test_a_resumed_run_draws_what_a_clean_run_draws(tiny_checkpoints, tmp_path, monkeypatch):
    """Interrupted in its second verify round and resumed with its lists in another order: the first round is
    kept, not measured again, and the second times the same random tokens as a clean run with the seed."""
    model = ["--model", str(tiny_checkpoints["olmoe"])]
    monkeypatch.setattr(rounds, "DISTURBED", 0.0)  # no round repeated: the run times exactly --max-reps rounds
    timed = speculative.timed_forward
    seen: list[tuple] = []

    def record(model, tokens, state):
        seen.append(tuple(tokens))
        return timed(model, tokens, state)

    monkeypatch.setattr(speculative, "timed_forward", record)
    assert main([*RUN, *model, "--n", "1,2,3", "--a", "0.5,0.9", "--out", str(tmp_path / "clean.json")])[0] == 0
    policies, sizes = 3, 3  # slot, dedup, outside; n = 1, 2, 3
    warm, per_round = policies * sizes, policies * sizes
    clean, seen = seen, []
    assert len(clean) == warm + 2 * per_round

    def interrupt_in_round_two(model, tokens, state):
        if len(seen) == warm + per_round + 1:
            raise KeyboardInterrupt
        return record(model, tokens, state)

    out = tmp_path / "runs.json"
    monkeypatch.setattr(speculative, "timed_forward", interrupt_in_round_two)
    code, err = main([*RUN, *model, "--n", "1,2,3", "--a", "0.9,0.5", "--out", str(out)])
    assert code == 130 and not out.exists()
    one_line(err, f"{out}.partial", "rerun the same command to resume")
    seen = []
    monkeypatch.setattr(speculative, "timed_forward", record)
    assert main([*RUN, *model, "--n", "3,2,1", "--a", "0.9,0.5", "--out", str(out)])[0] == 0
    assert len(seen) == warm + per_round  # the warm-up and round two: round one was kept
    assert sorted(seen[warm:]) == sorted(clean[warm + per_round:])  # round two's tokens, as in the clean run
    assert sorted(json.loads(out.read_text())["verify_time_s"]["slot"]) == ["1", "2", "3"]


def test_other_settings_are_refused_in_one_line_and_fresh_starts_over(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "runs.json"
    Checkpoint(out, {"reps": 9}, "run")  # an interrupted run of other settings
    before = snapshot(tmp_path)
    argv = [*RUN, "--model", str(tiny_checkpoints["olmoe"]), "--n", "1", "--out", str(out)]
    for extra in ([], ["--resume"]):
        code, err = main(argv + extra)
        assert code == 2 and snapshot(tmp_path) == before
        one_line(err, f"{out}.partial", "made with other settings", "--fresh")
    with pytest.raises(SystemExit) as stop:
        cli.main([*argv, "--fresh", "--resume"])
    assert stop.value.code == 2 and "not allowed with" in capsys.readouterr().err and snapshot(tmp_path) == before
    assert main([*argv, "--fresh"])[0] == 0
    assert out.exists() and not Path(f"{out}.partial").exists()


# ---- one writer at a time --------------------------------------------------------------------------------
@contextlib.contextmanager
def held_elsewhere(out: Path):
    """The lock on `out` held through a descriptor of its own, as another process would hold it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file(out), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)


COMMANDS = {  # command -> (argv, the output it locks)
    "synth": lambda d, _: ([*SYNTH, "--out", str(d / "t.npz")], d / "t.npz"),
    "bench": lambda d, argv: (argv(d / "b.json"), d / "b.json"),
    "run": lambda d, _: ([*RUN, "--out", str(d / "r.json")], d / "r.json"),
    "plan": lambda d, _: (["plan", "--bench", "b.json", "--trace", "t.npz", "--tau1", "0.01", "--out",
                           str(d / "p.json")], d / "p.json"),
    "trace": lambda d, _: (["trace", "--model", "m", "--text", "x.txt", "--out", str(d / "t.npz")], d / "t.npz"),
    "reuse": lambda d, _: (["reuse", "t.npz", "--plot", str(d / "f.png")], d / "f.png"),
    "demo": lambda d, _: (["demo", "--out", str(d / "demo")], d / "demo" / "demo.json"),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_second_writer_is_refused_in_one_line(command, bench_argv, tmp_path, work_started):
    argv, locked = COMMANDS[command](tmp_path, bench_argv)
    with held_elsewhere(locked):
        before = snapshot(tmp_path)
        code, err = main(argv)
        assert code == 2 and work_started == []  # before any work
        one_line(err, str(locked), "another moespec process is writing it")
        assert snapshot(tmp_path) == before and lock_file(locked).exists()  # the holder's lock file stays


def test_report_and_the_api_refuse_a_second_writer(bench_model, tmp_path):
    page = tmp_path / "report.html"
    with held_elsewhere(page):
        code, err = main(["report", str(bench_model["trace"].parent), "--out", str(page)])
        assert code == 2 and not page.exists()
        one_line(err, str(page), "another moespec process")
    out = tmp_path / "runs.json"
    with held_elsewhere(out), pytest.raises(MoespecError, match="another moespec process is writing it"):
        run_engine(RunConfig(out=str(out)))
    assert not out.exists()


def test_a_lock_held_by_another_process(tmp_path):
    out = tmp_path / "t.npz"
    script = (f"import sys; from moespec.formats.lock import locked\n"
              f"with locked({str(out)!r}, 'x'):\n print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", script],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    try:
        assert holder.stdout.readline().strip() == "held"
        code, err = main([*SYNTH, "--out", str(out)])
        assert code == 2 and not out.exists()
        one_line(err, f"--out {out}", "another moespec process is writing it")
    finally:
        holder.communicate("")
    assert not lock_file(out).exists()  # the holder removed its lock file on release


def test_the_lock_file_goes_and_a_stale_one_is_harmless(tmp_path):
    out = tmp_path / "new" / "t.npz"
    assert main([*SYNTH, "--out", str(out)])[0] == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["t.npz"]
    lock_file(out).write_text("")  # left by a killed process: nobody holds it
    assert main([*SYNTH, "--out", str(out)])[0] == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["t.npz"]
    code, err = main([*SYNTH, "--docs", "500", "--out", str(tmp_path / "made" / "t.npz")])
    assert code == 2 and not (tmp_path / "made").exists()  # a refused job leaves no folder it made
    one_line(err, "docs", "500")


# ---- the demo checks every step first --------------------------------------------------------------------
@pytest.mark.parametrize("args, flag", [(["--engine-layers", "99"], "--engine-layers"), (["--kmax", "9"], "--kmax"),
                                        (["--depth", "0"], "--depth")])
def test_the_demo_checks_every_step_before_writing(args, flag, tmp_path):
    out = tmp_path / "demo"
    code, err = main(["demo", "--tokens", "500", "--docs", "5", "--out", str(out), *args])
    assert code == 2 and not out.exists()
    one_line(err, flag)


def test_the_run_normalizes_acceptances():
    assert RunConfig(a=(0.9, 0.5, 0.9)).acceptances == RunConfig(a=(0.5, 0.9)).acceptances == [0.5, 0.9]


def test_demo_steps_of_other_code_are_measured_again(tmp_path):
    settings = step_settings(DemoConfig(out=str(tmp_path)))
    assert settings["code"]["moespec"] and "git" in settings["code"]  # the code that measured is part of them
    ran = []
    Steps(tmp_path, settings, print).run(tmp_path / "a.json", lambda: (tmp_path / "a.json").write_text("{}"))
    Steps(tmp_path, settings, ran.append).run(tmp_path / "a.json", lambda: ran.append("measured"))
    assert ran and ran[0].startswith("reusing")  # same settings and code: reused
    other = settings | {"code": {"moespec": "0.0.0", "git": None}}
    Steps(tmp_path, other, print).run(tmp_path / "a.json", lambda: ran.append("measured"))
    assert ran[-1] == "measured"  # other code: measured again
