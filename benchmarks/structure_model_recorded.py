"""A recorded validation of the structural model (benchmarks/structure_model.py, e.g. one a GPU ran) predicted again
with the current rules, on a machine without that device: the recorded device.json with its cache set as `moespec
profile` now sets it for that device kind (on cuda the L2's size: moespec.measure.device_profile), the self-check
recomputed on its recorded check passes, then each model's predicted bench, errors and the table, from the recorded
measured benches. Nothing is timed; the only check skipped is that the profile's device is this machine's.

    .venv/bin/python benchmarks/structure_model_recorded.py RECORDED_DIR OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import structure_model
from moespec import MoespecError
from moespec.formats.devicefile import load_profile
from moespec.measure import device_profile, profile_check
from moespec.predict import structure_bench

WORK = Path("out/structure-model/recorded")  # the recorded benches are copied here, not into OUT_DIR


def current_profile(doc: dict) -> dict:
    """The recorded profile with the cache its device kind's profile now takes and the self-check taken again on its
    recorded check passes (moespec.measure.profile_check.recheck)."""
    doc = dict(doc)
    if not device_profile.sizes_for(doc["device_kind"], doc["cache_nominal_bytes"]).probe:
        doc["cache_probe_recorded"], doc["cache_probe"] = doc["cache_probe"], None
        doc["cache_bytes"] = doc["cache_nominal_bytes"]
    return profile_check.recheck(doc)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recorded",
                        help="a folder benchmarks/structure_model.py wrote (device.json, MODEL/bench-B1.json)")
    parser.add_argument("out", help="where the predicted benches, errors, table and the profile used go")
    args = parser.parse_args(argv)
    recorded, out = Path(args.recorded), Path(args.out)
    models = [m for m in structure_model.MODELS if (recorded / m / "bench-B1.json").exists()]
    if not models:
        parser.error(f"{recorded}: no model's bench-B1.json there (a folder benchmarks/structure_model.py wrote)")
    try:
        profile = current_profile(dict(load_profile(recorded / "device.json")))
    except MoespecError as e:  # a profile that does not load: one line naming it
        parser.error(str(e))
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    (WORK / "device.json").write_text(json.dumps(profile, indent=1))
    load_profile(WORK / "device.json")
    checked = structure_bench.check_profile
    structure_bench.check_profile = lambda profile, config: None  # the recorded device is not this machine's
    try:
        for name in models:
            (WORK / name).mkdir()
            shutil.copy(recorded / name / "bench-B1.json", WORK / name)
            structure_model.step_model(name, WORK, WORK / "device.json", "bf16", (1,))
    finally:  # the library's check again for whatever runs in this process next
        structure_bench.check_profile = checked
    structure_model.step_table(WORK, WORK / "device.json")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("device.json", "table.json", "table.md", *(f"{m}/{f}" for m in models
                                                            for f in ("predicted-B1.json", "errors.json"))):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(WORK / name, out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
