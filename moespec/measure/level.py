"""The machine's bandwidth level: times that are compared with each other must be taken in one state of the host.

Physics. On a shared host the streaming bandwidth this process gets is not one number. It sits at one of a few
levels for seconds to minutes, as other tenants' memory traffic comes and goes. On this project's 2-core machine
the 64 MiB reference read reads ~26, ~33 or ~55-63 GB/s; two buffers, one of them in huge pages, move together,
so it is the host, not this process's pages. A memory-bound verify pass follows it: 14 ms or 10 ms at n = 1
(`make demo`, results/demo-cpu.md). A plan calibrated by times of one level and scored against times of another
misses by their ratio, 1.4-1.8x; a calibration whose small n ran at one level and large n at another has a kink
that moves k_hat. Neither says anything about the plan.

So every timed round carries reference reads, and one `Level` pins the measurements of a chain (the bench, the
verify-only run that calibrates the plan, the run scored against the plan) to one level:
- a round whose reference reads have a median outside LEVEL_BAND of the pinned level is dropped and repeated;
- before a round, `settle` polls the reference read until the host is back at the level. The polls run back to
  back: a read after the cores idled reads low whatever the host does (after a 0.2 s sleep 8-10 GB/s where reads
  back to back read 35-55: the vCPUs wake slowly), so a poll that slept between reads waited out its
  whole budget for a read that could not come, and the measurement then re-pinned to a level it never left.
  Each poll follows an eviction of the cache, as a round's read follows its work: read twice in a row, the 64 MiB
  buffer is partly still in a 32 MiB last-level cache and reads 12-30% faster (54 against 40 GB/s, interleaved), so
  polls back to back read as another level than the reads they are compared with.
  After a dropped round the host counts as back on the median of a few reads (SETTLE_READS), not on one;
- the waiting has a budget (wait_s per measurement), which settling and the time of work thrown away off the
  level (dropped rounds, units run again) both spend. When it is spent, the host has moved for longer than a
  burst: a run's verify rounds then follow it (REPIN: the level moves, the rounds kept at the old one are measured
  again, at most MAX_REPINS times), so that all of a run's times are of one state; longer units (throughput
  prompts, bench rounds) go on at the level they find. The record says what was dropped, waited, re-pinned and kept off.
The first kept round pins the level when none is given (a verify run's: the median of its passes' reads); units
judged by one read each (Level.measured: a bench's groups, a profile's calls, throughput prompts) pin the median of
PIN_READS polls before the first (pin_host). A wait of 0 turns pinning off: rounds are dropped only as disturbed
(moespec.measure.rounds.DISTURBED).

Pinning is opt-in (pin_wait): the budget and the band above were tuned on one shared 2-core host, and on a quiet
machine of one's own the host's level does not move, so waiting for it costs time and keeps nothing out. The demo
and the benchmarks that rely on it ask for it. It is never on a GPU (host_level): the reference read measures the
host's memory, which a device's kernels do not read.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from moespec import MoespecError
from moespec.formats.checkpoint import Checkpoint, is_count, require
from moespec.formats.files import check_level_record
from moespec.measure.timing import CacheFlusher, StreamRead, flush_bytes

REFERENCE_BYTES = 64 << 20  # the reference read: evicts a 32 MiB last-level cache, measures the host's bandwidth
# The levels seen here are 1.6-1.9x apart, and one level's reads spread by +-5-10% (IQR 3.7 of 34 GB/s in a quiet
# window): +-15% takes every read of one level and none of the other.
LEVEL_BAND = 0.15
WAIT_S = 30.0  # the waiting budget of one measurement (a bench, a run), re-pins included
LEVEL_UNIT = "level"  # the checkpoint unit that carries a measurement's level (a resumed one keeps its pin)
ATTEMPTS = 3  # runs of one longer unit (a throughput prompt) at most, where a reference read after it is off
# After a round dropped off the level, the host counts as back when the median of this many back-to-back reads is
# at it: on a busy host one read spreads +-20%, and a single read in the band started rounds that were then dropped
# (38 in a row, 3 s of waiting, then a re-pin, in a `make demo` run).
SETTLE_READS = 5
# Units judged by one read each (Level.measured) pin, where no level is given, the median of this many polls before
# the first (pin_host): one read spreads +-20% on a busy host, and a first read after idle cores reads low (8.2 GB/s
# with the host at 30 in a `make demo` bench)
PIN_READS = 15
MAX_REPINS = 1  # a measurement follows the host to another level at most this often (each re-measures its rounds)
KEEP, DROP, REPIN = "keep", "drop", "repin"  # Level.judge's verdicts on a round

T = TypeVar("T")


def check_level(pinned: float | None, wait_s: float | None) -> None:
    """A pinned level is a positive GB/s (--pin-gbps), a waiting budget >= 0 seconds (--pin-wait)."""
    if pinned is not None and not (math.isfinite(pinned) and pinned > 0):
        raise MoespecError(f"--pin-gbps must be a positive GB/s, got {pinned}")
    if wait_s is not None and not (math.isfinite(wait_s) and wait_s >= 0):
        raise MoespecError(f"--pin-wait must be >= 0 seconds, got {wait_s}")


def pin_wait(pinned: float | None, wait_s: float | None) -> float:
    """The waiting budget of a measurement asked for a level `pinned` (GB/s or None) and a wait `wait_s` (seconds or
    None): the wait where given, else WAIT_S where a level is, else 0: pinning is off unless asked for."""
    if wait_s is not None:
        return float(wait_s)
    return WAIT_S if pinned is not None else 0.0


def host_level(pinned: float | None, wait_s: float | None, device_kind: str, say: Callable[[str], None]) -> Level:
    """The Level of a bench or run on `device_kind` asked for `pinned` and `wait_s` (pin_wait): as asked on the CPU;
    on any other device none (the reference read measures the host's memory, not the device's), said in one line
    where pinning was asked for."""
    wait = pin_wait(pinned, wait_s)
    if device_kind == "cpu":
        return Level(pinned, wait)
    if pinned is not None or wait > 0:
        say(f"[yellow]note[/]: --pin-gbps/--pin-wait ignored on {device_kind}: the reference read measures the host's "
            "memory, not the device's")
    return Level(None, 0)


class Level:
    """The pinned bandwidth level of one measurement (module docstring): `pinned` GB/s, or None to pin the first
    kept round's; `wait_s` seconds of waiting for it at most per pin (None: WAIT_S; 0: no pinning). `read()` is the
    reference read (GB/s; a REFERENCE_BYTES streaming read unless given), which also evicts the caches; `poll()`
    the same after `evict` (default with the default read: the flush's read alone; none with a given read)."""

    def __init__(self, pinned: float | None = None, wait_s: float | None = None,
                 read: Callable[[], float] | None = None, evict: Callable[[], object] | None = None) -> None:
        check_level(pinned, wait_s)
        self.pinned, self.wait_s = pinned, float(WAIT_S if wait_s is None else wait_s)
        self._read, self._evict = read, evict
        self.waited_s, self.dropped, self.kept_off, self.repins, self.exhausted = 0.0, 0, 0, 0, False
        self._off = False  # the last round judged was dropped: the next settle reads a window

    def read(self) -> float:
        """One reference read, GB/s (its buffer made on the first call)."""
        return self._reader()()

    def poll(self) -> float:
        """A reference read taken as a round's read after its work is: after the cache is evicted (module
        docstring)."""
        read = self._reader()
        if self._evict is not None:
            self._evict()
        return read()

    def _reader(self) -> Callable[[], float]:
        """The reference read, made on the first call with its eviction (the default read's: the cache flush's read
        alone, CacheFlusher(write=False): a verify pass writes little, and the poll runs before every pass)."""
        if self._read is None:
            self._read, self._evict = StreamRead(REFERENCE_BYTES), self._evict or CacheFlusher(flush_bytes(), False)
        return self._read

    @property
    def active(self) -> bool:
        return self.wait_s > 0

    def within(self, gbps: float) -> bool:
        """Whether a bandwidth `gbps` reads as the pinned level (always, when none is pinned or pinning is off)."""
        return not self.active or self.pinned is None or abs(math.log(gbps / self.pinned)) <= math.log1p(LEVEL_BAND)

    def settle(self) -> None:
        """Poll the reference read, back to back (module docstring), until the host is at the pinned level, within
        what is left of the waiting budget: one read in the band, or after a dropped round the median of the last
        SETTLE_READS."""
        if not self.active or self.pinned is None or self.exhausted:
            return
        start = time.perf_counter()
        window = SETTLE_READS if self._off else 1
        reads = deque((self.poll() for _ in range(window)), maxlen=window)  # the last `window` reads
        while not self.within(float(np.median(reads))):
            if self.waited_s + time.perf_counter() - start >= self.wait_s:
                self.exhausted = True
                break
            reads.append(self.poll())
        self.waited_s += time.perf_counter() - start
        self._off = False

    def pin_host(self) -> None:
        """Pin the host's present level, where pinning is on and none is pinned: the median of PIN_READS polls."""
        if self.active and self.pinned is None:
            self.pinned = float(np.median([self.poll() for _ in range(PIN_READS)]))

    def follow(self) -> None:
        """Stop waiting for the pinned level, the budget left or not: from now on a round off it re-pins
        (judge's REPIN) or is kept off it."""
        self.exhausted = True

    def judge(self, reads: Sequence[float], repin: bool = True) -> str:
        """What to do with a round whose reference reads were `reads`: KEEP it (its median at the pinned level,
        pinning it when none is), DROP it (off the level; the caller repeats it after settle), or, once the waiting
        budget is spent, REPIN: the host stays elsewhere, so the level moves to this round's and the caller
        discards what it kept at the old one (at most MAX_REPINS times, and only where `repin`; after that, or
        without `repin`, the round is kept and counted in kept_off). A re-pin does not renew the budget: the
        measurement waits wait_s at most in all."""
        level = float(np.median(reads))
        if not self.active:
            return KEEP
        if self.pinned is None:
            self.pinned = level
        if self.within(level):
            return KEEP
        if not self.exhausted:
            self.dropped += 1
            self._off = True
            return DROP
        if repin and self.repins < MAX_REPINS:
            self.pinned = level
            self.repins += 1
            return REPIN
        self.kept_off += 1
        return KEEP

    def thrown_away(self, seconds: float) -> None:
        """Count `seconds` of work thrown away off the level (a unit, a round) as waiting: a host that sits at the
        edge of the band, back at the level when settled and off it by the end of each round, spends the budget
        by its rounds rather than by settle, and the measurement then follows it."""
        self.waited_s += seconds
        self.exhausted = self.exhausted or self.waited_s >= self.wait_s

    def measured(self, unit: Callable[[], T]) -> T:
        """`unit()` (a longer measurement, e.g. one prompt of a throughput cell) run at the pinned level: settled
        before, a poll after (a unit that read little would leave the reference buffer in the cache), and run again
        (ATTEMPTS at most, the last kept) where that read is off.
        The time of a run thrown away counts against the waiting budget, as waiting: a grid of many short units
        on a host that came back between them and left during them ran hundreds of units twice or three times
        (687 dropped, the demo's scored run 4.3 min instead of 3; results/demo-cpu.md) while its waits stayed in budget.
        Units of a grid interleave, so a level that stays elsewhere is kept (kept_off), not re-pinned. With no level
        pinned, the first unit pins the median of PIN_READS polls (pin_host), not the one read after it. Unpinned
        (not active), the unit runs once with no read: there is no level to judge it by."""
        if not self.active:
            return unit()
        self.pin_host()
        for _ in range(ATTEMPTS - 1):
            self.settle()
            start = time.perf_counter()
            result = unit()
            if self.judge([self.poll()], repin=False) == KEEP:
                return result
            self.thrown_away(time.perf_counter() - start)
        self.settle()
        result = unit()
        if not self.within(self.poll()):
            self.kept_off += 1
        return result

    def record(self) -> dict[str, Any]:
        """What runs.json and bench.json say of it (`level`)."""
        return {"pinned_gbps": self.pinned, "band": LEVEL_BAND, "wait_s": self.wait_s, "waited_s": self.waited_s,
                "dropped": self.dropped, "kept_off": self.kept_off, "repins": self.repins,
                "exhausted": self.exhausted}

    def restore(self, checkpoint: Checkpoint) -> None:
        """Continue a checkpointed measurement's level (its LEVEL_UNIT): its pin and what it had waited, dropped and
        re-pinned."""
        saved = checkpoint.units.get(LEVEL_UNIT)
        if saved and self.active:
            self.pinned = saved["pinned_gbps"] if saved["pinned_gbps"] is not None else self.pinned
            self.waited_s, self.dropped, self.kept_off = saved["waited_s"], saved["dropped"], saved["kept_off"]
            self.repins, self.exhausted = saved["repins"], saved["exhausted"]

    def save(self, checkpoint: Checkpoint) -> None:
        """Keep the level's record in the checkpoint (LEVEL_UNIT), where it pins anything."""
        if self.active:
            checkpoint.save(LEVEL_UNIT, self.record())


def check_unit(unit: Any, where: str) -> None:
    """A resumed LEVEL_UNIT (Level.record): what Level.restore reads, of the types record writes."""
    require(isinstance(unit, dict), where, "not an object")
    check_level_record({"level": unit}, where)
    require(all(is_count(unit.get(k)) for k in ("dropped", "kept_off", "repins")), where,
            "dropped, kept_off and repins must be whole numbers >= 0")
    require(isinstance(unit.get("exhausted"), bool), where, "exhausted must be true or false")


def pinned_of(record: Mapping[str, Any] | None) -> float | None:
    """The level (GB/s) a level record (Level.record: bench.json, runs.json, device.json `level`) kept its
    measurement at, or None where pinning was off or nothing was pinned."""
    if not record or record.get("pinned_gbps") is None or not record.get("wait_s", 0) > 0:
        return None
    return float(record["pinned_gbps"])


def describe(record: dict[str, Any] | None) -> str | None:
    """One line on a level record (bench.json, runs.json `level`), or None where no level was pinned."""
    if pinned_of(record) is None:
        return None
    return (f"level: rounds kept at {record['pinned_gbps']:.1f} GB/s +-{record['band']:.0%} of the reference read; "
            f"{record['dropped']} dropped off it, {record['waited_s']:.1f} s waited for it"
            + (f"; [bold yellow]re-pinned {record['repins']} time(s)[/]: the host stayed at another level past the "
               f"wait" if record.get("repins") else "")
            + (f"; [bold red]kept {record['kept_off']} off the level[/] (the wait ran out)" if record["kept_off"]
               else ""))
