"""llama.cpp as an engine moespec plans for: tiny Hugging Face models exported to GGUF (moespec.model.gguf_export),
read back with their spec and the bytes of their format, run by llama.cpp with the same logits, traced by llama.cpp
with the same routing, and measured by `run --engine llama.cpp` into a runs.json plan and score read. The tests
that run llama.cpp need llama-cpp-python (an optional peer) and skip without it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_cases import refused
from test_gguf import write as write_bad_gguf
from transformers import AutoModelForCausalLM, MixtralConfig, OlmoeConfig, Qwen3MoeConfig

from moespec import MoespecError, cli
from moespec.formats.benchfile import load_bench
from moespec.formats.runsfile import load_runs
from moespec.model.gguf import read_gguf
from moespec.model.gguf_export import _rope_pairs, export_gguf
from moespec.model.load import LoadedModel
from moespec.model.spec import ModelSpec
from moespec.predict.plan import RUNS_CALIBRATE

gguf = pytest.importorskip("gguf")
HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python (optional peer) is not installed")
VOCAB, HIDDEN = 300, 64  # a vocabulary past the 256 byte symbols; rows a whole number of 32-wide q8_0/q4_0 blocks
COMMON = dict(hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
              max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-5)
CONFIGS = {
    # llama.cpp's olmoe normalizes keys over the hidden size: as many key-value heads as heads
    "olmoe": lambda: OlmoeConfig(**COMMON | {"num_key_value_heads": 4}, num_hidden_layers=2, num_experts=8,
                                 num_experts_per_tok=2, intermediate_size=32),
    "qwen3_moe": lambda: Qwen3MoeConfig(**COMMON, num_hidden_layers=2, num_experts=8, num_experts_per_tok=3,
                                        moe_intermediate_size=32, intermediate_size=48, head_dim=16,
                                        norm_topk_prob=True),
    "mixtral": lambda: MixtralConfig(**COMMON, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                                     intermediate_size=32),
}
BYTES_PER_32 = {"f32": 128, "bf16": 64, "q8_0": 34, "q4_0": 18}  # bytes of 32 weights in each format


def tiny(model_type: str, seed: int = 0, dtype: torch.dtype = torch.float32, config=None) -> LoadedModel:
    """A tiny random model of the class, weights spread wide enough that routing and argmax are not near ties."""
    config = config or CONFIGS[model_type]()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model = model.to(dtype)
    return LoadedModel(model, None, ModelSpec.from_config_dict(config.to_dict(), model_type), "cpu",
                       "fp32" if dtype == torch.float32 else "bf16", f"tiny {model_type}")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """model_type -> an f32 GGUF of tiny(model_type)."""
    folder = tmp_path_factory.mktemp("gguf")
    return {kind: export_gguf(tiny(kind), folder / f"{kind}.gguf", "f32", name=f"tiny-{kind}")[0].path
            for kind in CONFIGS}


# ---- export, read back ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("kind", list(BYTES_PER_32))
def test_export_reads_back_with_its_spec_and_format_bytes(model_type, kind, tmp_path):
    lm = tiny(model_type)
    model, vocabulary = export_gguf(lm, tmp_path / "m.gguf", kind, name="tiny")
    s, want = model.spec, lm.spec
    assert (s.name, s.N, s.m, s.hidden, s.layers, s.expert_width, s.vocab, s.heads, s.kv_heads) == \
        ("tiny", want.N, want.m, want.hidden, want.layers, want.expert_width, want.vocab, want.heads, want.kv_heads)
    assert vocabulary == "constructed byte-level"
    # gate, up and down of one expert: 3 h f weights at the format's bytes per 32
    assert model.expert_bytes(0) == 3 * HIDDEN * want.expert_width // 32 * BYTES_PER_32[kind]
    types = {t.name: t.type for t in model.tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["blk.0.attn_norm.weight"] == "F32"
    assert types["blk.0.ffn_up_exps.weight"] == kind.upper()


def test_bf16_export_keeps_the_weights_bit_for_bit(tmp_path):
    lm = tiny("olmoe", dtype=torch.bfloat16)
    export_gguf(lm, tmp_path / "m.gguf", "bf16")
    tensors = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    fused = lm.model.model.layers[1].mlp.experts.gate_up_proj  # [N, 2f, h]: gate the first half
    for name, want in (("blk.1.ffn_gate_exps.weight", fused[:, :32]), ("blk.1.ffn_up_exps.weight", fused[:, 32:]),
                       ("blk.1.ffn_down_exps.weight", lm.model.model.layers[1].mlp.experts.down_proj)):
        got = np.asarray(tensors[name].data).reshape(-1).view(np.uint16)  # the reader gives the raw bytes
        np.testing.assert_array_equal(got, want.contiguous().view(torch.int16).numpy().view(np.uint16).reshape(-1))


def test_rope_pairs_interleave_the_halves_of_each_head():
    heads, half, cols = 3, 4, 5
    w = torch.arange(heads * 2 * half * cols, dtype=torch.float32).reshape(heads * 2 * half, cols)
    got = _rope_pairs(w, heads).reshape(heads, 2 * half, cols)
    per_head = w.reshape(heads, 2 * half, cols)
    for i in range(half):  # llama.cpp's pair (2i, 2i+1) is transformers' (i, half + i)
        torch.testing.assert_close(got[:, 2 * i], per_head[:, i])
        torch.testing.assert_close(got[:, 2 * i + 1], per_head[:, half + i])


@pytest.mark.parametrize("model_type, change, needle", [
    ("olmoe", {"num_key_value_heads": 2}, "normalizes the keys over the hidden size"),
    ("qwen3_moe", {"mlp_only_layers": [1]}, "dense layers"),
    ("qwen3_moe", {"norm_topk_prob": False}, "renormalizes the top-k weights"),
    ("mixtral", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "rope scaling"),
])
def test_export_refuses_what_llama_cpp_would_compute_otherwise(model_type, change, needle, tmp_path):
    config = CONFIGS[model_type]()
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(MoespecError, match=needle):
        export_gguf(tiny(model_type, config=config), tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_export_refuses_other_architectures_in_one_line(tmp_path, tiny_checkpoints, capsys):
    for kind in ("gpt_oss", "deepseek_v2"):
        err = refused(["export", "--model", tiny_checkpoints[kind], "--out", tmp_path / "m.gguf"], capsys, tmp_path)
        assert f"a {kind} model is not exported" in err and "convert_hf_to_gguf.py" in err
    assert "a directory" in refused(["export", "--preset", "olmoe-1b-7b", "--layers", "1", "--out", tmp_path],
                                    capsys)
    assert "invalid choice" in refused(["export", "--type", "q3", "--out", tmp_path / "m.gguf"], capsys)


@pytest.mark.skipif(HAVE_LLAMA, reason="llama-cpp-python is installed")
def test_q4_k_m_without_llama_cpp_is_one_line(tmp_path, capsys):
    err = refused(["export", "--preset", "olmoe-1b-7b", "--layers", "1", "--vocab", "300", "--type", "q4_K_M",
                   "--out", tmp_path / "m.gguf"], capsys, tmp_path)
    assert "llama-cpp-python" in err


# ---- llama.cpp runs what was exported -------------------------------------------------------------------------
@needs_llama
@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_llama_cpp_computes_the_same_logits(model_type, exported):
    from moespec.model.llama_cpp import LlamaContext

    ids = np.random.default_rng(1).integers(3, VOCAB, size=24).tolist()
    with torch.no_grad():
        want = tiny(model_type).model(torch.tensor([ids])).logits[0].numpy()
    context = LlamaContext(str(exported[model_type]), 64, 2)
    try:
        context.fill(ids, every_logit=True)
        context.decode()
        got = context.logits(len(ids))
        # f16 K and V in llama.cpp's cache: ~1e-3 of the logits' scale
        assert np.abs(got - want).max() < 5e-3 * np.abs(want).max()
        assert (got.argmax(-1) == want.argmax(-1)).all()
        assert context.length == len(ids)
        context.rollback(context.length)
        assert context.forward(ids) == want.argmax(-1).tolist()  # after a full rollback: the same pass again
    finally:
        context.close()


@needs_llama
def test_q4_k_m_through_llama_cpps_quantizer(tmp_path):
    # rows of 256 weights: one K-quant super-block (narrower rows fall back to q5_0 / q8_0)
    config = OlmoeConfig(**COMMON | {"hidden_size": 256, "num_key_value_heads": 4}, num_hidden_layers=1,
                         num_experts=8, num_experts_per_tok=2, intermediate_size=256)
    model, _ = export_gguf(tiny("olmoe", config=config), tmp_path / "m.gguf", "q4_K_M")
    types = {t.name: t.type for t in model.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K" and types["blk.0.ffn_gate_inp.weight"] == "F32"


@needs_llama
@pytest.mark.parametrize("model_type", ["olmoe", "qwen3_moe", "mixtral"])
def test_llama_cpp_routes_as_the_hugging_face_tracer(model_type, exported):
    from moespec.model.load import find_routers
    from moespec.routing.llama_tracer import GgufRouter
    from moespec.routing.tracer import RouterTap, trace_document

    ids = np.random.default_rng(2).integers(3, VOCAB, size=40)
    lm = tiny(model_type)
    tap = RouterTap(find_routers(lm.model, lm.spec), lm.spec.m)
    want, _ = trace_document(lm.model, tap, ids, 16, "cpu")
    tap.close()
    router = GgufRouter(exported[model_type], 16, 2)
    try:
        got, weights = router.trace_document(ids)
    finally:
        router.close()
    same = (np.sort(got, -1) == np.sort(want, -1)).all(-1)
    assert same.mean() >= 0.97, same.mean()  # the rest: near-equal router probabilities in f16 attention
    assert (np.diff(weights, axis=-1) <= 1e-6).all()  # by decreasing probability


# ---- run --engine llama.cpp -------------------------------------------------------------------------------------
RUN = ["--engine", "llama.cpp", "--depth", "24", "--n", "1-3", "--reps", "3", "--max-reps", "4", "--k", "0-2",
       "--prompts", "2", "--tokens", "6", "--threads", "2"]


@needs_llama
def test_run_llama_cpp_oracle_and_draft_gguf(exported, tmp_path, capsys):
    out = tmp_path / "runs.json"
    assert cli.main(["run", *RUN, "--a", "0.5,0.8", "--gguf", str(exported["olmoe"]), "--out", str(out)]) == 0
    runs = load_runs(out)
    assert list(runs["verify_time_s"]) == ["dedup"] and runs["saving_s"] == {} and runs["crossover"] is None
    assert sorted(runs["verify_time_s"]["dedup"]) == ["1", "2", "3"] and runs["engine"] == "llama.cpp"
    assert runs["dtype"] == "fp32" and runs["model"] == "tiny-olmoe"  # the file's format (F32) and general.name
    rows = runs.throughput()
    assert {(r["k"], r["a"]) for r in rows} == {(k, a) for k in range(3) for a in (0.5, 0.8)}
    assert all(r["greedy_exact"] for r in rows) and runs["noise"]["per_n"]["1"]["rounds"] >= 3
    assert "one expert kernel (dedup)" in capsys.readouterr().out
    # a draft GGUF: the target with other weights, so some drafts are rejected; tokens still the target's
    draft = export_gguf(tiny("olmoe", seed=1), tmp_path / "draft.gguf", "f32")[0].path
    out2 = tmp_path / "runs-draft.json"
    assert cli.main(["run", *RUN, "--gguf", str(exported["olmoe"]), "--draft-gguf", draft, "--out", str(out2)]) == 0
    doc = json.loads(out2.read_text())
    assert [r["k"] for r in doc["throughput_draft_model"]] == [0, 1, 2] and doc["throughput"] == []
    assert all(r["greedy_exact"] for r in doc["throughput_draft_model"])
    assert all(0 <= r["realized_acceptance"] <= 1 for r in doc["throughput_draft_model"] if r["k"])


@needs_llama
def test_an_f32_gguf_is_benched_and_run_as_fp32(exported, tmp_path):
    """An f32 file's format has moespec's one name, fp32, in its bench (the file's own format by default) and its
    llama.cpp run, so a plan takes the run beside the bench (the identity plan checks); a runs file that names the
    format as llama.cpp does (f32) loads as fp32, and one that says fp32 as it is."""
    path = str(exported["olmoe"])
    trace, bench, out = (str(tmp_path / name) for name in ("t.npz", "bench.json", "runs.json"))
    assert cli.main(["trace", "--gguf", path, "--max-tokens", "300", "--threads", "1", "--out", trace]) == 0
    assert cli.main(["bench", "--model", path, "--trace", trace, "--n", "1-3", "--layers", "0", "--reps", "1",
                     "--windows", "2", "--u-values", "3", "--out", bench]) == 0
    assert cli.main(["run", *RUN, "--no-throughput", "--gguf", path, "--out", out]) == 0
    doc = json.loads(Path(out).read_text())
    assert load_bench(bench)["dtype"] == doc["dtype"] == "fp32"
    for name in ("f32", "fp32"):
        Path(out).write_text(json.dumps(doc | {"dtype": name}))
        runs = load_runs(out)
        assert runs["dtype"] == "fp32"
        runs.check_identity(load_bench(bench), bench, RUNS_CALIBRATE)


@pytest.mark.parametrize("case, needle", [("dense", "a dense model"), ("truncated", "not a readable GGUF"),
                                          ("arch", "architecture 'mamba'"), ("missing", "no such"),
                                          ("preset", "--preset applies to moespec's engine"),
                                          ("no-engine", "add --engine llama.cpp"),
                                          ("no-gguf", "needs --gguf"), ("device", "--device cuda")])
def test_run_llama_cpp_bad_input_one_line(case, needle, tmp_path, capsys):
    path = tmp_path / "bad.gguf"
    argv = ["run", *RUN, "--gguf", str(path), "--out", str(tmp_path / "runs.json")]
    if case == "dense":
        write_bad_gguf(path, arch="llama", experts=0)
    elif case == "truncated":
        full = write_bad_gguf(tmp_path / "full.gguf").read_bytes()
        path.write_bytes(full[: len(full) // 2])
    elif case == "arch":
        write_bad_gguf(path, arch="mamba")
    elif case == "preset":
        argv += ["--preset", "olmoe-1b-7b"]
    elif case == "no-engine":
        argv.remove("llama.cpp")
        argv.remove("--engine")
    elif case == "no-gguf":
        argv = [a for a in argv if a not in ("--gguf", str(path))]
    elif case == "device":
        argv += ["--device", "cuda"]
    assert needle in refused(argv, capsys)
    assert not (tmp_path / "runs.json").exists()


def test_run_llama_cpp_without_the_bindings_is_one_line(tmp_path, capsys, monkeypatch):
    from moespec.measure import llama_run

    def absent():
        raise MoespecError("llama.cpp is not available: llama-cpp-python cannot be imported (test)")

    monkeypatch.setattr(llama_run, "bindings", absent)
    path = write_bad_gguf(tmp_path / "ok.gguf")
    err = refused(["run", *RUN, "--gguf", str(path), "--out", str(tmp_path / "runs.json")], capsys)
    assert "llama-cpp-python cannot be imported" in err


def test_truncated_export_is_a_layer_skip_draft(tmp_path, capsys):
    folder = tmp_path / "tiny"
    tiny("olmoe").model.save_pretrained(folder)
    out, full = tmp_path / "draft.gguf", tmp_path / "full.gguf"
    assert cli.main(["export", "--model", str(folder), "--truncate", "1", "--type", "f32", "--out", str(out)]) == 0
    assert cli.main(["export", "--model", str(folder), "--type", "f32", "--out", str(full)]) == 0
    model = read_gguf(out)
    assert model.spec.layers == 1 and model.spec.name.endswith("(first 1 layers)")
    assert "blk.1.attn_q.weight" not in {t.name for t in model.tensors}
    same = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(full)).tensors}
    for t in gguf.GGUFReader(str(out)).tensors:  # the same weights: embeddings, layer 0, final norm and head
        np.testing.assert_array_equal(np.asarray(t.data), same[t.name])
    capsys.readouterr()
    assert "--truncate 3" in refused(["export", "--model", folder, "--truncate", "3", "--out", tmp_path / "x.gguf"],
                                     capsys)


def test_staircase_from_runs_and_plan_flags(tmp_path, capsys):
    runs = {"format": "moespec-runs", "format_version": 1, "model": "m", "device_kind": "cpu", "dtype": "bf16",
            "depth": 8, "verify_time_s": {"dedup": {str(n): 0.01 * (1 + 0.05 * n) for n in range(1, 10)}},
            "draft_time_s": {str(k): 0.001 * k for k in range(9)}}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    assert cli.main(["staircase", "--runs", str(path), "--for", "llama.cpp", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = [0.01 * (1 + 0.05 * (k + 1)) + 0.001 * k for k in range(9)]
    assert doc["step_times"] == pytest.approx(want) and doc["llama_cpp"][-1]["flags"].startswith("--spec-draft")
    assert "no verify_time_s.slot" in refused(["staircase", "--runs", path, "--kernel", "slot"], capsys)


def test_each_engine_has_its_own_entry_point(tmp_path):
    from moespec.measure.run import RunConfig, run_engine

    with pytest.raises(MoespecError, match="run_llama_cpp runs llama.cpp"):
        run_engine(RunConfig(out=str(tmp_path / "runs.json"), engine="llama.cpp", gguf=str(tmp_path / "m.gguf")))
    assert not (tmp_path / "runs.json").exists()


# ---- several sequences in one decode (moespec.model.llama_cpp.LlamaSequences) ---------------------------------
@needs_llama
@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_one_decode_of_several_sequences_equals_each_alone(model_type, exported):
    from moespec.model.llama_cpp import LlamaContext, LlamaSequences

    rng = np.random.default_rng(3)
    contexts = [rng.integers(3, VOCAB, size=length).tolist() for length in (20, 7, 33)]  # each at its own length
    tokens = [rng.integers(3, VOCAB, size=n).tolist() for n in (4, 1, 9)]
    path = str(exported[model_type])
    batch = LlamaSequences(path, 4, 48, 2)  # sequence 3 stays empty
    try:
        for seq, ids in enumerate(contexts):
            batch.prefill(seq, ids)
        got = batch.forward(tokens)
        assert batch.lengths == [24, 8, 42, 0]
        for ids, new, logits in zip(contexts, tokens, got):
            alone = LlamaContext(path, 64, 2)
            try:
                alone.forward(ids, last_only=True)
                alone.fill(new, every_logit=True)
                alone.decode()
                want = alone.logits(len(new))
            finally:
                alone.close()
            assert logits.shape == (len(new), VOCAB)
            assert np.abs(logits - want).max() <= 1e-5 * np.abs(want).max()  # one graph either way: f32 order only
        batch.rollback([4, 1, 9])
        assert batch.lengths == [20, 7, 33, 0]
        again = batch.forward(tokens[:2])  # fewer sequences than the context holds: the others untouched
        assert batch.lengths == [24, 8, 33, 0]
        for a, b in zip(again, got):
            np.testing.assert_array_equal(a, b)
    finally:
        batch.close()


@needs_llama
def test_several_sequences_bad_arguments_name_them(exported):
    from moespec.model.llama_cpp import LlamaSequences

    path = str(exported["olmoe"])
    for kwargs, name in (({"sequences": 0}, "sequences"), ({"sequences": True}, "sequences"),
                         ({"sequences": 10**6}, "sequences"), ({"room": 0}, "room"), ({"threads": 0}, "threads")):
        with pytest.raises(ValueError, match=name):
            LlamaSequences(path, **({"sequences": 2, "room": 8, "threads": 2} | kwargs))
    batch = LlamaSequences(path, 2, 8, 2)
    try:
        batch.prefill(0, [5, 6])
        for call, needle in ((lambda: batch.forward([]), r"^tokens must"),
                             (lambda: batch.forward([[1], [2], [3]]), r"^tokens must"),
                             (lambda: batch.forward([[1], []]), r"^tokens\[1\]"),
                             (lambda: batch.forward([[VOCAB]]), r"^tokens\[0\]"),
                             (lambda: batch.forward([[-1]]), r"^tokens\[0\]"),
                             (lambda: batch.forward([[True]]), r"^tokens\[0\]"),
                             (lambda: batch.forward([[1] * 7]), r"^tokens\[0\]: 7 tokens after 2"),
                             (lambda: batch.prefill(2, [1]), r"^seq"),
                             (lambda: batch.prefill(1, []), r"^tokens"),
                             (lambda: batch.rollback([3]), r"^counts"),
                             (lambda: batch.rollback([0, 0, 0]), r"^counts")):
            with pytest.raises(ValueError, match=needle):
                call()
        assert batch.lengths == [2, 0]  # nothing refused changed the caches
        assert len(batch.forward([[1] * 6, [2] * 8])[1]) == 8  # the room is each sequence's own
    finally:
        batch.close()
