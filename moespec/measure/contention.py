"""Contention: another process's threads on the cores this process times on, seen and worked around.

Physics. The native kernels and torch split every pass over one OpenMP team, one thread per core, and each
parallel region ends at a barrier. When another runnable process takes one of those cores, the scheduler gives
the team's thread on that core a share of it, and every barrier waits for that thread. Measured on the demo's
verify pass (2 cores; benchmarks/contention.py, results/contention/: the worst n, median of five runs): beside one
spinning process the whole team took 2.1x its quiet time, beside a torch job 3.8x; a team fitted to the cores left
free (one thread) took 1.8x and 2.2x (llama.cpp's pass 2.0x and 4.6x), and on a quiet machine the fitted pass
took 1.01x the whole team's (paired). So before each timed call the team is fitted to the free
cores (`fit=True`, the default), and the call is flagged when another process ran beside it: a time taken so is
not the quiet machine's.

What is read (Linux /proc; elsewhere nothing is seen and nothing is fitted):
- runnable tasks: /proc/loadavg's running count, the kernel's instantaneous run-queue length over all cores,
  less this process's own runnable threads (/proc/self/task/*/stat), is the number of other processes' threads
  that want a core now. The count is of every core the kernel runs, so it is read only where this process may
  run on all of them (`attributable`); pinned to a subset (taskset, a container's cpuset), the host's other tasks
  would read as ours to yield to, and then only the run delay is read and nothing is fitted.
- run delay: the nanoseconds this process's threads spent runnable but waiting for a core
  (/proc/self/task/*/schedstat, second field).
On a quiet machine a read sees another runnable thread now and then (a kernel thread; 7% of reads right after the
cache-evicting read, 1% idle) and our own threads wait now and then (over 5% of a pass in 4% of passes), never both
ends of a pass: so a call is contended where another process's thread was runnable at both its ends, or at one
end while our threads waited for a core over WAIT_SHARE of it. A CPU-bound process beside us is runnable at every
read.

A `Cores` times calls: `before()` reads and sets torch's threads (which our native kernels use: they take
torch.get_num_threads()) to the free cores, and `after()` reads again and judges the call. The fit follows the
fewest other runnable threads of the last FIT_READS reads (the ends of the last call and the start of this one;
before the first call, reads back to back), so a kernel thread seen once does not halve a pass.

The team a timed unit starts from (`on_own_cores`): the threads it was given, else one per core of the machine it
runs on, counted there when it starts.
"""

from __future__ import annotations

import functools
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from moespec import MoespecError
from moespec.defaults import THREADS_LIMIT
from moespec.measure.timing import Timer, read_pages

WAIT_SHARE = 0.05  # our threads waiting for a core over 5% of a call (quiet: median 0, 95th percentile ~1%)
FIT_READS = 3  # the reads a load must show in before the threads are fitted to it
CONTENDED_SHARE = 0.1  # a measurement with more of its calls contended than this is not the quiet machine's
_TASKS = Path("/proc/self/task")


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> int:
    """A timed unit's threads where none are given, counted on the machine the unit runs on: OMP_NUM_THREADS where
    it is set to a whole number (the knob torch and OpenMP read), else one per core this process may run on
    (`cores`); at most THREADS_LIMIT."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return min(int(env) if env.isdigit() and int(env) >= 1 else cores(), THREADS_LIMIT)


def check_threads(threads: int | None) -> None:
    """A timed unit's `threads` (bench and run --threads): None (default_threads) or a whole number in
    1..THREADS_LIMIT; one line otherwise."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= THREADS_LIMIT):
        raise MoespecError(f"--threads must be a whole number in 1..{THREADS_LIMIT:,}, got {threads!r}")


def on_own_cores(job: Callable[..., Any]) -> Callable[..., Any]:
    """A timed unit `job(config, ...)` (a bench or a run; config a dataclass with `threads`) run with torch's threads,
    which the native kernels and the streaming read take, at config.threads (None: default_threads()) from its start
    to its end, its ceilings and warm-up included, then given back; the job gets the count in config.threads, so its
    records carry it. The default is counted here, in the unit, never where its config was made: a unit sent to
    another machine (a Ray node) times on that machine's cores, and a process whose torch took another count before
    (a Ray worker keeps the one of the first task it ran) does not pass it on."""
    @functools.wraps(job)
    def on_cores(config: Any, *args: Any, **kwargs: Any) -> Any:
        check_threads(config.threads)
        threads = default_threads() if config.threads is None else config.threads
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return job(replace(config, threads=threads), *args, **kwargs)
        finally:
            torch.set_num_threads(before)
    return on_cores


def attributable() -> bool:
    """Whether the machine-wide run queue speaks of this process's cores: it may run on every core there is."""
    return cores() >= (os.cpu_count() or 1)


@dataclass(frozen=True)
class Snapshot:
    """What the machine looked like at one moment: `others` runnable threads of other processes, the run delay
    of this process's threads so far (seconds), and the monotonic clock."""

    others: int
    run_delay_s: float
    at: float


