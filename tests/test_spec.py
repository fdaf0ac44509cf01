"""Model specs and byte accounting: hand-computed numbers, every preset x every format, config.json reading."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from moespec import MoespecError, cli
from moespec.model.spec import PRESETS, SUPPORTED_MODEL_TYPES, ModelSpec
from moespec.model.weights import ALL_FORMATS, FORMATS, matrix_bytes

# The public config.json keys of each preset's checkpoint (the subset the spec reads, as published).
PUBLIC_CONFIGS = {
    "olmoe-1b-7b": {"model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
                    "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64,
                    "num_experts_per_tok": 8, "vocab_size": 50304, "tie_word_embeddings": False,
                    "attention_bias": False, "clip_qkv": None},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                      "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                      "vocab_size": 151936, "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "tie_word_embeddings": False, "sliding_window": None, "use_sliding_window": False},
    "gpt-oss-20b": {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
                    "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                    "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
                    "vocab_size": 201088, "sliding_window": 128, "attention_bias": True,
                    "layer_types": ["sliding_attention", "full_attention"] * 12, "tie_word_embeddings": False},
    "deepseek-v2-lite": {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
                         "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
                         "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2,
                         "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                         "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                         "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400, "topk_method": "greedy",
                         "tie_word_embeddings": False},
    "mixtral-8x7b": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "sliding_window": None,
                     "tie_word_embeddings": False},
}


def write_config(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# -- known numbers -------------------------------------------------------------------------------------
def test_olmoe_expert_and_W_bf16():
    s = ModelSpec.from_name("olmoe-1b-7b")
    assert s.expert_bytes(0, "bf16") == 3 * 2048 * 1024 * 2
    assert s.W("bf16") == 16 * 3 * 2048 * 1024 * 2
    assert (s.N, s.m, s.L) == (64, 8, 16)


def test_olmoe_dense_bytes_bf16_by_hand():
    h, v = 2048, 50304
    per_layer = 4 * h * h * 2 + 2 * h * 2 + 2 * h * 2 + 64 * h * 2  # q k v o, q/k norms, 2 RMSNorms, router
    want = 16 * per_layer + h * 2 + v * h * 2 + h * 2  # + final norm, head, one embedding row
    s = ModelSpec.from_name("olmoe-1b-7b")
    assert s.dense_bytes("bf16") == want
    assert s.dense_bytes("bf16", tokens=9) == want + 8 * h * 2


def test_block_format_numbers():
    mixtral, gpt = ModelSpec.from_name("mixtral-8x7b"), ModelSpec.from_name("gpt-oss-20b")
    assert mixtral.expert_bytes(0, "q8_0") == 3 * 14336 * (4096 // 32) * 34
    assert mixtral.expert_bytes(0, "q4_k") == 3 * 14336 * (4096 // 256) * 144
    biases = (2 * 2880 + 2880)
    assert gpt.expert_bytes(0, "bf16") == 3 * 2880 * 2880 * 2 + biases * 2
    assert gpt.expert_bytes(0, "mxfp4") == 3 * 2880 * 90 * 17 + biases * 4  # biases stay F32
    # 2880 is not a multiple of 256: llama.cpp stores q4_k as q5_0 and q6_k as q8_0
    assert gpt.expert_bytes(0, "q4_k") == 3 * 2880 * 90 * 22 + biases * 4
    assert gpt.expert_bytes(0, "q6_k") == gpt.expert_bytes(0, "q8_0")
    assert matrix_bytes(3, 40, "q4_0") == 3 * 2 * 18  # a partial block is padded


def test_q4_k_m_mix():
    s = ModelSpec.from_name("olmoe-1b-7b")  # 16 layers: more bits at 0, 1, 4, 7, 10, 13, 14, 15
    more = [l for l in range(16) if s.expert_bytes(l, "q4_k_m") > s.expert_bytes(l, "q4_k")]
    assert more == [0, 1, 4, 7, 10, 13, 14, 15]
    gate_up = 2 * 1024 * (2048 // 256) * 144
    assert s.expert_bytes(0, "q4_k_m") == gate_up + 2048 * (1024 // 256) * 210
    assert s.expert_bytes(2, "q4_k_m") == gate_up + 2048 * (1024 // 256) * 144
    assert s.W("q4_k") < s.W("q4_k_m") < s.W("q6_k")
    assert s.dense_bytes("q4_k") < s.dense_bytes("q4_k_m") < s.dense_bytes("q6_k")


def test_kv_bytes():
    olmoe, ds, gpt = (ModelSpec.from_name(n) for n in ("olmoe-1b-7b", "deepseek-v2-lite", "gpt-oss-20b"))
    assert olmoe.kv_bytes(0, 0) == 16 * 1 * 2 * 16 * 128 * 2
    assert olmoe.kv_bytes(3, 512, "fp32") == 16 * 516 * 2 * 16 * 128 * 4
    assert ds.kv_bytes(2, 100) == 27 * 103 * (512 + 64) * 2  # MLA: latent + rope key
    per = 2 * 8 * 64 * 2
    assert gpt.kv_bytes(3, 1000) == 12 * 1004 * per + 12 * (128 + 3) * per  # window on half the layers
    assert gpt.kv_bytes(3, 10) == 24 * 14 * per  # shorter than the window
    assert olmoe.kv_bytes(0, 64, "q8_0") == 16 * 65 * 2 * 16 * (128 // 32) * 34


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_every_preset_every_format(name, fmt):
    s = ModelSpec.from_name(name)
    w = [s.expert_bytes(l, fmt) for l in range(s.L)]
    assert min(w) > 0 and s.W(fmt) == sum(w)
    assert s.dense_bytes(fmt) > 0
    weights = 3 * s.hidden * s.expert_width
    if fmt in FORMATS and FORMATS[fmt][1] == 1:
        assert min(w) >= weights * FORMATS[fmt][0]
    else:  # at least 4 bits a weight for any block format here
        assert weights / 2 < min(w) < weights * 2
    assert s.kv_bytes(1, 128) > s.kv_bytes(0, 128) > 0


def test_preset_shapes():
    ds = ModelSpec.from_name("deepseek-v2-lite")
    assert ds.L == 26 and ds.moe_layers[0] == 1 and ds.mla and ds.q_lora_rank is None
    assert ModelSpec.from_name("Qwen3-30B-A3B").N == 128
    total = {n: (s.W("bf16") * s.N + s.dense_bytes("bf16")) / 2 / 1e9 for n, s in PRESETS.items()}
    # parameter counts in billions (less the embedding table, which D reads one row of): public figures
    for name, billions in {"olmoe-1b-7b": 6.9, "qwen3-30b-a3b": 30.5, "gpt-oss-20b": 20.9,
                           "deepseek-v2-lite": 15.7, "mixtral-8x7b": 46.7}.items():
        embed = PRESETS[name].vocab * PRESETS[name].hidden / 1e9
        assert math.isclose(total[name] + embed, billions, rel_tol=0.02), name


# -- config.json ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(PRESETS))
def test_public_config_gives_the_preset(name, tmp_path):
    spec = ModelSpec.from_config(write_config(tmp_path / "ckpt", PUBLIC_CONFIGS[name]))
    assert spec == PRESETS[name] and spec.name == name


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_round_trip_tiny_config_json(model_type, tiny_configs, tmp_path):
    config = tiny_configs[model_type]
    config.save_pretrained(tmp_path)  # config.json exactly as transformers writes it
    spec = ModelSpec.from_config(tmp_path / "config.json")
    assert spec.model_type == model_type and spec.name == tmp_path.name
    assert (spec.hidden, spec.vocab, spec.top_k) == (32, 96, config.num_experts_per_tok)
    assert spec.num_experts == config.num_experts
    dense = {"qwen3_moe": (1,), "deepseek_v2": (0,)}.get(model_type, ())
    assert spec.dense_layers == dense and spec.L == 2
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.W("bf16") == spec.L * spec.expert_bytes(0, "bf16")


def test_config_errors(tmp_path):
    with pytest.raises(MoespecError, match="no such file"):
        ModelSpec.from_config(tmp_path / "none")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(MoespecError, match="bad/config.json: not readable JSON"):
        ModelSpec.from_config(tmp_path / "bad")
    with pytest.raises(MoespecError, match="model_type 'llama' is not a supported MoE"):
        ModelSpec.from_config(write_config(tmp_path / "llama", {"model_type": "llama"}))
    cfg = dict(PUBLIC_CONFIGS["mixtral-8x7b"])
    del cfg["num_experts_per_tok"]
    with pytest.raises(MoespecError, match="missing key 'num_experts_per_tok' for model_type 'mixtral'"):
        ModelSpec.from_config(write_config(tmp_path / "mix", cfg))
    with pytest.raises(MoespecError, match="top_k < num_experts"):
        ModelSpec.from_config(write_config(tmp_path / "k", PUBLIC_CONFIGS["mixtral-8x7b"] | {"num_experts_per_tok": 8}))


def test_argument_errors():
    s = ModelSpec.from_name("olmoe-1b-7b")
    with pytest.raises(MoespecError, match="unknown model"):
        ModelSpec.from_name("llama-7b")
    with pytest.raises(MoespecError, match="unknown weight format 'q3_k'"):
        s.W("q3_k")
    with pytest.raises(MoespecError, match="MoE layer 16"):
        s.expert_bytes(16, "bf16")
    with pytest.raises(MoespecError, match="k >= 0"):
        s.kv_bytes(-1, 0)
    with pytest.raises(MoespecError, match="KV-cache dtype"):
        s.kv_bytes(0, 0, "q4_k_m")
    with pytest.raises(MoespecError, match="top_k"):
        replace(s, top_k=64)


def test_spec_command(capsys, tmp_path):
    assert cli.main(["spec", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in PRESETS)
    assert cli.main(["spec", "gpt-oss-20b", "--format", "mxfp4", "--json", "--kmax", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["W"] == 24 * doc["expert_bytes"][0] and len(doc["kv"]) == 3
    folder = write_config(tmp_path / "m", PUBLIC_CONFIGS["mixtral-8x7b"])
    assert cli.main(["spec", str(folder)]) == 0 and "mixtral-8x7b" in capsys.readouterr().out
    assert cli.main(["spec", "nonesuch"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_byte_model_folds_the_growth_of_D_into_kv():
    spec = ModelSpec.from_name("olmoe-1b-7b")
    mW, D, kv = spec.byte_model("bf16", depth=512, kmax=3)
    assert mW == 8 * spec.W("bf16") and D == spec.dense_bytes("bf16")
    for k in range(4):  # D + kv[k] is every non-expert byte of a step verifying k+1 tokens
        assert D + kv[k] == spec.dense_bytes("bf16", tokens=k + 1) + spec.kv_bytes(k, 512)
    assert kv[1] - kv[0] == spec.kv_bytes(1, 512) - spec.kv_bytes(0, 512) + 2048 * 2  # one bf16 embedding row
