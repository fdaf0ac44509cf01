"""Hostile files and streams (issue 31): every parse failure of a JSON input, every failed write of a result or of
stdout, an output that is one of the command's inputs, a FIFO or a file where a folder is expected: each ends with
exit code 2 and one line on stderr, no traceback, no file created or changed; hangs are guarded by timeouts."""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_cases import one_line, refused
from plan_cases import make_bench, make_runs, uniform_trace

from moespec import MoespecError, cli
from moespec.formats.files import check_apart, field, is_number, write_json
from moespec.routing.documents import read_jsonl

MOESPEC = str(Path(sys.executable).parent / "moespec")
TIMEOUT = 300  # seconds before a command that should have ended at once counts as hung
SYNTH = ["synth", "--model", "olmoe-1b-7b", "--process", "uniform", "--tokens", "200", "--docs", "2"]
STAIRCASE = ["staircase", "--step-times", "1,1.1,1.2,1.3,1.4"]


def moespec(argv: list, cwd: Path, before: str = "", after: str = "",
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`moespec argv` in a fresh bash in `cwd`, between the shell text `before` (a ulimit, a cd) and `after` (a
    redirection), its output captured."""
    command = " ".join([before, shlex.join([MOESPEC, *map(str, argv)]), after])
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, **(env or {})})


def one_line_exit_2(done: subprocess.CompletedProcess) -> str:
    """The one stderr line of a command that ended with exit code 2 and no traceback."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    return one_line(done.stderr)


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Path]:
    """Valid inputs (bench, trace, runs), a FIFO, and a folder standing in for a checkpoint."""
    write_json(tmp_path / "bench.json", make_bench())
    uniform_trace().save(tmp_path / "trace.npz")
    write_json(tmp_path / "runs.json", make_runs())
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"weights")
    return {"bench": tmp_path / "bench.json", "trace": tmp_path / "trace.npz", "runs": tmp_path / "runs.json",
            "fifo": tmp_path / "fifo", "ckpt": tmp_path / "ckpt"}


# ---- 1. the one JSON reader --------------------------------------------------------------------------------------
NOT_JSON = {  # file contents -> what the one line says
    "nested": (b"[" * 100_000 + b"]" * 100_000, "not readable JSON"),
    "nested within the recursion limit": (b"[" * 900 + b"]" * 900, "nested deeper than"),
    "5000 digits": (b'{"a": ' + b"1" * 5000 + b"}", "not readable JSON"),
    "gguf": (b"GGUF\x03\x00\x00\x00" + bytes(64), "a GGUF file, not JSON"),
    "npz": (b"PK\x03\x04" + bytes(64), "a zip archive"),
    "safetensors": (len(b'{"w": {}}').to_bytes(8, "little") + b'{"w": {}}', "a safetensors file, not JSON"),
    "binary": (bytes(range(256)), "a binary file, not JSON"),
    "latin-1": ('{"a": "é"}'.encode("latin-1"), "not readable JSON"),
}


@pytest.mark.parametrize("case", NOT_JSON)
def test_a_json_input_that_is_not_json_is_one_line_naming_the_file(case, job, tmp_path, capsys):
    raw, said = NOT_JSON[case]
    bad = tmp_path / "bad.json"
    bad.write_bytes(raw)
    for argv in (["plan", "--bench", bad, "--trace", job["trace"], "--tau1", "0.1"],
                 ["score", "--plan", bad, "--runs", job["runs"]], ["staircase", "--runs", bad]):
        err = refused(argv, capsys, tmp_path)
        assert f"{bad}: " in err and said in err


@pytest.mark.parametrize("case", ["nested", "5000 digits", "gguf"])
def test_a_config_or_jsonl_that_is_not_json_is_one_line(case, tmp_path, capsys):
    raw, said = NOT_JSON[case]
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_bytes(raw)
    assert said in refused(["spec", tmp_path / "ckpt"], capsys, tmp_path)
    (tmp_path / "docs.jsonl").write_bytes(b'{"text": "a"}\n' + raw + b"\n")
    with pytest.raises(MoespecError, match=f"docs.jsonl:2: .*{said}"):
        read_jsonl(tmp_path / "docs.jsonl", "text")


def test_numbers_past_a_floats_range_are_not_numbers():
    assert not is_number(10**400) and not is_number(-(10**400)) and is_number(10**99)
    with pytest.raises(MoespecError, match="a.b has the wrong type or value"):
        field({"a": {"b": 10**400}}, "x.json", "a.b")


