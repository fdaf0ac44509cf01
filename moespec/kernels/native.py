"""Loader of moespec's native kernels: the expert operation (`moespec/kernels/csrc/expert_kernels.cpp`), the
dense linear layers of a verification pass (`csrc/dense_kernels.cpp`), its attention over the KV cache
(`csrc/attention_kernels.cpp`), its per-token steps, RMSNorm, rotary and the router's top-k
(`csrc/token_kernels.cpp`), and a whole MoE decoder layer composed of them (`csrc/layer_kernels.cpp`), built into
one library.

The sources expose a plain C ABI and include no torch header, so they are compiled with g++ alone in a few
seconds on first use (no ninja, no pybind11, nothing downloaded) and loaded with ctypes. The shared
library is cached under `$MOESPEC_CACHE_DIR` (default `~/.cache/moespec/native`), named by a hash of the
source, the flags and the compiler, and written by an atomic rename so concurrent first uses are safe.

It needs x86-64 with AVX2 and FMA. When the CPU lacks them, no compiler is found, the build fails, or
`MOESPEC_NATIVE=0` is set, `load()` returns None and `status()` says why; moespec.kernels then runs its
pure-torch path, which gives the same results more slowly.

torch is imported first on purpose: its wheel ships an OpenMP runtime with the soname libgomp.so.1, so
the dynamic loader binds this library to that already-loaded runtime and torch and the kernels share one
thread pool instead of two pools spinning against each other on the same cores.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch  # loaded before the library, see the module docstring

from moespec.arguments import whole
from moespec.defaults import THREADS_LIMIT

SOURCES = tuple(Path(__file__).parent / "csrc" / name
                for name in ("expert_kernels.cpp", "dense_kernels.cpp", "attention_kernels.cpp",
                          "token_kernels.cpp", "layer_kernels.cpp"))
HEADERS = tuple(Path(__file__).parent / "csrc" / name  # included by them: part of the build's key
                for name in ("simd_common.h", "expert_tiles.h", "amx_tiles.h", "lane_tiles.h"))
# -O3 for unrolled register tiles, AVX2 + FMA for the 8-lane fp32 FMAs and the bf16 widening,
# -fopenmp for the row-splitting threads; no -march=native, so a cached build is valid on any AVX2 host.
CXXFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-std=c++17", "-shared", "-fPIC")
ABI_VERSION = 2  # of expert_kernels.cpp (moespec_abi_version)
DENSE_ABI_VERSION = 2  # of dense_kernels.cpp (moespec_dense_abi_version)
ATTENTION_ABI_VERSION = 1  # of attention_kernels.cpp (moespec_attention_abi_version)
TOKEN_ABI_VERSION = 1  # of token_kernels.cpp (moespec_token_abi_version)
LAYER_ABI_VERSION = 1  # of layer_kernels.cpp and its LayerArgs (moespec_layer_abi_version)
ABI = (ABI_VERSION, DENSE_ABI_VERSION, ATTENTION_ABI_VERSION, TOKEN_ABI_VERSION, LAYER_ABI_VERSION)
# The dtype codes every entry point of the library takes (0 fp32, 1 bf16): the C side's `dtype` arguments.
DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1}
# A cold build takes ~2-8 s on a 2-core machine; anything past this is a broken toolchain.
BUILD_TIMEOUT_S = 120

_status = "not loaded yet"


def cache_dir() -> Path:
    """Where compiled libraries are kept: $MOESPEC_CACHE_DIR, else $XDG_CACHE_HOME/moespec/native."""
    if os.environ.get("MOESPEC_CACHE_DIR"):
        return Path(os.environ["MOESPEC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "moespec" / "native"


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags (/proc/cpuinfo), None where they cannot be read."""
    try:
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return None
    return frozenset(line.partition(":")[2].split())


