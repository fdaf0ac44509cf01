"""llama.cpp for the side-by-side benchmark (benchmarks/llama_cpp_verify.py): its source, the llama-bench binary,
and the engine's model exported to GGUF (moespec.model.gguf_export)."""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from moespec.defaults import MODEL
from moespec.model import gguf_export
from moespec.model.load import PRESET_VOCAB, load_model

FORMAT = "bf16"  # the exported GGUF's type, the engine's dtype and the byte model's format
LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp we build and convert with
BUILD_TIMEOUT_S = 3600  # a cold llama-bench build takes ~10 minutes on 2 cores

class Skip(Exception):
    """Why the llama.cpp side cannot run here (one line)."""



def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)



def is_source(path: Path) -> bool:
    return (path / "convert_hf_to_gguf.py").is_file() and (path / "tools" / "llama-bench").is_dir()


def llama_source(args: argparse.Namespace, work: Path, bench: Path | None, fetch: bool) -> Path:
    """llama.cpp's source tree: --llama-src, a tree holding the binary (build/bin/llama-bench inside it), one
    unpacked in WORK/src, or (fetch) the llama-cpp-python sdist's vendored tree, downloaded with pip."""
    if args.llama_src:
        if not is_source(Path(args.llama_src)):
            raise Skip(f"--llama-src {args.llama_src}: no llama.cpp source tree (convert_hf_to_gguf.py, tools/)")
        return Path(args.llama_src)
    candidates = list(bench.resolve().parents) if bench else []
    candidates += sorted((work / "src").glob("llama_cpp_python-*/vendor/llama.cpp"), reverse=True)
    for path in candidates:
        if is_source(path):
            return path
    if not fetch:
        raise Skip("no llama.cpp source to convert the model with (give --llama-src DIR)")
    dest = work / "src"
    dest.mkdir(parents=True, exist_ok=True)
    say(f"llama.cpp: fetching llama-cpp-python=={LLAMA_CPP_PYTHON} (its vendored llama.cpp) into {dest}")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                          f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(dest)],
                         check=False, capture_output=True, text=True)
    sdists = sorted(dest.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
    if got.returncode or not sdists:
        tail = (got.stderr or got.stdout).strip().splitlines()[-1:] or ["pip gave no output"]
        raise Skip(f"could not fetch llama-cpp-python=={LLAMA_CPP_PYTHON} with pip: {tail[0]}")
    with tarfile.open(sdists[0]) as tar:
        tar.extractall(dest, filter="data")
    path = dest / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if not is_source(path):
        raise Skip(f"{sdists[0]}: no vendored llama.cpp source in it")
    return path


def build_llama_bench(src: Path, work: Path, threads: int) -> Path:
    """cmake-build the llama-bench target of `src` in WORK/build (native CPU flags, Release); the log in
    WORK/build.log."""
    if shutil.which("cmake") is None:
        raise Skip("no llama-bench binary (--llama-bench) and no cmake to build one")
    build, log = work / "build", work / "build.log"
    say(f"llama.cpp: building llama-bench from {src} in {build} (about 10 minutes on 2 cores; log {log})")
    steps = [["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
              "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
             ["cmake", "--build", str(build), "-j", str(threads), "--target", "llama-bench"]]
    with log.open("w") as out:
        for step in steps:
            try:
                code = subprocess.run(step, check=False, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=BUILD_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            if code:
                raise Skip(f"building llama-bench failed ({' '.join(step[:2])}: {code}; see {log})")
    binary = build / "bin" / "llama-bench"
    if not binary.is_file():
        raise Skip(f"the build finished without {binary} (see {log})")
    return binary


def llama_bench(args: argparse.Namespace, work: Path, threads: int) -> Path:
    """The llama-bench binary, checked to time a pass at a depth (-d/--n-depth)."""
    if args.llama_bench:
        binary = Path(args.llama_bench)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise Skip(f"--llama-bench {binary}: not an executable file")
    elif (work / "build" / "bin" / "llama-bench").is_file():
        binary = work / "build" / "bin" / "llama-bench"
    elif args.no_build:
        raise Skip(f"no llama-bench binary (--llama-bench PATH, or one in {work / 'build/bin'}) and --no-build")
    else:
        binary = build_llama_bench(llama_source(args, work, None, fetch=True), work, threads)
    usage = subprocess.run([str(binary), "--help"], check=False, capture_output=True, text=True, timeout=60)
    if "--n-depth" not in usage.stdout + usage.stderr:
        raise Skip(f"{binary} has no -d/--n-depth, so it cannot time a pass at depth {args.depth}")
    return binary


def export_gguf(args: argparse.Namespace, work: Path) -> Path:
    """The engine's model as a bf16 GGUF in WORK (made once per preset, layers and seed by moespec export, whose
    tensors are byte for byte those of llama.cpp's own convert_hf_to_gguf.py; --gguf takes one as is)."""
    if args.gguf:
        if not Path(args.gguf).is_file():
            raise Skip(f"--gguf {args.gguf}: no such file")
        return Path(args.gguf)
    gguf = work / f"{MODEL}-L{args.layers}-v{PRESET_VOCAB}-seed{args.seed}-{FORMAT}.gguf"
    if gguf.is_file():
        return gguf
    say(f"export: {MODEL} ({args.layers} layers, seed {args.seed}) -> {gguf}")
    lm = load_model(preset=MODEL, layers=args.layers, dtype=FORMAT, seed=args.seed)
    gguf_export.export_gguf(lm, gguf, FORMAT, name=MODEL)
    del lm
    gc.collect()
    return gguf


def changelog_commit(src: Path | None) -> str | None:
    """The llama.cpp commit a llama-cpp-python sdist's CHANGELOG names for its release (src: its vendored tree)."""
    changelog = None if src is None else src.parents[1] / "CHANGELOG.md"
    if changelog is None or not changelog.is_file():
        return None
    text = changelog.read_text(errors="replace")
    section = re.search(rf"## \[{re.escape(LLAMA_CPP_PYTHON)}\](.*?)(?:\n## \[|\Z)", text, re.DOTALL)
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section.group(1)) if section else None
    return found.group(1) if found else None


