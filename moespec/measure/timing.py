"""How one timed call is measured on a device: the cache flush before it, the clock around it, and the ceiling
every bandwidth is printed beside (used by `moespec bench`).

Physics. The expert operation is memory-bound (moespec.kernels): its time is the bytes it streams over the
bandwidth it streams them at. In decoding, a model far larger than any cache is read from DRAM (HBM on a GPU) on
every step, so a timed call must find none of its weights in a cache. Before each timed call the flush therefore
writes a buffer larger than the last-level cache (the GPU's L2; on the CPU the share of its L3 this process keeps,
measured once: kept_cache), which evicts every line, then reads a second, clean buffer at least as large. The read
matters: after the write alone the cache is full of dirty lines, and the timed call would pay for writing them back
to memory while it streams its weights (up to a cache of extra traffic) which the ceiling does not pay; the read
replaces them by clean lines that are dropped for free.

The clock. On the CPU the kernels are synchronous, so time.perf_counter around the call is its time. A CUDA call
only enqueues kernels and returns, so the host clock would measure the launch; CUDA events recorded on the
current stream before and after the call bracket the device's work instead. As in triton.testing.do_bench, the
start event is queued behind the flush and a short device-side spin (GPU_LAUNCH_LEAD_S), so the call's launches
overlap them (~0.9 ms in all) and the events measure the kernels' execution, not the host's launch latency
(which a serving engine hides with CUDA graphs); only launches slower than that would show as idle time.

The ceiling: what the device's memory delivers to the simplest streaming code, in GB/s (1e9 B/s).
- cpu, "streaming read": one read of a 256 MiB buffer (the native AVX2 reader on all threads, each a contiguous
  part, with the kernels' software prefetch on a CPU where they prefetch their one-token rows; else a torch integer
  sum). The expert operation only reads its weights, so a read is its ceiling.
- cuda, "device-to-device copy": a 1 GiB copy_ within the device (the driver's copy), counting the bytes read and
  written, 2 nbytes / t, the figure HBM bandwidth is usually quoted as. A GPU reaches its memory bandwidth only
  with many requests in flight, and the driver's copy is the standard, best-tuned kernel that keeps them so: the
  usual yardstick for a memory-bound kernel (a pure read may reach somewhat more, having no writes to turn around).
"""

from __future__ import annotations

import functools
import platform
import statistics
from abc import ABC, abstractmethod
from pathlib import Path
from time import perf_counter
from typing import Callable

import torch

from moespec import ArgumentError
from moespec.arguments import show
from moespec.kernels import native, pages
from moespec.model.load import resolve_device

__all__ = [
    "StreamRead", "read_gbps", "measure_stream_read", "CacheFlusher", "median_iqr", "last_level_cache", "kept_of",
    "kept_cache", "flush_bytes", "device_name", "matmul_peak", "matmul_dtype",
    "cuda_device_name", "Timer", "CpuTimer", "CudaTimer", "timer_for",
]

