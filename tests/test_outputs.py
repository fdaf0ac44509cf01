"""Output paths: every command refuses, before any work, an --out it must not write (a directory, a FIFO, a
symlink, an empty name); writes are atomic and get the user's umask. Device nodes are stood in for by a FIFO and a
symlink in a temp folder, never by /dev."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from moespec import MoespecError, cli
from moespec.formats.files import atomic_write, check_output, write_json

SYNTH = ["synth", "--model", "olmoe-1b-7b", "--process", "uniform", "--tokens", "200", "--docs", "2"]


@pytest.fixture
def targets(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    link = tmp_path / "a-link"
    link.symlink_to(kept)
    return {"directory": folder, "not a regular file": fifo, "symlink": link}


@pytest.mark.parametrize("kind", ["directory", "not a regular file", "symlink"])
@pytest.mark.parametrize("argv", [SYNTH, ["bench", "--n", "1"], ["run", "--no-throughput"]])
def test_a_bad_out_is_one_line_before_any_work(argv, kind, targets, capsys, work_started):
    target = targets[kind]
    before = {p: (p.lstat().st_mode, p.lstat().st_mtime_ns) for p in target.parent.iterdir()}
    assert cli.main([*argv, "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert kind in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert work_started == []  # refused before the bench times, the engine loads or the demo runs
    assert {p: (p.lstat().st_mode, p.lstat().st_mtime_ns) for p in target.parent.iterdir()} == before


@pytest.mark.parametrize("kind", ["not a regular file", "symlink"])
def test_the_demo_folder_must_be_a_folder(kind, targets, capsys, work_started):
    assert cli.main(["demo", "--out", str(targets[kind])]) == 2
    err = capsys.readouterr().err
    assert "is not a folder this user can write in" in err and len(err.strip().splitlines()) == 1
    assert work_started == []


def test_empty_and_unwritable_outputs(tmp_path, capsys):
    assert cli.main([*SYNTH, "--out", ""]) == 2
    assert "an empty path" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(MoespecError, match="is not a folder this user can write in"):
        check_output(blocker / "under-a-file.json")
    assert check_output(tmp_path / "new" / "deeper" / "out.json") == tmp_path / "new" / "deeper" / "out.json"


def test_report_and_plot_outputs_are_checked_first(targets, tmp_path, capsys):
    assert cli.main(["report", str(tmp_path), "--out", str(targets["not a regular file"])]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert cli.main(["bench", "--n", "1", "--out", str(tmp_path / "b.json"), "--plot", str(targets["symlink"])]) == 2
    capsys.readouterr()


def test_atomic_writes_keep_the_umask_and_never_replace_a_non_regular_file(targets, tmp_path):
    old = os.umask(0o027)
    try:
        path = write_json(tmp_path / "out.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    for target in targets.values():
        with pytest.raises(MoespecError, match="moespec writes only new names or regular files"):
            atomic_write(target, lambda tmp: tmp.write_text("x"))
    assert targets["symlink"].is_symlink() and stat.S_ISFIFO(targets["not a regular file"].stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left


def test_provenance_names_the_source_commit():
    """Every result file's provenance carries the git commit of the code that made it and whether the tree was
    dirty (None outside a checkout)."""
    import subprocess

    from moespec.formats.files import provenance, source_commit

    git = provenance()["git"]
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        assert git is None
        return
    assert git == source_commit() and git["commit"] == head.stdout.strip() and isinstance(git["dirty"], bool)
