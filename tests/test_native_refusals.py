"""Issue 14, class 1: no tensor the native code cannot read reaches it. Every native entry point (the expert
operation, the dense linear layer, the attention) refuses a meta tensor (no memory behind data_ptr) or one on
another device in Python, with an exception naming the argument; a child process doing so ends with that
exception, never a segfault."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from moespec import MoespecError
from moespec import kernels as K
from moespec.kernels import attention, dense, native

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native kernels: {native.status()}")


@pytest.mark.parametrize("where", ["x", "ids", "weights", "gate_up", "down"])
def test_expert_op_refuses_tensors_off_the_weights_device(where):
    x, ids, weights = torch.randn(2, 8), torch.tensor([[0, 1], [1, 2]]), torch.full((2, 2), 0.5)
    gate_up, down = torch.randn(4, 8, 8), torch.randn(4, 8, 4)
    args = {"x": x, "ids": ids, "weights": weights, "gate_up": gate_up, "down": down}
    args[where] = args[where].to("meta")
    for kernel in ("slot", "dedup"):
        with pytest.raises(MoespecError, match="meta"):
            K.expert_op(kernel, args["x"], args["ids"], args["weights"], args["gate_up"], args["down"])


@pytest.mark.parametrize("where", ["x", "weight", "bias"])
def test_dense_linear_refuses_meta(where):
    args = {"x": torch.randn(2, 16), "weight": torch.randn(8, 16), "bias": torch.randn(8)}
    args[where] = args[where].to("meta")
    assert not dense.takes(args["x"], args["weight"], args["bias"])
    with pytest.raises(ValueError, match=f"^{where} is on meta"):
        dense.linear(args["x"], args["weight"], args["bias"])


@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_attention_refuses_meta(where):
    args = {"query": torch.randn(1, 2, 1, 8), "key": torch.randn(1, 2, 4, 8), "value": torch.randn(1, 2, 4, 8)}
    args[where] = args[where].to("meta")
    assert not attention.takes(args["query"], args["key"], args["value"])
    with pytest.raises(ValueError, match=f"^{where} is .* on meta"):
        attention.attention(args["query"], args["key"], args["value"])


CHILD = """
import sys, torch
from moespec import kernels as K
from moespec.kernels import attention, dense
case = sys.argv[1]
try:
    if case == "experts":
        K.expert_op("dedup", torch.randn(2, 8), torch.tensor([[0, 1], [1, 2]]), torch.full((2, 2), 0.5),
                    torch.randn(4, 8, 8).to("meta"), torch.randn(4, 8, 4))
    elif case == "dense":
        dense.linear(torch.randn(2, 16), torch.randn(8, 16).to("meta"))
    else:
        attention.attention(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 4, 8).to("meta"), torch.randn(1, 2, 4, 8))
except Exception as e:  # noqa: BLE001  (the point: an exception, whichever, not a crash)
    print(type(e).__name__)
    sys.exit(3)
"""


@pytest.mark.parametrize("case", ["experts", "dense", "attention"])
def test_a_process_passing_meta_ends_with_the_exception_not_a_segfault(case):
    got = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True, timeout=120)
    assert got.returncode == 3, (got.returncode, got.stderr[-400:])
