"""demo.json (the demo's closing summary), drafting.json (its drafting step on the trained pair: the cells of
moespec.measure.drafting.compare) and demo-steps.json (which of its measuring steps finished in the output folder,
with the settings they used): their only readers and writers."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from moespec import MoespecError
from moespec.formats.files import Record, read_json, write_json

STEPS_FILE = "demo-steps.json"  # the measuring steps finished in the output folder, with the settings they used
DRAFTING_FILE = "drafting.json"  # the drafting step: {pair, prompts source, V_s, profile_calibration, cells, ...}


class Demo(Record):
    """demo.json: what each step of the demo found (its keys are read where they are shown)."""

    @property
    def engine(self) -> dict[str, Any] | None:
        """Steps 4-7: crossovers, AUTO per acceptance measured beside the plan, the rules that hold (or None)."""
        return self.get("engine")


def load_demo(path: str | Path) -> Demo:
    """demo.json: a JSON object (its keys are read where they are shown)."""
    doc = read_json(path, "demo summary")
    if not isinstance(doc, dict):
        raise MoespecError(f"{path}: not a moespec demo summary (not a JSON object)")
    return Demo(doc, path)


def load_drafting(path: str | Path) -> Record:
    """drafting.json: an object with the comparison's cells (moespec.measure.drafting.compare), each with a positive
    tokens_per_s; one line naming the file otherwise."""
    doc = read_json(path, "drafting results")
    cells = doc.get("cells") if isinstance(doc, dict) else None
    if not isinstance(cells, dict) or not cells or not all(
            isinstance(c, dict) and isinstance(c.get("tokens_per_s"), (int, float)) and c["tokens_per_s"] > 0
            for c in cells.values()):
        raise MoespecError(f"{path}: not a moespec drafting result (cells with positive tokens_per_s)")
    return Record(doc, path)


class Steps:
    """Which measuring steps already finished in the output folder with these settings (STEPS_FILE), so a re-run
    resumes from the artifacts there; other settings start over (their interrupted checkpoints removed)."""

    def __init__(self, out_dir: Path, settings: dict[str, Any], say: Callable[[str], None]) -> None:
        self.path, self.settings, self.say = out_dir / STEPS_FILE, settings, say
        try:
            saved = read_json(self.path, "demo steps")
        except MoespecError:  # none yet, or damaged: every step runs
            saved = {}
        same = isinstance(saved, dict) and saved.get("settings") == settings
        self.done: list[str] = list(saved.get("done", [])) if same else []
        if not same:
            for partial in out_dir.glob("*.partial"):
                shutil.rmtree(partial) if partial.is_dir() else partial.unlink()

    def run(self, artifact: Path, step: Callable[[], Any]) -> None:
        """step() unless it already wrote `artifact` with these settings."""
        if artifact.name in self.done and artifact.exists():
            self.say(f"reusing {artifact} (same settings and code; delete it to measure again)")
            return
        step()
        self.done.append(artifact.name)
        write_json(self.path, {"settings": self.settings, "done": self.done})
