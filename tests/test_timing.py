"""moespec.measure.timing: the CPU helpers (streaming read, cache flush, median/IQR), device names checked against the
machine, and the CPU timer's flush, clock and ceiling; the CUDA timer where a GPU is present. No assertion
depends on how fast anything runs beyond a sleep taking at least its own length."""

from __future__ import annotations

import time

import pytest
import torch

from moespec import MoespecError
from moespec.measure import timing

SLEEP_S = 1e-3
REAL_KEPT = timing.kept_cache  # the real probe, taken at collection, before conftest's small_flush pins it
SMALL_CEILING_BYTES = 8 << 20  # enough for a positive rate, quick on any machine
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_measurement_helpers() -> None:
    samples = timing.measure_stream_read(nbytes=SMALL_CEILING_BYTES, repeats=3)
    assert len(samples) == 3 and all(s > 0 for s in samples)
    timing.CacheFlusher(nbytes=1 << 20)()
    timing.CacheFlusher(nbytes=1 << 20, write=False)()  # the read alone (the level's polls)
    assert timing.median_iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0)
    assert timing.median_iqr([2.5]) == (2.5, 0.0)
    assert timing.flush_bytes() >= timing.FLUSH_MIN_BYTES


@pytest.mark.parametrize(("kept", "flush"), [(0, 64 << 20), (16 << 20, 64 << 20), (128 << 20, 256 << 20)])
def test_flush_is_twice_the_kept_cache_and_at_least_the_floor(monkeypatch: pytest.MonkeyPatch, kept: int,
                                                              flush: int) -> None:
    monkeypatch.setattr(timing, "kept_cache", lambda: kept)
    assert timing.flush_bytes() == flush


def test_kept_cache_is_the_smallest_buffer_the_cache_no_longer_serves() -> None:
    mib = 1 << 20
    # a VM shown 480 MiB: 64 MiB re-read at 1.9x memory, 128 MiB at 1.1x -> 128 MiB
    rates = {8 * mib: 58.0, 16 * mib: 57.0, 32 * mib: 56.0, 64 * mib: 55.0, 128 * mib: 32.0, 256 * mib: 24.0}
    assert timing.kept_of(rates, 29.0, 480 * mib) == 128 * mib
    assert timing.kept_of({8 * mib: 90.0, 16 * mib: 80.0, 32 * mib: 60.0}, 30.0, 32 * mib) == 32 * mib  # all kept
    assert timing.kept_of({8 * mib: 45.0, 16 * mib: 36.0}, 30.0, 32 * mib) == 16 * mib  # 1.2x: not kept
    for rates, memory, llc, name in (({}, 30.0, mib, "reread_gbps"), ({mib: 0.0}, 30.0, mib, "reread_gbps"),
                                     ({0: 9.0}, 30.0, mib, "reread_gbps"), ({mib: 9.0}, 0.0, mib, "memory_gbps"),
                                     ({mib: 9.0}, 9.0, 0, "llc"), ({mib: 9.0}, 9.0, 1.5, "llc")):
        with pytest.raises(ValueError, match=name):
            timing.kept_of(rates, memory, llc)
    for llc in (-1, 2.0, True):
        with pytest.raises(ValueError, match="llc"):
            REAL_KEPT(llc)


def test_kept_cache_measures_a_power_of_two_within_the_cache() -> None:
    assert REAL_KEPT(4 << 20) == 4 << 20  # under the probe's smallest buffer: the cache as given
    kept = REAL_KEPT(16 << 20)
    assert kept in (8 << 20, 16 << 20)


def test_last_level_cache_reads_sysfs() -> None:
    size = timing.last_level_cache()
    assert size >= 0 and (size == 0 or size >= 1 << 10)  # a cache size in bytes, or 0 without sysfs


def cpuinfo(family: int, stepping: int) -> str:
    """/proc/cpuinfo's text of a 2-core guest whose hypervisor names its CPU "AMD EPYC"."""
    block = (f"processor\t: {{}}\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: 1\n"
             f"model name\t: AMD EPYC\nstepping\t: {stepping}\nflags\t\t: fpu avx2 fma\n")
    return block.format(0) + "\n" + block.format(1).replace("AMD EPYC", "another name")


def test_cpu_identity_tells_apart_cpus_named_alike() -> None:
    zen1, zen3 = timing.cpu_identity(cpuinfo(23, 2)), timing.cpu_identity(cpuinfo(25, 1))
    assert zen1 == "AMD EPYC (family 23 model 1 stepping 2)"  # the first processor's block only
    assert zen3 == "AMD EPYC (family 25 model 1 stepping 1)"
    assert timing.cpu_identity("processor\t: 0\nBogoMIPS\t: 50.00\nmodel name\t: Neoverse-N1\n") == "Neoverse-N1"
    assert timing.cpu_identity("processor\t: 0\nmodel\t\t: 1\n") is None  # no model name
    assert timing.device_name().startswith("cpu: ") and timing.device_name().endswith(" threads")


