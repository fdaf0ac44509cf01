"""Routing from llama.cpp (moespec.routing.llama_tracer, moespec.model.llama_cpp): reading a ggml tensor of
llama.cpp's graph (strided rows, as a top-k view of a wider argsort), and `trace --gguf`'s refusals in one line.
Tracing itself needs llama-cpp-python (not installed in CI); it was checked against the Hugging Face tracer on
the benchmark's model (results/llama-cpp/README.md)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from cli_cases import refused

from moespec import MoespecError
from moespec.model.llama_cpp import GGML_F32, GGML_I32, GgmlTensor, bindings


def fake(array: np.ndarray, cols: int, kind: int, name: bytes = b"ffn_moe_topk-0") -> GgmlTensor:
    """A ggml tensor over the first `cols` columns of a C-contiguous [rows, N] array: ne = [cols, rows], row stride
    N elements (how ggml_top_k's view of an argsort looks)."""
    t = GgmlTensor()
    t.type, t.name = kind, name
    t.ne[0], t.ne[1], t.ne[2], t.ne[3] = cols, array.shape[0], 1, 1
    t.nb[0], t.nb[1] = array.itemsize, array.strides[0]
    t.nb[2] = t.nb[3] = array.nbytes
    t.data = array.ctypes.data_as(ctypes.c_void_p)
    return t


@pytest.mark.parametrize("dtype, kind", [(np.int32, GGML_I32), (np.float32, GGML_F32)])
def test_a_strided_view_reads_row_by_row(dtype, kind):
    full = np.arange(5 * 64, dtype=dtype).reshape(5, 64)  # argsort of 64 experts for 5 tokens
    got = fake(full, 8, kind).matrix()
    np.testing.assert_array_equal(got, full[:, :8])
    assert got.flags.owndata or got.base is not full  # a copy: llama.cpp reuses its buffers


def test_other_tensors_are_refused():
    full = np.zeros((2, 4), dtype=np.float64)
    with pytest.raises(MoespecError, match="not a 2-D f32/i32 tensor"):
        fake(full, 4, 1).matrix()  # ggml type 1 (f16) is not read


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama-cpp-python is installed")
def test_without_llama_cpp_python_one_line(tmp_path: Path, capsys):
    with pytest.raises(MoespecError, match="llama-cpp-python cannot be imported"):
        bindings()


def test_trace_gguf_refusals(tmp_path: Path, capsys):
    text = tmp_path / "doc.txt"
    text.write_text("the cat sat on the mat\n")
    out = tmp_path / "t.npz"
    assert "not a readable GGUF" in refused(["trace", "--gguf", text, "--text", text, "--out", out], capsys,
                                            tmp_path)
    # no CUDA device: "--device cuda: no CUDA device here"; with one: "a GGUF is traced by llama.cpp on the CPU"
    assert "--device cuda" in refused(["trace", "--gguf", text, "--text", text, "--out", out, "--device", "cuda"],
                                      capsys, tmp_path)
    assert "not allowed with" in refused(["trace", "--gguf", text, "--model", tmp_path, "--text", text,
                                          "--out", out], capsys, tmp_path)
