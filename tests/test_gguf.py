"""GGUF files read for moespec (moespec.model.gguf): tiny files written here with the gguf package's writer and
name tables (OLMoE with q8_0 experts, Mixtral as llama.cpp stores it, tied embeddings), their spec equal to the
Hugging Face config's, their bytes the file's own; bad files give one line and exit 2."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cli_cases import refused

from moespec import ArgumentError, MoespecError, cli
from moespec.defaults import BENCH_DTYPES
from moespec.measure.bench import default_dtype
from moespec.model.gguf import read_gguf
from moespec.model.spec import ModelSpec
from moespec.model.weights import format_name

gguf = pytest.importorskip("gguf")
T = gguf.MODEL_TENSOR
HIDDEN, LAYERS, N, M, WIDTH, VOCAB, HEADS, KV_HEADS = 32, 2, 8, 2, 32, 96, 4, 2  # q8_0 blocks: 32 wide


def name(kind, block: int | None = None, part: str = "weight") -> str:
    base = gguf.TENSOR_NAMES[kind]
    return f"{base.format(bid=block) if block is not None else base}.{part}"


def write(path: Path, arch: str = "olmoe", experts: int = N, tied: bool = False, expert_type=None,
          biases: bool = False) -> Path:
    """A GGUF of the test shapes: f32 norms and router, f16 attention, experts in `expert_type` (None: f16);
    `biases`: gpt-oss's expert, router and attention biases, sinks and sliding window."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    if biases:
        w.add_sliding_window(4)
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_feed_forward_length(WIDTH)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(M)
    mat = lambda rows, cols: rng.standard_normal((rows, cols)).astype(np.float16)  # noqa: E731
    w.add_tensor(name(T.TOKEN_EMBD), mat(VOCAB, HIDDEN))
    if not tied:
        w.add_tensor(name(T.OUTPUT), mat(VOCAB, HIDDEN))
    w.add_tensor(name(T.OUTPUT_NORM), np.ones(HIDDEN, dtype=np.float32))
    head = HIDDEN // HEADS
    for b in range(LAYERS):
        for kind, rows in ((T.ATTN_Q, HIDDEN), (T.ATTN_K, KV_HEADS * head), (T.ATTN_V, KV_HEADS * head),
                           (T.ATTN_OUT, HIDDEN)):
            w.add_tensor(name(kind, b), mat(rows, HIDDEN))
        for kind in (T.ATTN_NORM, T.FFN_NORM):
            w.add_tensor(name(kind, b), np.ones(HIDDEN, dtype=np.float32))
        if not experts:
            w.add_tensor(name(T.FFN_UP, b), mat(WIDTH, HIDDEN))
            continue
        w.add_tensor(name(T.FFN_GATE_INP, b), rng.standard_normal((experts, HIDDEN)).astype(np.float32))
        if biases:
            w.add_tensor(name(T.ATTN_SINKS, b), np.zeros(HEADS, dtype=np.float32))
            w.add_tensor(name(T.FFN_GATE_INP, b, "bias"), np.zeros(experts, dtype=np.float32))
            for kind, width in ((T.FFN_GATE_EXP, WIDTH), (T.FFN_UP_EXP, WIDTH), (T.FFN_DOWN_EXP, HIDDEN)):
                w.add_tensor(name(kind, b, "bias"), np.zeros((experts, width), dtype=np.float32))
        for kind, shape in ((T.FFN_GATE_EXP, (experts, WIDTH, HIDDEN)), (T.FFN_UP_EXP, (experts, WIDTH, HIDDEN)),
                            (T.FFN_DOWN_EXP, (experts, HIDDEN, WIDTH))):
            data = rng.standard_normal(shape).astype(np.float32)
            if expert_type is None:
                w.add_tensor(name(kind, b), data.astype(np.float16))
            else:
                w.add_tensor(name(kind, b), gguf.quants.quantize(data, expert_type), raw_dtype=expert_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_olmoe_spec_and_the_files_bytes(tmp_path, tiny_configs):
    g = read_gguf(write(tmp_path / "tiny-olmoe.gguf", expert_type=gguf.GGMLQuantizationType.Q8_0))
    want = ModelSpec.from_config_dict({**tiny_configs["olmoe"].to_dict(), "intermediate_size": WIDTH})
    fields = ("model_type", "hidden", "layers", "num_experts", "top_k", "expert_width", "vocab", "heads",
              "kv_heads", "head_dim", "qk_norm", "tied_embeddings")
    assert {f: getattr(g.spec, f) for f in fields} == {f: getattr(want, f) for f in fields}
    # q8_0 experts: 34 bytes per 32 weights, as the spec's own q8_0 accounting of these shapes
    assert g.expert_bytes(0) == g.expert_bytes(1) == want.expert_bytes(0, "q8_0") == 3 * WIDTH * HIDDEN // 32 * 34
    assert g.W() == 2 * g.expert_bytes(0)
    head = HIDDEN // HEADS
    # per layer: q, k, v, o in f16, two f32 norms, the f32 router; then the head, the final norm, one embedding row
    per_layer = (2 * HIDDEN + 2 * KV_HEADS * head) * HIDDEN * 2 + 2 * HIDDEN * 4 + N * HIDDEN * 4
    assert g.dense_bytes(1) == LAYERS * per_layer + VOCAB * HIDDEN * 2 + HIDDEN * 4 + HIDDEN * 2
    assert g.dense_bytes(3) - g.dense_bytes(1) == 2 * HIDDEN * 2  # one f16 embedding row per extra token
    mW, D, kv = g.byte_model(depth=10, kmax=2)
    assert mW == M * g.W() and D == g.dense_bytes(1) and kv[0] == g.spec.kv_bytes(0, 10, "fp16")
    assert kv[2] == g.spec.kv_bytes(2, 10, "fp16") + g.dense_bytes(3) - g.dense_bytes(1)


def test_mixtral_as_llama_with_experts_and_tied_embeddings(tmp_path):
    g = read_gguf(write(tmp_path / "tiny-mixtral.gguf", arch="llama", tied=True))
    assert g.spec.model_type == "mixtral" and g.spec.tied_embeddings and g.spec.qk_norm == "none"
    untied = read_gguf(write(tmp_path / "untied.gguf", arch="llama"))
    # tied: the whole embedding is the head, read once; untied: a head of the same size plus one embedding row
    assert g.dense_bytes() == untied.dense_bytes() - HIDDEN * 2


def test_gpt_oss_biases_sinks_and_sliding_window(tmp_path, tiny_configs):
    g = read_gguf(write(tmp_path / "tiny-gpt-oss.gguf", arch="gpt-oss", biases=True))
    want = ModelSpec.from_config_dict({**tiny_configs["gpt_oss"].to_dict(), "intermediate_size": WIDTH,
                                       "num_hidden_layers": LAYERS})
    fields = ("model_type", "num_experts", "top_k", "expert_bias", "router_bias", "attention_sinks",
              "sliding_window", "sliding_layers")
    assert {f: getattr(g.spec, f) for f in fields} == {f: getattr(want, f) for f in fields}
    plain = read_gguf(write(tmp_path / "plain.gguf", arch="gpt-oss", biases=True, expert_type=None))
    # an expert's bytes: its f16 gate, up and down plus its f32 biases (gate, up: WIDTH; down: HIDDEN)
    assert plain.expert_bytes(0) == 3 * WIDTH * HIDDEN * 2 + (2 * WIDTH + HIDDEN) * 4
    # the cache as the config's: layer 0 within the 4-token window, so less than without one
    unwindowed = replace(g.spec, sliding_window=None, sliding_layers=())
    assert g.spec.kv_bytes(0, 100, "fp16") == want.kv_bytes(0, 100, "fp16") < unwindowed.kv_bytes(0, 100, "fp16")


@pytest.mark.parametrize("expert_type, named", [("F32", "fp32"), (None, "fp16"), ("BF16", "bf16"), ("Q8_0", "q8_0")])
def test_the_experts_format_has_moespecs_name(tmp_path, expert_type, named):
    """llama.cpp's F32 and F16 experts are moespec's fp32 and fp16 (moespec.model.weights.format_name, the one
    place the names meet), so `bench --model F.gguf` takes an f32 file's format as its own and names it as a run
    and a plan of the file do; the other types keep their names."""
    kind = None if expert_type is None else getattr(gguf.GGMLQuantizationType, expert_type)
    path = write(tmp_path / "m.gguf", expert_type=kind)
    assert read_gguf(path).expert_format() == named
    assert [format_name(n) for n in ("f32", "f16", named, "q4_k")] == ["fp32", "fp16", named, "q4_k"]
    if named in BENCH_DTYPES:
        assert default_dtype(str(path)) == named
    else:  # f16 experts: the bench times none such, and says so in moespec's name
        with pytest.raises(MoespecError, match=f"its experts are {named}; the bench times"):
            default_dtype(str(path))
    with pytest.raises(ArgumentError, match="name: a weight format's name"):
        format_name(32)


def test_spec_cli_prints_the_files_bytes(tmp_path, capsys):
    path = write(tmp_path / "tiny-olmoe.gguf", expert_type=gguf.GGMLQuantizationType.Q8_0)
    assert cli.main(["spec", str(path)]) == 0
    out = capsys.readouterr().out
    assert "N=8, m=2" in out and "the file's formats" in out and "fp16" in out


@pytest.mark.parametrize("case, needle", [("dense", "a dense model"), ("truncated", "not a readable GGUF"),
                                          ("arch", "architecture 'mamba'"), ("folder", "a directory"),
                                          ("format", "--format q8_0")])
def test_bad_files_one_line(case, needle, tmp_path, capsys):
    path = tmp_path / "bad.gguf"
    argv = ["spec", str(path)]
    if case == "dense":
        write(path, arch="llama", experts=0)
    elif case == "truncated":
        full = write(tmp_path / "full.gguf").read_bytes()
        path.write_bytes(full[: len(full) // 2])
    elif case == "arch":
        write(path, arch="mamba")
    elif case == "folder":
        path.mkdir()
    else:
        write(path)
        argv += ["--format", "q8_0"]
    err = refused(argv, capsys, tmp_path)
    assert needle in err
    if case != "format":  # the file itself is refused by the reader, naming it
        assert str(path) in err
        with pytest.raises(MoespecError, match=needle):
            read_gguf(path)
