"""The Ray path against one process on this machine: `trace` of the shipped pair's target on moespec's sample text
(COPIES times over) and
`reuse` of several trace files, each run in one process and on a local Ray instance (moespec.cluster), in
interleaved rounds.

Both paths use the machine's CPUs: one process with torch's threads, Ray with one worker per CPU of one thread each
(`--threads 1`). Ray's start-up is reported apart from the work: ray.init of the local instance (once, before the
rounds; a command with `--ray local` pays it each time), and per command the workers' start (loading moespec and
the model), which a trace's wall time holds and its tracing time (moespec.routing.tracer.Traced.seconds, the
documents alone) does not. reuse's tasks run on workers Ray keeps warm after the first round. Prints medians,
ranges and the ratio per round, then writes the JSON.

    .venv/bin/python benchmarks/ray_overhead.py --rounds 5 --out results/cluster/ray-overhead.json
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from moespec.defaults import SAMPLE_TEXT
from moespec.formats.files import check_output, provenance, write_json
from moespec.routing.shards import reuse_files
from moespec.routing.synth import synthesize
from moespec.routing.tracer import TraceConfig, trace

TARGET = Path(__file__).resolve().parents[1] / "moespec" / "data" / "pair" / "target"
FILES, FILE_TOKENS, FILE_DOCS = 8, 1_000_000, 250  # reuse: eight traces of OLMoE's routing shape
COPIES = 40  # trace: the sample text this many times over, ~60k tokens (a few seconds of work in one process)


def timed(fn) -> tuple[float, float]:
    """(wall seconds of fn(), the seconds of its work: what fn returns, or the wall where it returns None)."""
    start = time.perf_counter()
    work = fn()
    wall = time.perf_counter() - start
    return wall, wall if work is None else work


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    check_output(args.out)
    import ray

    work = Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    files = []
    for i in range(FILES):
        files.append(str(work / f"part{i}.npz"))
        synthesize("olmoe-1b-7b", "calibrated", FILE_TOKENS, FILE_DOCS, seed=i).save(files[-1])
    text = work / "text.txt"
    text.write_text(SAMPLE_TEXT.read_text() * COPIES)
    started = provenance("cpu", "fp32")
    startup = timed(lambda: ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False))[0]
    cpus = int(ray.cluster_resources()["CPU"])

    def trace_here(i: int) -> float:
        return trace(TraceConfig(model=str(TARGET), out=str(work / f"here{i}.npz"), text=str(text),
                                 fresh=True)).seconds

    def trace_ray(i: int) -> float:
        return trace(TraceConfig(model=str(TARGET), out=str(work / f"ray{i}.npz"), text=str(text),
                                 fresh=True, threads=1, ray="local")).seconds

    def reuse_here(i: int) -> None:
        reuse_files(files, 9, 2000, 0, 0.95, "bf16")

    def reuse_ray(i: int) -> None:
        reuse_files(files, 9, 2000, 0, 0.95, "bf16", ray="local")

    pairs = {"trace": (trace_here, trace_ray), "reuse": (reuse_here, reuse_ray)}
    times = {job: {name: {"wall": [], "work": []} for name in ("one process", "ray")} for job in pairs}
    for i in range(args.rounds):
        for job, (here, on_ray) in pairs.items():
            order = [("one process", here), ("ray", on_ray)]
            for name, fn in order if i % 2 == 0 else order[::-1]:  # interleaved, alternating which goes first
                wall, work_s = timed(lambda: fn(i))
                times[job][name]["wall"].append(wall)
                times[job][name]["work"].append(work_s)
        print(f"round {i + 1}: " + "; ".join(
            f"{job} {t['one process']['wall'][-1]:.2f} s here, {t['ray']['wall'][-1]:.2f} s on Ray "
            f"(work {t['one process']['work'][-1]:.2f} / {t['ray']['work'][-1]:.2f} s)" for job, t in times.items()),
            flush=True)
    ray.shutdown()
    summary = {}
    for job, t in times.items():
        summary[job] = {}
        for kind in ("wall", "work"):
            ratio = np.array(t["ray"][kind]) / np.array(t["one process"][kind])
            summary[job][kind] = {name: float(np.median(v[kind])) for name, v in t.items()} | {
                "ray_over_one_process": {"median": float(np.median(ratio)), "min": float(ratio.min()),
                                         "max": float(ratio.max())}}
            e = summary[job][kind]
            print(f"{job} {kind}: one process {e['one process']:.2f} s, Ray {e['ray']:.2f} s (medians of "
                  f"{args.rounds}); Ray / one process {e['ray_over_one_process']['median']:.2f} "
                  f"({ratio.min():.2f}-{ratio.max():.2f})")
    print(f"Ray start-up (ray.init of a local instance, {cpus} CPUs): {startup:.1f} s, paid once per command")
    write_json(args.out, {"command": " ".join(map(shlex.quote, sys.argv)), "cpus": cpus, "ray_init_s": startup,
                          "rounds": args.rounds, "times_s": times, "summary": summary,
                          "ray_version": ray.__version__, "provenance": started})
    return 0


if __name__ == "__main__":
    sys.exit(main())
