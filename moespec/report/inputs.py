"""The report's check of its own inputs, shown at the top of the page (moespec.report.html).

Inputs: every artifact the report looked for, as a path relative to the page, with its size, the start of its
sha256, whether it was read, and its provenance (created, command, host); the other result files in the folder,
which the report does not read, are named below it (a bench1.json beside bench.json is a file a user may have
meant).

Warnings (`mismatches`), one bold line each at the top of the page, where the files side by side are not the ones
they were made from, so the page would put a prediction beside measurements it was not made from:
  - plan.json records the sha256 of each file it was made from (moespec.formats.planfile, provenance.inputs:
    bench, trace, runs, draft_time); a folder file of that role (bench.json, trace.npz, runs-verify.json or
    runs.json) whose sha256 differs is named with the recorded one, and what to do: make the plan again from the
    folder's files;
  - runs.json records the sha256 of the plan it ran (run --plan); another plan's is named with the folder's.
A plan that records no sha256 of its inputs (older files) cannot be checked; a note says so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from moespec.formats.planfile import INPUT_ROLES
from moespec.report.folder import ARTIFACTS, RUNS, RUNS_VERIFY, FileFacts, Folder
from moespec.report.markup import note, table, warning

SHA_SHOWN = 12  # hex digits of a sha256 shown on the page: enough to tell files apart at a glance

# plan.json's input role -> the folder's files that may be it, the usual one first (the plan's --runs is the
# verify-only run; a plan may also take its draft times from it)
ROLE_FILES = {"bench": ("bench.json",), "trace": ("trace.npz",), "runs": (RUNS_VERIFY, RUNS),
              "draft_time": (RUNS_VERIFY, RUNS)}
# the flag of `moespec plan` that takes each role's file
ROLE_FLAGS = {"bench": "--bench", "trace": "--trace", "runs": "--runs", "draft_time": "--draft-time"}
assert set(ROLE_FILES) == set(ROLE_FLAGS) == set(INPUT_ROLES)


def size_text(size: int) -> str:
    """A file size as people read it (decimal units)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be an integer >= 0, got {size!r}")
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _relative(f: Folder, name: str, page_dir: Path) -> str:
    """The artifact `name` of the folder as a path relative to the page."""
    return os.path.relpath(f.path / name, page_dir)


def _folder_file(f: Folder, role: str, recorded: str) -> str | None:
    """The folder's file that plays `role` for the plan: the one named like the recorded path, else the usual
    one present; None when the folder holds none."""
    present = [name for name in ROLE_FILES[role] if name in f.files]
    same_name = [name for name in present if name == Path(recorded).name]
    return (same_name or present or [None])[0]


def _short(sha: str) -> str:
    return sha[:SHA_SHOWN]


def _remake(f: Folder, roles: list[str]) -> str:
    """The command that makes the plan again from the folder's files of `roles`."""
    parts = ["moespec plan"]
    for role in roles:
        name = _folder_file(f, role, "")
        if name is not None:
            parts.append(f"{ROLE_FLAGS[role]} {f.path / name}")
    return " ".join([*parts, f"--out {f.path / 'plan.json'}"])


def plan_checks(f: Folder) -> tuple[list[str], list[list[str]]]:
    """(warnings, rows): a warning naming each plan input whose folder file differs from what the plan recorded,
    and what to do (none when all agree); one row per recorded input (role, recorded path, recorded sha256, the
    folder's file, whether they agree)."""
    plan = f.docs.get("plan.json")
    if plan is None or not plan.inputs:
        return [], []
    differ, rows = [], []
    for role, entry in plan.inputs.items():
        name = _folder_file(f, role, entry["path"])
        facts: FileFacts | None = f.files.get(name) if name else None
        same = facts is not None and facts.sha256 == entry["sha256"]
        rows.append([role, entry["path"], _short(entry["sha256"]), "-" if name is None else name,
                     "not in this folder" if facts is None else "same file" if same else
                     f"DIFFERENT (sha256 {_short(facts.sha256)})"])
        if facts is not None and not same:
            differ.append(f"from {entry['path']} (sha256 {_short(entry['sha256'])}), not from this folder's {name} "
                          f"(sha256 {_short(facts.sha256)})")
    if not differ:
        return [], rows
    return [f"plan.json was made {'; '.join(differ)}: its prediction is not of the measurements shown here. Make "
            f"the plan again from this folder's files: `{_remake(f, list(plan.inputs))}`, with the other options "
            f"of the command that made it (`{plan['provenance'].get('command', 'not recorded')}`)."], rows