def test_cpu_timer_flushes_times_and_measures_a_ceiling() -> None:
    timer = timing.timer_for("cpu")
    assert isinstance(timer, timing.CpuTimer) and (timer.kind, timer.device) == ("cpu", "cpu")
    assert timer.name.startswith("cpu: ") and timer.name.endswith("threads")
    assert (timer.timer_name, timer.ceiling_kind) == ("perf_counter", "streaming read")
    assert timer.flush_bytes == timing.flush_bytes()
    timer.flush()
    assert timer.time(lambda: time.sleep(SLEEP_S)) >= SLEEP_S
    assert timer.time(lambda: None) > 0
    samples = timer.ceiling(nbytes=SMALL_CEILING_BYTES, repeats=4)
    assert len(samples) == 4 and all(s > 0 for s in samples)
    read = timer.sampler(SMALL_CEILING_BYTES)  # one buffer per size for the timer's life: the samples read one memory
    assert timer.sampler(SMALL_CEILING_BYTES) is read and timer.sampler(2 * SMALL_CEILING_BYTES) is not read


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0"])
def test_resolve_device_accepts_cpu_and_cuda(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert timing.resolve_device(name) == name


@pytest.mark.parametrize("name, problem", [
    ("cuda", "--device cuda: no CUDA device here (torch.cuda.is_available() is False)"),
    ("cuda:0", "--device cuda:0: no CUDA device here"),
    ("gpu", "--device gpu: unknown device; use cpu, cuda or cuda:N"),
    ("cpu:0", "unknown device"),
    ("cuda:", "unknown device"),
    ("cuda:x", "unknown device"),
    ("", "unknown device"),
])
def test_resolve_device_rejects_in_one_line(name: str, problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(MoespecError) as err:
        timing.resolve_device(name)
    assert problem in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(MoespecError):
        timing.timer_for(name)


def test_resolve_device_rejects_a_missing_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(MoespecError, match=r"--device cuda:2: this machine has 2 CUDA device\(s\), cuda:0..cuda:1"):
        timing.resolve_device("cuda:2")


@CUDA
def test_cuda_timer_flushes_times_and_measures_a_ceiling() -> None:
    timer = timing.timer_for("cuda")
    assert isinstance(timer, timing.CudaTimer) and timer.kind == "cuda" and timer.name.startswith("cuda: ")
    assert (timer.timer_name, timer.ceiling_kind) == ("cuda events", "device-to-device copy")
    assert timer.flush_bytes >= timing.GPU_FLUSH_WRITE_MIN_BYTES
    timer.flush()
    a = torch.ones(1 << 24, device="cuda")
    assert timer.time(lambda: a.mul_(1.0)) > 0
    samples = timer.ceiling(nbytes=SMALL_CEILING_BYTES, repeats=3)
    assert len(samples) == 3 and all(s > 0 for s in samples)


@pytest.mark.parametrize("has_gemm", [True, False])
def test_the_matmul_peak_counts_two_flops_a_multiply_add(monkeypatch, has_gemm):
    """Each sample is 2 M K N FLOPs over the timer's time of one product; the product really runs in the dtype, or in
    fp32 on a CPU without a bf16 GEMM."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: has_gemm)
    calls = []

    class Fixed(timing.CpuTimer):
        def time(self, fn):
            calls.append(fn())
            return 0.5

    monkeypatch.setattr(timing, "MATMUL_SHAPE", (4, 6, 8))
    samples = timing.matmul_peak(Fixed(), torch.bfloat16, repeats=3)
    assert samples == [2 * 4 * 6 * 8 / 0.5 / 1e9] * 3
    dtype = torch.bfloat16 if has_gemm else torch.float32
    assert [tuple(c.shape) for c in calls] == [(4, 8)] * 3 and all(c.dtype == dtype for c in calls)


@pytest.mark.parametrize("has_gemm", [True, False])
def test_the_compute_ceiling_of_16_bit_work_is_fp32_where_the_cpu_has_no_16_bit_gemm(monkeypatch, has_gemm):
    """An AVX2 CPU: torch's bf16 GEMM is a ~0.1 GFLOP/s loop there, and kernels multiply bf16 widened to fp32."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: has_gemm)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: has_gemm)
    for dtype in (torch.bfloat16, torch.float16):
        assert timing.matmul_dtype(dtype, "cpu") == (dtype if has_gemm else torch.float32)
        assert timing.matmul_dtype(dtype, "cuda:0") == dtype
    assert timing.matmul_dtype(torch.float32, "cpu") == torch.float32
