"""The bench on quantized experts (issue 15): ggml's kernels, llama.cpp's CPU backend, on the GGUF blocks of a
q8_0 or q4_0 layer (moespec.kernels.peers.ggml_quantized, `moespec bench --dtype q8_0`), and a plan made from
ggml's pair (per token, and over the whole pass) in the place of our slot and dedup kernels.

Tolerance: ggml multiplies q8_0 and q4_0 weights by activations it quantizes to q8_0 itself (one scale per 32
values), so against the float64 product of the dequantized weights the result is off by ~1% of its largest value
(QUANT_TOL)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_cases import refused
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants
from kernel_cases import rel_err

from moespec import MoespecError, cli
from moespec import kernels as K
from moespec.defaults import QUANTIZED
from moespec.formats.benchfile import as_pair_roles, load_bench
from moespec.kernels.peers import GGML_PEERS, ggml_quantized
from moespec.model.spec import ModelSpec

pytestmark = pytest.mark.skipif("ggml-mul_mat_id" not in K.KERNELS, reason="optional peer: pip install ggml-python")

QUANT_TOL = 0.03


def quantized_layer(fmt: str, N=5, d=64, f=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate_up, down = torch.randn(N, 2 * f, d, generator=g) / d ** 0.5, torch.randn(N, d, f, generator=g) / f ** 0.5
    kind = GGMLQuantizationType[fmt.upper()]
    blocks = [torch.from_numpy(gguf_quants.quantize(t.reshape(-1, t.shape[-1]).numpy(), kind)).reshape(
        *t.shape[:-1], -1) for t in (gate_up, down)]
    plain = [torch.from_numpy(gguf_quants.dequantize(b.reshape(-1, b.shape[-1]).numpy(), kind).copy()).reshape(
        t.shape) for b, t in zip(blocks, (gate_up, down))]
    return blocks, plain


@pytest.mark.parametrize("kernel", GGML_PEERS)
@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("n, m", [(1, 2), (4, 3), (9, 2)])
def test_quantized_experts_match_the_dequantized_reference(fmt, kernel, n, m):
    (gate_up, down), (plain_gu, plain_down) = quantized_layer(fmt)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 64, generator=g)
    ids = torch.stack([torch.randperm(5, generator=g)[:m] for _ in range(n)])
    weights = torch.softmax(torch.randn(n, m, generator=g), -1)
    ref = K.reference_float64(x, ids, weights, plain_gu, plain_down)
    assert rel_err(ggml_quantized(kernel, x, ids, weights, gate_up, down, fmt, (5, 64, 32)), ref) < QUANT_TOL


def test_the_pair_computes_the_same_function():
    (gate_up, down), _ = quantized_layer("q8_0")
    x, ids, weights = torch.randn(3, 64), torch.tensor([[0, 1], [1, 2], [0, 4]]), torch.full((3, 2), 0.5)
    a, b = (ggml_quantized(k, x, ids, weights, gate_up, down, "q8_0", (5, 64, 32)) for k in GGML_PEERS)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(kernel="dedup"), "quantized experts run on"),
    (lambda a: a.update(fmt="bf16"), "quantized experts run on"),
    (lambda a: a.update(gate_up=a["gate_up"][:, :, :-1].contiguous()), "gate_up must be contiguous uint8"),
    (lambda a: a.update(down=a["down"].float()), "down must be contiguous uint8"),
    (lambda a: a.update(x=torch.randn(2, 32)), r"x \(2, 32\) must be"),
    (lambda a: a.update(ids=torch.tensor([[0, 7], [1, 2]])), r"expert ids must lie in \[0, 5\)"),
])
def test_bad_quantized_arguments_are_refused_before_ggml(change, match):
    (gate_up, down), _ = quantized_layer("q8_0")
    args = dict(kernel="ggml-mul_mat_id", x=torch.randn(2, 64), ids=torch.tensor([[0, 1], [1, 2]]),
                weights=torch.full((2, 2), 0.5), gate_up=gate_up, down=down, fmt="q8_0", shape=(5, 64, 32))
    change(args)
    with pytest.raises(MoespecError, match=match):
        ggml_quantized(**args)


@pytest.fixture(scope="module")
def q8_bench(bench_argv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("q8") / "bench.json"
    assert cli.main(bench_argv(out, "--dtype", "q8_0")) == 0
    return out


def test_a_q8_0_bench_times_ggmls_pair_on_the_files_bytes(q8_bench, bench_model):
    doc = load_bench(q8_bench)
    spec = ModelSpec.from_dict(doc["spec"])
    assert doc["dtype"] == "q8_0" and set(doc["kernels"]) == set(GGML_PEERS) and doc["pair"] == list(GGML_PEERS)
    assert doc["expert_bytes"] == {str(layer): spec.expert_bytes(layer, "q8_0") for layer in doc["layers"]}
    assert set(doc["r"]) == {str(n) for n in doc["n"]} and all(v > 0 for v in doc["r"].values())
    assert doc["kernels"]["ggml-mul_mat_id"]["kind"] == "dedup" and doc["kernels"]["ggml-per-slot"]["kind"] == "slot"
    assert doc["per_layer"]["0"]["one_token_s"]["kernel"] == "ggml-per-slot"


def test_a_plan_from_ggmls_pair(q8_bench, bench_model, tmp_path):
    """The tiny layer's experts are too small to time (bench.json too_small: plan refuses it, naming why); the
    plan of ggml's pair is made from the same bench with its bandwidths at half the ceiling and its fits' eps at
    0.05, numbers a layer large enough to time gives."""
    out = tmp_path / "plan.json"
    args = ["--trace", str(bench_model["trace"]), "--tau1", "0.01", "--kmax", "2", "--out", str(out)]
    doc = load_bench(q8_bench)
    if doc["too_small"]["flag"]:
        assert cli.main(["plan", "--bench", str(q8_bench), *args]) == 2 and not out.exists()
    for kernel in doc["pair"]:
        doc["kernels"][kernel]["beta_gbps"] = {n: doc["ceiling_gbps"] / 2 for n in doc["kernels"][kernel]["beta_gbps"]}
        doc["eps"][kernel] = 0.05
    timeable = tmp_path / "bench.json"
    timeable.write_text(json.dumps({**doc, "ceiling_by_n_gbps": {}}))
    assert cli.main(["plan", "--bench", str(timeable), *args]) == 0
    plan = json.loads(out.read_text())
    assert plan["kernels"] == {"slot": "ggml-per-slot", "dedup": "ggml-mul_mat_id"} and plan["dtype"] == "q8_0"
    assert set(plan["tau_hat"]) == {"slot", "dedup", "auto"} and plan["llama_cpp"]["policy"] == "dedup"


def test_the_roles_view_renames_the_pair_only(q8_bench):
    doc = load_bench(q8_bench)
    view = as_pair_roles(doc)
    assert set(view["kernels"]) == {"slot", "dedup"} and set(view["eps"]) <= {"slot", "dedup"}
    assert all(set(entry["kernels"]) == {"slot", "dedup"} for entry in view["per_layer"].values())
    assert all(set(by_kernel) <= {"slot", "dedup"} for by_kernel in view["fits"].values())  # the batch map reads them
    layer = next(iter(doc["fits"]))
    assert view["fits"][layer]["dedup"] == doc["fits"][layer]["ggml-mul_mat_id"]
    ours = {**doc, "pair": ["slot", "dedup"]}
    assert as_pair_roles(ours) is ours
    np.testing.assert_allclose(view["kernels"]["dedup"]["beta_gbps"]["2"],
                               doc["kernels"]["ggml-mul_mat_id"]["beta_gbps"]["2"])


def test_load_bench_refuses_a_pair_it_did_not_time(q8_bench, tmp_path):
    doc = json.loads(Path(q8_bench).read_text())
    doc["pair"] = ["slot", "ggml-mul_mat_id"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(MoespecError, match="pair"):
        load_bench(bad)


def test_our_kernels_are_refused_on_quantized_experts(bench_argv, tmp_path, capsys):
    line = refused(bench_argv(tmp_path / "b.json", "--dtype", "q4_0", "--kernels", "slot,ggml-mul_mat_id"), capsys)
    assert "kernel slot cannot run" in line and "q4_0" in line


def test_a_gguf_is_benched_at_its_own_format(monkeypatch):
    from moespec.measure import bench

    class File:
        def __init__(self, fmt):
            self.fmt = fmt

        def expert_format(self):
            return self.fmt

    assert bench.default_dtype("olmoe-1b-7b") == bench.BenchConfig.dtype
    monkeypatch.setattr(bench, "read_gguf", lambda path: File("q8_0"))
    assert bench.default_dtype("m.gguf") == "q8_0"
    monkeypatch.setattr(bench, "read_gguf", lambda path: File("gguf-mixed"))
    with pytest.raises(MoespecError, match="m.gguf: its experts are gguf-mixed.*give --dtype"):
        bench.default_dtype("m.gguf")
