"""Values a user may type that once ended in a traceback (issue 14, class 3): each is one line and exit 2, and
nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from moespec import cli


@pytest.mark.parametrize("argv, needle", [
    (["synth", "--process", "uniform", "--tokens", "100", "--docs", "2", "--seed", "-1"], "--seed"),
    (["reuse", "TRACE", "--seed", "-1"], "--seed"),
    (["bench", "--seed", "x"], "--seed"),
    (["demo", "--seed", "-3"], "--seed"),
    (["spec", "--format", "q9"], "--format"),
    (["staircase", "--step-times", "1e-300,1e300"], "magnitudes"),
    (["staircase", "--step-times", "1e999999,2"], "magnitudes"),
    (["staircase", "--step-times", "1,2", "--acceptance", ""], "an empty list"),
    (["trace", "--model", "MODEL", "--text", "TEXT", "--device", "nonsense"], "unknown device"),
])
def test_a_bad_value_is_one_line(argv, needle, tmp_path: Path, capsys):
    text = tmp_path / "doc.txt"
    text.write_text(" = Title = \\nsome text\\n")
    argv = [{"TRACE": str(tmp_path / "none.npz"), "MODEL": str(tmp_path), "TEXT": str(text)}.get(a, a) for a in argv]
    out = tmp_path / "out.npz"
    try:
        code = cli.main([*argv, *(["--out", str(out)] if argv[0] in ("synth", "trace") else [])])
    except SystemExit as e:  # argparse's own one-line errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