def snapshot() -> Snapshot | None:
    """The run queue and this process's run delay now (module docstring), or None where /proc cannot tell."""
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        own, delay = 0, 0
        for task in os.listdir(_TASKS):
            try:
                stat = (_TASKS / task / "stat").read_text()
                delay += int((_TASKS / task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):  # the thread ended between the listing and the read
                continue
            own += stat[stat.rfind(")") + 2] == "R"
    except (OSError, IndexError, ValueError):
        return None
    return Snapshot(max(running - own, 0), delay / 1e9, time.monotonic())


class Cores:
    """Fits the threads of timed calls to the free cores and records which calls another process ran beside.

    threads: the threads a call runs on, set on torch at construction (None: torch's); fit=True (default) lowers
    them to the free cores before each call, fit=False keeps them and only watches (an engine whose threads are
    fixed, llama.cpp's). `release()` gives torch back the threads it had before. `take()`
    gives the record of the calls since the last take, so each checkpointed unit of a measurement (a round, a
    prompt) carries its own and a resumed measurement merges them (`merge`)."""

    def __init__(self, threads: int | None = None, fit: bool = True) -> None:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads: a whole number >= 1, got {threads!r}")
        self._torch = torch.get_num_threads()  # what release() gives back
        self.threads, self.fit, self.cores = threads or self._torch, fit, cores()
        self._queue = attributable()  # else the run queue is the host's: read the run delay alone
        self._zero()
        self._seen: deque[int] = deque(maxlen=FIT_READS)  # other runnable threads at the last reads
        self._start: Snapshot | None = None
        torch.set_num_threads(self.threads)

    def _read(self) -> Snapshot | None:
        now = snapshot()
        if now is not None:
            self._seen.append(now.others)
        return now

    def _zero(self) -> None:
        self.calls = self.contended = self.fewer = self.others_max = 0
        self.wait_share_max = 0.0

    def before(self) -> int:
        """Read the machine before a timed call and fit the threads; returns the threads the call runs on."""
        now = self._read()
        self._start = now
        if not self.fit:  # the whole team, whatever another Cores or caller set since
            if torch.get_num_threads() != self.threads:
                torch.set_num_threads(self.threads)
            return self.threads
        while now is not None and len(self._seen) < FIT_READS:  # the first call: reads back to back
            self._read()
        free = self.cores - min(self._seen) if self._seen and self._queue else self.cores
        use = max(1, min(self.threads, free))
        if use != torch.get_num_threads():
            torch.set_num_threads(use)
        return use

    def after(self) -> bool:
        """Read the machine after the call `before()` opened and record it; True where it was contended."""
        end, start = self._read(), self._start
        self._start = None
        self.calls += 1
        if start is None or end is None:
            return False
        wall = max(end.at - start.at, 1e-9)
        share = max(end.run_delay_s - start.run_delay_s, 0.0) / wall
        others = max(start.others, end.others) if self._queue else 0
        contended = (start.others > 0 and end.others > 0) or (others > 0 and share > WAIT_SHARE) if self._queue \
            else share > WAIT_SHARE
        self.contended += contended
        self.fewer += torch.get_num_threads() < self.threads
        self.others_max, self.wait_share_max = max(self.others_max, others), max(self.wait_share_max, share)
        return contended

    def cold_call(self, timer: Timer, fn: Callable[[], object], reads: Sequence[torch.Tensor] = ()) -> float:
        """Seconds of one call of fn after the timer's cache flush, on the threads `before()` fits, the machine read
        after it: every cold call the bench and the profile time. The reads between the flush and the call are part
        of what a call pays (on a 2-core Zen 1 guest a pass of eight 24.6 KB experts took ~200 us after them and
        ~230 us straight after the flush), so a profile's fixed costs hold for a bench only when both take them.
        `reads`, the tensors (expert slices) the call reads, are read once before the flush: memory in place, as an
        engine's experts are (moespec.measure.timing.read_pages)."""
        if reads:
            read_pages(list(reads))
        timer.flush()
        self.before()
        seconds = timer.time(fn)
        self.after()
        return seconds

    def watched(self, unit: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """A longer unit (one prompt's decoding) as one call: its result with the record of that call alone."""
        self.before()
        result = unit()
        self.after()
        return result | {"contention": self.take()}

    def release(self) -> None:
        """Give torch (and the native kernels) back the threads it had before this Cores."""
        torch.set_num_threads(self._torch)

    def take(self) -> dict[str, Any]:
        """The record of the calls since the last take (results files' `contention`, documented in
        moespec.formats.runsfile and benchfile), the counts then starting again from zero."""
        record = {"cores": self.cores, "threads": self.threads, "fitted": self.fit, "calls": self.calls,
                "contended": self.contended, "fewer_threads": self.fewer, "others_max": self.others_max,
                "wait_share_max": round(self.wait_share_max, 4)}
        self._zero()
        return record


def merge(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One record for the calls of several (checkpointed rounds, prompts); None for none."""
    if not records:
        return None
    out = dict(records[0])
    for r in records[1:]:
        for key in ("calls", "contended", "fewer_threads"):
            out[key] += r[key]
        out["others_max"] = max(out["others_max"], r["others_max"])
        out["wait_share_max"] = max(out["wait_share_max"], r["wait_share_max"])
    return out


def contended(record: dict[str, Any] | None) -> bool:
    """Whether a measurement's calls were contended too often to stand for the quiet machine."""
    return bool(record) and record["calls"] > 0 and record["contended"] > CONTENDED_SHARE * record["calls"]


def describe(record: dict[str, Any] | None, what: str = "timed calls") -> str | None:
    """One line on a contention record where any call was contended (None where none was, or none was recorded):
    what was seen, and what to do."""
    if not record or not record["contended"]:
        return None
    fewer = f", {record['fewer_threads']} on fewer than {record['threads']} threads" if record["fewer_threads"] else ""
    line = (f"contention: {record['contended']} of {record['calls']} {what} ran while another process wanted a core "
            f"(up to {record['others_max']} other runnable threads, threads waited up to "
            f"{record['wait_share_max']:.0%} of a call{fewer})")
    if contended(record):
        return (line + ": these are not this machine's quiet times; stop the other work and measure again "
                "(--fresh)")
    return line + ": few enough that the medians stand"