STREAM_READ_BYTES = 256 << 20  # the CPU ceiling's buffer: 8x a 32 MiB L3, past what a VM keeps of a larger one
CEILING_REPEATS = 7  # ceiling samples per measurement: a median and an IQR that shows drift
# The compute ceiling's product [M, K] x [K, N]: 8.6 GFLOP a call, large enough for a GEMM library's peak on a CPU
# or a GPU, small enough (12 MiB of bf16 operands) to time in well under a second.
MATMUL_SHAPE = (1024, 2048, 2048)
FLUSH_LLC_MULTIPLE = 2  # the flush writes twice the cache the process keeps, so no expert byte survives in it ...
FLUSH_MIN_BYTES = 64 << 20  # ... and at least 64 MiB when the CPU's cache size cannot be read
KEPT_PROBE_MIN = 8 << 20  # kept_cache's smallest buffer: past any core's private L2
KEPT_PROBE_READS = 3  # timed re-reads per buffer; the best counts (a shared host's reads of one buffer spread ~5-20%)
# A re-read this much faster than memory comes from the cache (a 64 MiB buffer re-read ~1.9x memory's rate where it is
# kept, a 128 MiB one ~1.1x where it is not)
CACHED_SPEEDUP = 1.25
GPU_L2_FALLBACK_BYTES = 50 << 20  # an H100's L2, for a torch that does not report L2_cache_size
# GPU L2s are split into partitions with hashed addresses and do not evict in strict LRU order, so the flush
# goes well past 2 x L2 where that is small: writing 1 GiB and reading 256 MiB (the size triton's do_bench
# clears) takes ~0.3 ms at HBM speeds, cheap beside a timed call, and gives the host that long to launch the
# call's kernels before the device reaches them (a Python wrapper with a few launches needs ~0.1 ms).
GPU_FLUSH_WRITE_MIN_BYTES = 1 << 30
GPU_FLUSH_READ_MIN_BYTES = 256 << 20
# After the flush the device spins this long (torch.cuda._sleep) before the timed call's start event: the host
# then has flush + lead (~0.9 ms) to launch the call's kernels, so none waits on the host. Our Triton wrappers
# measured 0.16-0.37 ms of host launch time on an H200 against a 0.32 ms flush: without the lead, small passes
# showed launch gaps as bandwidth dips.
GPU_LAUNCH_LEAD_S = 0.6e-3
GPU_SLEEP_CALIBRATION_CYCLES = 1 << 22  # ~2 ms at ~2 GHz: long enough that the events' ~1 us resolution is noise
# An idle GPU's SMs run at a fraction of their boost clock (345 against 1980 MHz on an H200): a lead calibrated
# there spins ~6x too short once the timed work has raised the clock. So the clock is raised first (a spin this
# many calibration lengths), the calibration taken as the fastest of a few, and a lead that still proves short (the
# device reached the start event before the host had launched the call) doubled, up to GPU_LEAD_MAX_S.
GPU_CLOCK_WARM_SPINS, GPU_CALIBRATIONS, GPU_LEAD_MAX_S = 10, 3, 8e-3
COPY_BYTES = 1 << 30  # the GPU ceiling's copy: 20x an H100's L2, ~0.5 ms at 4 TB/s, far above the events' ~1 us