# ---- 2. the one writer ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [errno.EPERM, errno.ENOSPC, errno.EFBIG, errno.EIO, errno.EROFS])
def test_every_failed_write_is_one_line_naming_the_file(code, tmp_path, capsys, monkeypatch):
    """The rename onto the target refused (EPERM: an immutable file), the disk full, the file too large: the
    target as it was, no temporary file left."""
    out = tmp_path / "t.npz"
    out.write_bytes(b"old")

    def refuse(*args):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("moespec.formats.files.os.replace", refuse)
    err = refused([*SYNTH, "--out", out], capsys, tmp_path)
    assert f"{out}: cannot write it (" in err
    assert out.read_bytes() == b"old"


def test_names_too_long_or_ending_in_a_slash_are_refused_and_long_ones_written(tmp_path, capsys):
    assert "file name too long" in refused([*SYNTH, "--out", tmp_path / ("x" * 300 + ".npz")], capsys, tmp_path)
    assert "ends in a slash" in refused([*SYNTH, "--out", f"{tmp_path / 'newdir'}/"], capsys, tmp_path)
    longest = tmp_path / ("y" * 240 + ".json")  # its temporary and lock files' names must fit in 255 bytes too
    write_json(longest, {"a": 1})
    assert longest.read_text() == '{\n "a": 1\n}\n' and [p.name for p in tmp_path.iterdir()] == [longest.name]


def test_a_file_too_large_for_the_limit_is_one_line(tmp_path):
    done = moespec([*SYNTH[:-4], "--tokens", "20000", "--docs", "2", "--out", "t.npz"], tmp_path, "ulimit -f 8;")
    assert "t.npz: cannot write it (file too large)" in one_line_exit_2(done)
    assert list(tmp_path.iterdir()) == []


def test_a_deleted_working_folder_is_one_line(tmp_path):
    (tmp_path / "gone").mkdir()
    done = moespec([*SYNTH, "--out", "t.npz"], tmp_path, "cd gone && rmdir ../gone &&")
    assert "the working folder no longer exists" in one_line_exit_2(done)
    assert list(tmp_path.iterdir()) == []


def test_export_on_a_full_disk_is_one_line(tiny_checkpoints, tmp_path, capsys, monkeypatch):
    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("moespec.formats.files.os.replace", full)
    err = refused(["export", "--model", tiny_checkpoints["mixtral"], "--out", tmp_path / "m.gguf"], capsys, tmp_path)
    assert "m.gguf: cannot write it (no space left on the device)" in err


# ---- 3. stdout ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [STAIRCASE, [*STAIRCASE, "--json"], ["spec", "--list"]])
def test_a_full_stdout_is_one_line_and_exit_2(argv, tmp_path):
    done = moespec(argv, tmp_path, after="> /dev/full")
    assert "stdout: cannot write the output (no space left on the device)" in one_line_exit_2(done)


