"""demo.json (the demo's closing summary) and demo-steps.json (which of its measuring steps finished in the output
folder, with the settings they used): their only readers and writers."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from moespec import MoespecError
from moespec.formats.files import Record, read_json, write_json

STEPS_FILE = "demo-steps.json"  # the measuring steps finished in the output folder, with the settings they used


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
            self.say(f"reusing {artifact} (same settings; delete it to measure again)")
            return
        step()
        self.done.append(artifact.name)
        write_json(self.path, {"settings": self.settings, "done": self.done})