def runs_check(f: Folder) -> list[str]:
    """A warning when runs.json ran another plan than the folder's plan.json (by sha256), else none."""
    plan, runs = f.docs.get("plan.json"), f.docs.get(RUNS)
    if plan is None or runs is None or runs.plan_sha256 is None or runs.plan_sha256 == plan.sha256:
        return []
    return [f"{RUNS} ran another plan (sha256 {_short(runs.plan_sha256)}) than this folder's plan.json (sha256 "
            f"{_short(plan.sha256)}): Figure 5 and Tables 3 and 8 score a plan its runs did not use. Run the engine "
            f"again with this plan (`moespec run --plan {f.path / 'plan.json'}` and the options of {RUNS}'s "
            f"command), or put back the plan it ran."]


def mismatches(f: Folder) -> list[str]:
    """Every warning about the folder's files not being the ones they were made from (module docstring)."""
    if not isinstance(f, Folder):
        raise ValueError(f"f must be a Folder (moespec.report.folder.load_folder), got {type(f).__name__}")
    return plan_checks(f)[0] + runs_check(f)


def _provenance(name: str, doc: Any) -> dict[str, Any]:
    meta = doc.meta if name == "trace.npz" else doc
    return meta.get("provenance") or {}


def warnings_html(f: Folder) -> str:
    """The mismatch warnings, one bold line each (empty when the files agree)."""
    return "".join(warning(line) for line in mismatches(f))


def inputs_section(f: Folder, page_dir: str | Path) -> str:
    """The Inputs section: every artifact looked for (path relative to `page_dir`, the page's folder), its size,
    sha256 prefix, status and provenance; the plan's recorded inputs against the folder's; the files not read."""
    if not isinstance(f, Folder):
        raise ValueError(f"f must be a Folder (moespec.report.folder.load_folder), got {type(f).__name__}")
    page_dir = Path(page_dir)
    rows = []
    for name, (writer, _) in ARTIFACTS.items():
        facts = f.files.get(name)
        # the size on one line: a non-breaking space between number and unit
        size, sha = ("-", "-") if facts is None else (size_text(facts.size).replace(" ", "\u00a0"),
                                                      _short(facts.sha256))
        if name not in f.docs:
            status = "missing" if facts is None else f.problems[name]  # present: why it cannot be read
            rows.append([_relative(f, name, page_dir), writer, status, size, sha, "-", "-", "-"])
            continue
        prov = _provenance(name, f.docs[name])
        rows.append([_relative(f, name, page_dir), writer, "read", size, sha, prov.get("timestamp", "-"),
                     prov.get("command", "-"), prov.get("host", "-")])
    out = ['<h2 id="inputs">Inputs</h2>', table(
        ("artifact", "written by", "status", "size", "sha256", "created (UTC)", "command", "host"), rows,
        f"artifact: its path from this page; sha256: the first {SHA_SHOWN} hex digits of the file's bytes as read; "
        f"created and command: the file's provenance", text_columns=8)]
    if f.others:
        out.append(note(f"Also in {f.path}, not read (the report reads only the names above): "
                        f"{', '.join(f.others)}."))
    plan = f.docs.get("plan.json")
    if plan is not None and not plan.inputs:
        out.append(note("plan.json records no sha256 of the files it was made from (it was made by an older "
                        "moespec): whether they are this folder's cannot be checked. Making it again records them."))
    _, plan_rows = plan_checks(f)
    if plan_rows:
        out.append("<h3>What plan.json was made from</h3>" + table(
            ("input", "path recorded", "sha256 recorded", "in this folder", "agree"), plan_rows,
            "recorded by moespec plan when it made the plan (plan.json provenance.inputs)", text_columns=5))
    return "".join(out)