# ---- CPU helpers -------------------------------------------------------------------------------------------
def random_words(nbytes: int) -> torch.Tensor:
    """A buffer of nbytes of seeded random int64 words for the CPU to read, in the 2 MiB pages the engine's weights are
    in (moespec.kernels.pages), so a ceiling read from it is read as the kernels read. Not a constant fill: on a
    shared host the kernel may merge identical pages (KSM), and a read of one physical page repeated reads from
    cache; seen here as impossible 50-59 GB/s "ceilings" from buffers of ones."""
    gen = torch.Generator().manual_seed(nbytes)
    return pages.huge(torch.randint(-(2**62), 2**62, (nbytes // 8,), dtype=torch.int64, generator=gen))


class StreamRead:
    """The CPU ceiling: each call reads a fixed nbytes buffer once, start to end, and returns GB/s.

    The native AVX2 reader runs on all threads when available (each thread one contiguous part), else a
    torch integer sum."""

    def __init__(self, nbytes: int = STREAM_READ_BYTES, threads: int | None = None) -> None:
        self._buf = random_words(nbytes)
        self._threads = threads

    def __call__(self) -> float:
        return read_gbps([self._buf], self._threads)


def read_gbps(parts: list[torch.Tensor], threads: int | None = None) -> float:
    """GB/s of one streaming read over the bytes of `parts` (each contiguous, in the CPU's memory, in turn): the
    native reader on `threads` (None: torch's), else a torch sum of each."""
    lib, nbytes = native.load(), sum(t.numel() * t.element_size() for t in parts)
    if not nbytes:
        return 0.0
    start = perf_counter()
    for t in parts:
        if lib is not None:
            lib.moespec_stream_read(t.data_ptr(), t.numel() * t.element_size(), threads or torch.get_num_threads())
        else:
            t.sum()
    return nbytes / (perf_counter() - start) / 1e9


def read_pages(parts: list[torch.Tensor], threads: int | None = None) -> None:
    """Read the bytes of `parts` once (those in the CPU's memory; contiguous): what a timed cold call does before its
    flush (Cores.cold_call). A host may let memory a guest leaves untouched for seconds go idle, and the first read
    of it then costs far more than the stream: on a 2-core KVM guest of a Xeon, 400 MB of expert weights untouched for
    1, 5, 15, 30 and 60 s read in a pass at 24, 22, 16, 14 and 12 GB/s, and read again right after at 28 (the
    ceiling 30); touching one byte per page took 25-60 ms and left the pass at 18-25. A bench's or an engine's
    experts are read every few calls, so every timed call reads its own experts once first: the time is the
    kernel's on memory in place, from the cache flushed after the read."""
    read_gbps([t for t in parts if t.device.type == "cpu" and t.is_contiguous()], threads)


def measure_stream_read(nbytes: int = STREAM_READ_BYTES, repeats: int = CEILING_REPEATS,
                        threads: int | None = None) -> list[float]:
    """GB/s of `repeats` streaming reads of one nbytes buffer, after one untimed read."""
    return _repeated(StreamRead(nbytes, threads), repeats)


def _repeated(sample: Callable[[], float], repeats: int) -> list[float]:
    """`repeats` calls of a ceiling measurement after one untimed call (its buffer paged in)."""
    sample()
    return [sample() for _ in range(repeats)]


class CacheFlusher:
    """Call it before a timed call so that call finds no expert weights in any CPU cache.

    It writes a buffer larger than the cache (the timers pass flush_bytes(): twice the cache this process keeps,
    64 MiB at least), which evicts everything, then reads a second buffer of the same size, which replaces the
    dirty lines by clean ones (see the module docstring). With write=False it only reads: that evicts every line too
    and leaves clean ones, at less than half the time (a 512 MiB flush ~51 ms, its read ~19 ms); the dirty lines of
    the work before it are written back during its read, so it serves where the work before it wrote little (the
    level's polls between verify passes)."""

    def __init__(self, nbytes: int = FLUSH_MIN_BYTES, write: bool = True) -> None:
        self._dirty = pages.empty((nbytes // 4,), torch.float32) if write else None
        self._clean = random_words(nbytes)
        self._value = 0.0

    def __call__(self) -> None:
        self._value += 1.0
        if self._dirty is not None:
            self._dirty.fill_(self._value)
        lib = native.load()
        if lib is not None:
            lib.moespec_stream_read(self._clean.data_ptr(), self._clean.numel() * 8, torch.get_num_threads())
        else:
            self._clean.sum()


def median_iqr(samples: list[float]) -> tuple[float, float]:
    """(median, interquartile range) of timing samples."""
    q = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else [samples[0]] * 3
    return q[1], q[2] - q[0]


def last_level_cache() -> int:
    """Bytes of the CPU's largest cache as sysfs reports it (0 where it cannot be read). A virtual machine may be
    shown its whole socket's cache, of which it keeps far less (kept_cache measures what it keeps)."""
    llc = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip()
            llc = max(llc, int(size.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(size[-1:], 0))
        except (OSError, ValueError):
            continue
    return llc


def kept_of(reread_gbps: dict[int, float], memory_gbps: float, llc: int) -> int:
    """The cache a process keeps, from the re-read rate of buffers of several sizes (bytes -> GB/s) and memory's rate:
    the smallest size whose re-read is under CACHED_SPEEDUP x memory's rate (the cache no longer serves it whole), at
    most llc; llc where every size is served."""
    if not reread_gbps or not all(size >= 1 and gbps > 0 for size, gbps in reread_gbps.items()):
        raise ArgumentError(f"reread_gbps must map buffer sizes >= 1 byte to positive rates, got {show(reread_gbps)}")
    if not memory_gbps > 0:
        raise ArgumentError(f"memory_gbps must be positive, got {show(memory_gbps)}")
    if isinstance(llc, bool) or not isinstance(llc, int) or llc < 1:
        raise ArgumentError(f"llc must be a whole number of bytes >= 1, got {show(llc)}")
    return min([size for size, gbps in reread_gbps.items() if gbps < CACHED_SPEEDUP * memory_gbps] + [llc])


@functools.lru_cache(maxsize=None, typed=True)  # typed: kept_cache(True) is refused, not kept_cache(1)'s answer
def kept_cache(llc: int | None = None) -> int:
    """Bytes of cache this process keeps, measured once (kept_of): each power-of-two buffer from KEPT_PROBE_MIN up to
    llc (default last_level_cache()) read twice, the second read's best of KEPT_PROBE_READS against the best read of
    a buffer of twice llc, which no cache keeps. A virtual machine shown its socket's 480 MiB keeps ~100-250 MiB of
    it (128 or 256 MiB by this rule from one process to the next: a 128 MiB re-read sits near CACHED_SPEEDUP), so a
    flush sized on the reported cache would write 2-4x what evicts; llc itself where the native reader or sysfs is
    missing, or llc is under the probe's smallest size."""
    if llc is not None and (isinstance(llc, bool) or not isinstance(llc, int) or llc < 0):
        raise ArgumentError(f"llc must be None or a whole number of bytes >= 0, got {show(llc)}")
    llc = last_level_cache() if llc is None else llc
    if native.load() is None or llc < KEPT_PROBE_MIN:
        return llc
    best = lambda nbytes: max(measure_stream_read(nbytes, KEPT_PROBE_READS))  # noqa: E731 - after one untimed read
    sizes = [KEPT_PROBE_MIN << i for i in range((llc // KEPT_PROBE_MIN).bit_length()) if KEPT_PROBE_MIN << i <= llc]
    return kept_of({size: best(size) for size in sizes}, best(FLUSH_LLC_MULTIPLE * llc), llc)


def flush_bytes() -> int:
    """FLUSH_LLC_MULTIPLE x the cache this process keeps (kept_cache), at least FLUSH_MIN_BYTES."""
    return max(FLUSH_LLC_MULTIPLE * kept_cache(), FLUSH_MIN_BYTES)


# /proc/cpuinfo's fields that tell apart CPUs a hypervisor names alike ("AMD EPYC" is a Zen 1 and a Zen 3 guest,
# whose fp32 matmul rates differ ~3x), as the device string names them
CPU_IDENTITY = (("cpu family", "family"), ("model", "model"), ("stepping", "stepping"))


def cpu_identity(cpuinfo: str) -> str | None:
    """'<model name> (family F model M stepping S)' of the first processor in /proc/cpuinfo's text, the fields it
    has (none on some architectures: the model name alone); None where it names no model."""
    block = cpuinfo.split("\n\n", 1)[0]
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())}
    if not fields.get("model name"):
        return None
    ident = " ".join(f"{label} {fields[key]}" for key, label in CPU_IDENTITY if fields.get(key))
    return f"{fields['model name']} ({ident})" if ident else fields["model name"]


def device_name() -> str:
    """'cpu: <model name> (family F model M stepping S), <threads> threads' (cpu_identity; torch's intra-op threads,
    which our kernels use): what a device profile must match (moespec.predict.structure_bench.check_profile)."""
    try:
        name = cpu_identity(Path("/proc/cpuinfo").read_text())
    except OSError:
        name = None
    return f"cpu: {name or platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def cuda_device_name(device: str) -> str:
    """'cuda: <name>, sm<major><minor>, <memory> GiB' of a CUDA device (what a CudaTimer records as its device)."""
    props = torch.cuda.get_device_properties(device)
    return f"cuda: {props.name}, sm{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB"


# ---- timers --------------------------------------------------------------------------------------------------
class Timer(ABC):
    """How a timed call is measured on one device: `flush()` before it, `time(fn)` around it, `ceiling()` beside.

    device: the torch device string; kind: "cpu" or "cuda"; name: the device in words; flush_bytes: the bytes
    the flush writes; cache_bytes: the last-level cache's size (the CPU's L3, the GPU's L2); timer_name: the clock;
    ceiling_kind: what the ceiling measures (module docstring); late_starts: timed calls whose device may have waited
    on the host's launches inside the timed span (CudaTimer.time; none on the CPU, whose calls are synchronous)."""

    device: str
    kind: str
    name: str
    flush_bytes: int
    cache_bytes: int
    late_starts: int = 0
    timer_name: str
    ceiling_kind: str

    @abstractmethod
    def flush(self) -> None:
        """Evict every cache line the device's memory traffic could reuse, leaving clean lines only."""

    @abstractmethod
    def time(self, fn: Callable[[], object]) -> float:
        """Seconds one call of fn takes on the device."""

    def warm(self, fn: Callable[[], object]) -> None:
        """Run fn untimed just before a timed call of it, so that call finds its data in the cache (a hot call)."""
        fn()

    @abstractmethod
    def sampler(self, nbytes: int | None = None) -> Callable[[], float]:
        """A ceiling measurement to call again and again: each call returns GB/s on one nbytes buffer (default: the
        kind's size), allocated once (on the CPU once per timer and size)."""

    def ceiling(self, nbytes: int | None = None, repeats: int = CEILING_REPEATS) -> list[float]:
        """GB/s of `repeats` ceiling measurements on an nbytes buffer (default: the kind's size), after one untimed."""
        return _repeated(self.sampler(nbytes), repeats)


class CpuTimer(Timer):
    """perf_counter around the call, CacheFlusher before it, a streaming read as the ceiling."""

    kind, timer_name, ceiling_kind = "cpu", "perf_counter", "streaming read"

    def __init__(self) -> None:
        self.device, self.name, self.flush_bytes = "cpu", device_name(), flush_bytes()
        self.cache_bytes = self.flush_bytes // FLUSH_LLC_MULTIPLE  # the last-level cache (at least the floor's half)
        self._flusher = CacheFlusher(self.flush_bytes)
        # one buffer per size for the timer's life: every ceiling sample reads the same memory (a VM backs two
        # buffers at steadily different rates, moespec.measure.placement), and 256 MiB of random words take ~0.3 s
        # to draw
        self._reads: dict[int, StreamRead] = {}

    def flush(self) -> None:
        self._flusher()

    def time(self, fn: Callable[[], object]) -> float:
        start = perf_counter()
        fn()
        return perf_counter() - start

    def sampler(self, nbytes: int | None = None) -> Callable[[], float]:
        nbytes = nbytes or STREAM_READ_BYTES
        if nbytes not in self._reads:
            self._reads[nbytes] = StreamRead(nbytes)
        return self._reads[nbytes]


class CudaTimer(Timer):
    """CUDA events around the call, an L2 flush (write, then clean read) before it, a device copy as the ceiling."""

    kind, timer_name, ceiling_kind = "cuda", "cuda events", "device-to-device copy"

    def __init__(self, device: str) -> None:
        self.device = device
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", 0) or GPU_L2_FALLBACK_BYTES
        self.name, self.cache_bytes = cuda_device_name(device), l2
        self.flush_bytes = max(FLUSH_LLC_MULTIPLE * l2, GPU_FLUSH_WRITE_MIN_BYTES)
        clean = max(FLUSH_LLC_MULTIPLE * l2, GPU_FLUSH_READ_MIN_BYTES)
        self._dirty = torch.empty(self.flush_bytes // 4, dtype=torch.float32, device=device)
        self._clean = torch.ones(clean // 4, dtype=torch.float32, device=device)
        self._value, self._lead_cycles, self.late_starts, self._led = 0.0, 0, 0, False
        self.time(lambda: torch.cuda._sleep(GPU_CLOCK_WARM_SPINS * GPU_SLEEP_CALIBRATION_CYCLES))
        self._cycles_per_s = max(GPU_SLEEP_CALIBRATION_CYCLES / self.time(
            lambda: torch.cuda._sleep(GPU_SLEEP_CALIBRATION_CYCLES)) for _ in range(GPU_CALIBRATIONS))
        self._lead_cycles = int(GPU_LAUNCH_LEAD_S * self._cycles_per_s)

    def flush(self) -> None:
        self._value += 1.0
        with torch.cuda.device(self.device):
            self._dirty.fill_(self._value)
            self._clean.sum()
            self._lead()

    def warm(self, fn: Callable[[], object]) -> None:
        with torch.cuda.device(self.device):
            fn()
            self._lead()  # the device spins while the host launches the timed call, as after a flush

    def _lead(self) -> None:
        if self._lead_cycles:
            torch.cuda._sleep(self._lead_cycles)
            self._led = True

    def time(self, fn: Callable[[], object]) -> float:
        """As Timer.time; after a lead (flush or warm), a device that reached the start event before the host had
        launched fn's work may have idled inside the timed span: counted in late_starts, and the lead doubled."""
        led, self._led = self._led, False
        with torch.cuda.device(self.device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            if led and start.query():
                self.late_starts += 1
                self._lead_cycles = min(2 * self._lead_cycles, int(GPU_LEAD_MAX_S * self._cycles_per_s))
            end.record()
            end.synchronize()
        return start.elapsed_time(end) / 1e3

    def sampler(self, nbytes: int | None = None) -> Callable[[], float]:
        nbytes = nbytes or COPY_BYTES
        src = torch.ones(nbytes, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        dst.copy_(src)  # untimed: pages in both buffers
        return lambda: 2 * nbytes / self.time(lambda: dst.copy_(src)) / 1e9


def matmul_dtype(dtype: torch.dtype, device: str) -> torch.dtype:
    """The dtype the compute ceiling of `dtype` work is timed in: `dtype` itself, except bf16 or fp16 on a CPU where
    torch's oneDNN has no GEMM for it (no AVX512-BW/VL/DQ, AVX512-FP16 or AVX-NE-CONVERT: an AVX2 CPU), where torch
    falls back to a loop of ~0.1 GFLOP/s and every kernel multiplies 16-bit weights widened to fp32, at fp32's rate
    at best: the ceiling there is fp32's."""
    if device != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        return dtype
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported" if dtype == torch.bfloat16
                    else "_is_mkldnn_fp16_supported", None)
    native = torch.backends.mkldnn.is_available() and probe is not None and bool(probe())
    return dtype if native else torch.float32


def matmul_peak(timer: Timer, dtype: torch.dtype, repeats: int = CEILING_REPEATS) -> list[float]:
    """GFLOP/s of `repeats` timed torch.matmul products of MATMUL_SHAPE in `matmul_dtype(dtype)` on the timer's
    device, after one warm-up call: the compute ceiling a compute-bound pass of `dtype` work is judged against (2 M K
    N FLOPs a product)."""
    m, k, n = MATMUL_SHAPE
    dtype = matmul_dtype(dtype, timer.device)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dtype).to(timer.device)
    b = torch.randn(k, n, generator=gen).to(dtype).to(timer.device)
    torch.matmul(a, b)
    return [2 * m * k * n / timer.time(lambda: torch.matmul(a, b)) / 1e9 for _ in range(repeats)]


def timer_for(device: str) -> Timer:
    """The Timer of a device named as `resolve_device` accepts it."""
    device = resolve_device(device)
    return CpuTimer() if device == "cpu" else CudaTimer(device)