def _cpu_supported() -> str | None:
    """None when this CPU runs the kernels, else the reason it cannot."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs x86-64, this is {platform.machine()}"
    flags = cpu_flags()
    if flags is None:
        return "cannot read /proc/cpuinfo to check for AVX2 and FMA"
    missing = {"avx2", "fma"} - flags
    return f"CPU lacks {', '.join(sorted(missing))}" if missing else None


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _build(cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(
        b"".join(s.read_bytes() for s in (*SOURCES, *HEADERS)) + " ".join(CXXFLAGS).encode() + version.encode()
        + ".".join(map(str, ABI)).encode()
    ).hexdigest()[:16]
    folder = cache_dir()
    target = folder / f"moespec_kernels_{key}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *CXXFLAGS, *map(str, SOURCES), "-o", tmp], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"{cxx} failed: {proc.stderr.strip()[-800:]}")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    i64, i32, f32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    lib.moespec_abi_version.restype = i32
    lib.moespec_expert_op.restype = i32
    lib.moespec_expert_op.argtypes = [i32, i32, i32, i32, i32, f32, f32, i64, i64, i64, i64, i64,
                                      ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32]
    lib.moespec_stream_read.restype = ctypes.c_uint64
    lib.moespec_stream_read.argtypes = [ptr, i64, i32]
    lib.moespec_dense_abi_version.restype = i32
    lib.moespec_dense_cpu_has_dot.restype = i32
    lib.moespec_dense_amx.restype = i32
    lib.moespec_linear.restype = i32
    lib.moespec_linear.argtypes = [i32, i32, i32, i32, i64, i64, i64, ptr, i64, ptr, ptr, ptr, i64, i32, i32]
    lib.moespec_attention_abi_version.restype = i32
    lib.moespec_attention.restype = i32
    lib.moespec_attention.argtypes = [i32, *[i64] * 7, ptr, i64, i64, i64, ptr, i64, i64, i64, ptr, i64, i64, i64,
                                      ptr, i64, i64, i64, f32, ptr, i32]
    lib.moespec_token_abi_version.restype = i32
    lib.moespec_rms_norm.restype = i32
    lib.moespec_rms_norm.argtypes = [i32, i64, i64, ptr, i64, ptr, f32, ptr, i64]
    lib.moespec_rope.restype = i32
    lib.moespec_rope.argtypes = [i32, i64, i64, i64, ptr, i64, i64, ptr, ptr]
    lib.moespec_softmax_topk.restype = i32
    lib.moespec_softmax_topk.argtypes = [i32, i64, i64, ptr, i64, i32, i32, ptr, ptr]
    lib.moespec_layer_abi_version.restype = i32
    lib.moespec_decoder_layers.restype = i32
    lib.moespec_decoder_layers.argtypes = [ptr, i64]
    return lib


@lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The compiled kernels (built on first use), or None with the reason in `status()`."""
    global _status
    if os.environ.get("MOESPEC_NATIVE", "1") == "0":
        _status = "disabled by MOESPEC_NATIVE=0"
        return None
    reason = _cpu_supported()
    cxx = _compiler()
    if reason is None and cxx is None:
        reason = "no C++ compiler (g++ or $CXX) found"
    if reason is not None:
        _status = reason
        return None
    try:
        path = _build(cxx)
        lib = _bind(ctypes.CDLL(str(path)))
        found = (lib.moespec_abi_version(), lib.moespec_dense_abi_version(), lib.moespec_attention_abi_version(),
                 lib.moespec_token_abi_version(), lib.moespec_layer_abi_version())
        if found != ABI:
            raise RuntimeError(f"{path} has ABI {'.'.join(map(str, found))}, expected {'.'.join(map(str, ABI))}")
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        _status = f"build or load failed: {err}"
        return None
    _status = f"native ({path})"
    return lib


def check_threads(threads: object) -> None:
    """The OpenMP threads of a native call: None (torch.get_num_threads()) or a whole number in 1..THREADS_LIMIT;
    ArgumentError naming `threads` otherwise."""
    if threads is not None:
        whole("threads", threads, 1, THREADS_LIMIT)


def status() -> str:
    """One line: which implementation `load()` gave and where from, or why the native one is unavailable."""
    load()
    return _status
