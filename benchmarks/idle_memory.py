"""Memory a process leaves untouched: the first cold pass over expert weights that went untouched for some seconds,
against the same pass right after it, and against one whose weights were read just before its flush (what every
timed cold call does: moespec.measure.timing.read_pages). A host that lets a guest's idle memory go slow shows the
first pass below the second, the more the longer the gap; a host that does not shows them alike.

    .venv/bin/python benchmarks/idle_memory.py --out results/structure-model/idle-memory/idle-memory.json

Four sets of synthetic experts (moespec.measure.device_profile.Weights, bf16, 41 experts of (2560, 640): ~400 MB a
set, past any last-level cache), each pass our dedup kernel on one token naming all of them (every group G = 1, the
profile's one-token rate pass), after a cache flush. Per gap: every set is passed over, the process sleeps the gap,
then sets 1-3 are passed over cold as they are (each set's first pass, then its second right after) and set 4 with
its weights read before the flush, with the streaming-read ceiling sampled after.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from moespec.formats.files import check_output, provenance, write_json
from moespec.measure.contention import Cores
from moespec.measure.device_profile import Weights, _same_experts
from moespec.measure.timing import timer_for

SHAPE, EXPERTS, SETS = (2560, 640), 41, 4  # the profile's first bf16 rate shape at its larger cold size
GAPS = (1, 5, 15, 30, 60)  # seconds untouched
REPS = 2  # rounds over the gaps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="out/idle-memory.json", help="the result JSON (default %(default)s)")
    p.add_argument("--gaps", default=",".join(map(str, GAPS)), help="seconds untouched, comma-separated (default "
                                                                     "%(default)s)")
    args = p.parse_args(argv)
    try:
        gaps = [float(g) for g in args.gaps.split(",")]
        if not gaps or min(gaps) < 0:
            raise ValueError
    except ValueError:
        p.error(f"--gaps: seconds >= 0, comma-separated, got {args.gaps!r}")
    check_output(args.out)
    timer, cores = timer_for("cpu"), Cores(None, fit=False)
    sample = timer.sampler()
    sets = [Weights.draw(*SHAPE, EXPERTS, "bf16") for _ in range(SETS)]
    ids = _same_experts(1, EXPERTS)
    calls = [w.call("dedup", ids, None) for w in sets]
    for call in calls:
        call()
    nbytes = EXPERTS * sets[0].expert_bytes

    def gbps(i: int, reads: tuple = ()) -> float:
        return nbytes / cores.cold_call(timer, calls[i], reads) / 1e9

    rows = []
    for rep in range(REPS):
        for gap in gaps:
            for call in calls:
                call()
            time.sleep(gap)
            first = [gbps(i) for i in range(SETS - 1)]
            read_first = gbps(SETS - 1, sets[-1].reads(ids))
            again = [gbps(i) for i in range(SETS - 1)]
            rows.append({"round": rep, "gap_s": gap, "first_gbps": first, "again_gbps": again,
                         "read_first_gbps": read_first, "ceiling_gbps": sample()})
            print(f"untouched {gap:4.0f} s: first pass {np.median(first):5.1f} GB/s, again {np.median(again):5.1f}, "
                  f"weights read before the flush {read_first:5.1f}; ceiling {rows[-1]['ceiling_gbps']:.1f}",
                  flush=True)
    summary = {str(g): {k: float(np.median([v for r in rows if r["gap_s"] == g
                                             for v in np.atleast_1d(r[k])]))
                        for k in ("first_gbps", "again_gbps", "read_first_gbps", "ceiling_gbps")} for g in gaps}
    write_json(args.out, {"shape": list(SHAPE), "experts": EXPERTS, "pass_bytes": nbytes, "sets": SETS,
                          "kernel": "dedup (native), one token: G = 1", "rows": rows, "median_by_gap": summary,
                          "provenance": provenance(timer.name, "bf16")})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
