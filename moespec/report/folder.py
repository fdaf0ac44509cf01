"""A job's folder of artifacts as the report reads it: each file of ARTIFACTS loaded by its format's only loader,
or one line why it cannot be used; the size and sha256 of each file present (what the report names as its inputs
and compares with what a plan recorded), and the result files beside them that the report does not read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from moespec import MoespecError
from moespec.formats.benchfile import load_bench
from moespec.formats.demofile import DRAFTING_FILE, STEPS_FILE, load_demo, load_drafting
from moespec.formats.files import sha256_file
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import load_runs
from moespec.formats.trace import load_trace

DEFAULT_NAME = "report.html"


# The engine's two runs files: the run scored against the plan, and the verify-only run that calibrated it.
RUNS, RUNS_VERIFY = "runs.json", "runs-verify.json"


# file in DIR -> (the command that writes it, its validating loader)
ARTIFACTS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "trace.npz": ("moespec synth or moespec trace", load_trace),
    "bench.json": ("moespec bench", load_bench),
    "plan.json": ("moespec plan", load_plan),
    RUNS: ("moespec run --plan", load_runs),
    RUNS_VERIFY: ("moespec run --no-throughput", load_runs),
    "demo.json": ("moespec demo", load_demo),
    DRAFTING_FILE: ("moespec demo (its drafting step on the trained pair)", load_drafting),
}


# result files that may sit in DIR without being one of ARTIFACTS: listed as "not read" (a bench1.json beside
# bench.json is a file a user may have meant); the demo's own bookkeeping is not
RESULT_SUFFIXES = (".json", ".npz")
NOT_RESULTS = (STEPS_FILE,)


# ---- the artifacts -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileFacts:
    """A file of DIR as it was when the report read it."""
    size: int
    sha256: str


@dataclass
class Folder:
    """What DIR holds: each artifact read and validated (trace.npz: a Trace), or one line why it is not used; the
    facts of each artifact present (read or not); the other result files in DIR, which the report does not read.
    `path` is DIR as given."""
    path: Path
    docs: dict[str, Any]
    problems: dict[str, str]
    files: dict[str, FileFacts] = field(default_factory=dict)
    others: list[str] = field(default_factory=list)

    def missing(self, *names: str) -> str | None:
        """One line naming each of `names` the report cannot use and why; None when all are there."""
        lines = [self.problems[name] for name in names if name not in self.docs]
        return "; ".join(lines) if lines else None


def load_folder(path: str | Path) -> Folder:
    """Read every artifact of ARTIFACTS present in `path`; a missing or unreadable one is recorded as a problem.
    Raises MoespecError when `path` is not a folder or holds no readable artifact."""
    folder = Path(path)
    if not folder.is_dir():
        raise MoespecError(f"{path}: no such folder")
    docs: dict[str, Any] = {}
    problems: dict[str, str] = {}
    files: dict[str, FileFacts] = {}
    errors: list[str] = []  # the loaders' one-line errors (each names its file)
    for name, (writer, load) in ARTIFACTS.items():
        if not (folder / name).is_file():
            problems[name] = f"{name} is missing from {folder} (written by {writer})"
            continue
        files[name] = FileFacts((folder / name).stat().st_size, sha256_file(folder / name))
        try:
            docs[name] = load(folder / name)
        except MoespecError as e:
            errors.append(str(e))
            problems[name] = f"{name} is present but unreadable: {e}"
    if not docs:
        raise MoespecError(errors[0] if errors else
                           f"{path}: no moespec artifact here (none of {', '.join(ARTIFACTS)})")
    others = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in RESULT_SUFFIXES
                    and p.name not in ARTIFACTS and p.name not in NOT_RESULTS)
    return Folder(folder, docs, problems, files, others)