def test_a_failed_flush_in_process_is_one_line(capsys, monkeypatch):
    class Failing:
        encoding, errors = "utf-8", "strict"

        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(sys, "stdout", Failing())
    assert cli.main([*STAIRCASE, "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "moespec staircase: error: stdout: cannot write the output (input/output error)"


def test_a_closed_pipe_stays_quiet(tmp_path):
    done = moespec(["spec", "--list"], tmp_path, after="| head -c 1 > /dev/null; exit ${PIPESTATUS[0]}")
    assert done.returncode in (0, 141) and done.stderr == ""  # 0: all of it fit in the pipe before head left


def test_an_ascii_stdout_gets_escapes_not_a_traceback(tmp_path):
    done = moespec([*SYNTH, "--out", "tracé.npz"], tmp_path, env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "trac\\xe9.npz" in done.stdout and (tmp_path / "tracé.npz").is_file()


# ---- 4. no output is an input ------------------------------------------------------------------------------------
def _argv(job: dict[str, Path], tmp_path: Path) -> dict[str, list]:
    """command -> a command line whose output (last argument) is one of its inputs."""
    (tmp_path / "copy.png").write_bytes(job["trace"].read_bytes())
    (tmp_path / "notes.txt").write_text("= A =\nsome text\n")
    return {
        "plan": ["plan", "--bench", job["bench"], "--trace", job["trace"], "--tau1", "0.1", "--out", job["bench"]],
        "plan trace": ["plan", "--bench", job["bench"], "--trace", job["trace"], "--tau1", "0.1", "--out",
                       job["trace"]],
        "plan draft-time": ["plan", "--bench", job["bench"], "--trace", job["trace"], "--tau1", "0.1",
                            "--draft-time", job["runs"], "--out", job["runs"]],
        "run plan": ["run", "--plan", job["runs"], "--out", job["runs"]],
        "run checkpoint": ["run", "--model", job["ckpt"], "--out", job["ckpt"] / "config.json"],
        "run replay": ["run", "--replay", job["trace"], "--out", job["trace"]],
        "bench trace": ["bench", "--trace", job["trace"], "--out", job["trace"]],
        "bench plot": ["bench", "--out", tmp_path / "b.png", "--plot", tmp_path / "b.png"],
        "trace text": ["trace", "--model", job["ckpt"], "--text", tmp_path / "notes.txt", "--out",
                       tmp_path / "notes.txt"],
        "trace weights": ["trace", "--model", job["ckpt"], "--out", job["ckpt"] / "model.safetensors"],
        "reuse": ["reuse", tmp_path / "copy.png", "--plot", tmp_path / "copy.png"],
        "export": ["export", "--model", job["ckpt"], "--out", job["ckpt"] / "model.safetensors"],
        "synth": ["synth", "--fit", job["trace"], "--out", job["trace"]],
        "report": ["report", tmp_path, "--out", job["bench"]],
    }


CASES = ["plan", "plan trace", "plan draft-time", "run plan", "run checkpoint", "run replay", "bench trace",
         "bench plot", "trace text", "trace weights", "reuse", "export", "synth", "report"]


@pytest.mark.parametrize("case", CASES)
def test_an_output_that_is_an_input_is_refused_before_any_work(case, job, tmp_path, capsys, work_started):
    argv = _argv(job, tmp_path)[case]
    err = refused(argv, capsys, tmp_path)
    assert f"{argv[-2]} {argv[-1]}: the same file as " in err, err
    assert work_started == []


@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_an_input_under_another_name_is_still_the_output(link, job, tmp_path, capsys):
    other = tmp_path / "other.json"
    (other.symlink_to if link == "symlink" else other.hardlink_to)(job["bench"])
    err = refused(["plan", "--bench", other, "--trace", job["trace"], "--tau1", "0.1", "--out", job["bench"]],
                  capsys, tmp_path)
    assert f"the same file as --bench {other}" in err


def test_outputs_beside_inputs_are_kept(job, tmp_path):
    """What a command does not read is no input: a GGUF export beside a checkpoint's files, a report in DIR."""
    check_apart({"--out": job["ckpt"] / "model.gguf"}, {"--model": [job["ckpt"] / "config.json"]})
    check_apart({"--out": tmp_path / "plan.json"}, {"--bench": [job["bench"]], "--trace": [job["trace"]]})
    with pytest.raises(MoespecError, match="--plot p.png: the same file as --out p.png"):
        check_apart({"--out": "p.png", "--plot": "p.png"}, {})


# ---- 5. FIFOs and folders ------------------------------------------------------------------------------------------
def test_a_fifo_text_is_refused_not_read(job, tmp_path):
    done = moespec(["trace", "--model", job["ckpt"], "--text", job["fifo"], "--out", "t.npz"], tmp_path)
    assert f"{job['fifo']}: not a regular file" in one_line_exit_2(done)
    assert not (tmp_path / "t.npz").exists()


@pytest.mark.parametrize("argv, said", [
    (["spec", "FIFO"], "not a regular file"), (["bench", "--model", "FIFO"], "not a regular file"),
    (["spec", "FIFO.gguf"], "not a regular file"),
    (["run", "--model", "FIFO", "--no-throughput", "--out", "OUT"], "not a folder")])
def test_a_fifo_model_is_named_for_what_it_is(argv, said, job, tmp_path, capsys):
    for name in ("FIFO", "FIFO.gguf"):
        os.mkfifo(tmp_path / name)
    err = refused([tmp_path / ("r.json" if a == "OUT" else a) if a in ("FIFO", "FIFO.gguf", "OUT") else a
                   for a in argv], capsys, tmp_path)
    assert said in err and "no such" not in err


def test_a_report_of_a_file_says_it_is_not_a_folder(job, tmp_path, capsys):
    err = refused(["report", job["bench"]], capsys, tmp_path)
    assert err.endswith(f"{job['bench']}: not a folder; give the folder of a job's artifacts")
