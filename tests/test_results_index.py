"""results/README.md indexes every file under results/ (scripts/results_index.py): a result added without its
row, or a table left stale, fails here with the command that fixes it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "results_index.py"


def load_script():
    spec = importlib.util.spec_from_file_location("results_index", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_result_is_indexed_and_the_table_is_current(capsys):
    index = load_script()
    assert index.problems() == []
    assert index.main(["--check"]) == 0, capsys.readouterr().err


def test_an_unindexed_file_is_named(tmp_path, monkeypatch):
    index = load_script()
    (tmp_path / "new.json").write_text("{}")
    monkeypatch.setattr(index, "RESULTS", tmp_path)
    assert "results/new.json: not indexed (add it to ENTRIES in scripts/results_index.py)" in index.problems()
