"""Hostile model files (issue 31): GGUF metadata of another type or out of range, config.json fields of another type,
out of range or inconsistent, a truncated safetensors checkpoint, npz traces whose members are not the arrays they
should be. Every loader refuses them in one line naming the file (a MoespecError); `spec`, `bench` and `trace --gguf`
exit 2 with that line and write nothing; sizes are bounded, so nothing hangs. Random mutations of the tiny configs
and of a tiny GGUF load into a sane spec or are refused that way."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from cli_cases import one_line, refused, snapshot
from conftest import TINY_BENCH_CONFIG
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moespec import MoespecError, cli, printable
from moespec.formats.trace import load_trace
from moespec.model.gguf import read_gguf
from moespec.model.load import load_model
from moespec.model.spec import PRESETS, SIZES, ModelSpec, summary
from moespec.routing.synth import synthesize

gguf = pytest.importorskip("gguf")
import test_gguf  # noqa: E402 - its writer of tiny GGUF files, once gguf is known to be there
from gguf.gguf_writer import GGUFValue  # noqa: E402

V = gguf.GGUFValueType
DELETE = object()
ARCH = "olmoe"  # test_gguf.write's default architecture: its keys are olmoe.*
EVIL = "evil\n\x1b[31mred\x1b[0m"  # a newline and an ANSI colour escape


def refused_in_one_line(load: Any, path: Path, needle: str = "") -> str:
    """Call `load()`; it must raise a MoespecError of one line naming `path` (and holding `needle`)."""
    with pytest.raises(MoespecError) as info:
        load()
    message = str(info.value)
    assert str(path) in message and "\n" not in message and needle in message, message
    return message


# ---- GGUF -----------------------------------------------------------------------------------------------------
def write_gguf(path: Path, overrides: dict[str, Any]) -> Path:
    """test_gguf.write's tiny OLMoE file with metadata keys replaced by (value, type[, item type]) or DELETEd."""
    class Writer(gguf.GGUFWriter):
        def write_header_to_file(self, *args: Any, **kwargs: Any) -> None:
            for key, value in overrides.items():
                if value is DELETE:
                    self.kv_data[0].pop(key, None)
                else:
                    self.kv_data[0][key] = GGUFValue(*value)
            super().write_header_to_file(*args, **kwargs)

    with mock.patch.object(gguf, "GGUFWriter", Writer):
        return test_gguf.write(path)


BIG_BLOCKS = {f"{ARCH}.block_count": (10**12, V.UINT64)}
GGUF_CASES = {
    "architecture as an array": ({"general.architecture": (["olmoe"], V.ARRAY)}, "general.architecture = ['olmoe']"),
    "float block_count": ({f"{ARCH}.block_count": (2.0, V.FLOAT32)}, "block_count = 2.0 must be an integer"),
    "huge block_count": (BIG_BLOCKS, "block_count = 1000000000000 must be an integer in 1..1,000"),
    "zero heads": ({f"{ARCH}.attention.head_count": (0, V.UINT32)}, "head_count = 0 must be an integer"),
    "boolean experts": ({f"{ARCH}.expert_count": (True, V.BOOL)}, "expert_count = True"),
    "negative top-k": ({f"{ARCH}.expert_used_count": (-1, V.INT32)}, "expert_used_count = -1"),
    "kv heads not dividing heads": ({f"{ARCH}.attention.head_count_kv": (3, V.UINT32)}, "multiple of kv_heads = 3"),
    "name of bad UTF-8": ({"general.name": (b"\xff\xfe", V.STRING)}, "'general.name' unreadable"),
    "name as a number": ({"general.name": (7, V.UINT32)}, "general.name = 7 must be a string"),
    "hidden size missing": ({f"{ARCH}.embedding_length": DELETE}, "embedding_length' missing"),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_metadata_refused_in_one_line(case, tmp_path):
    overrides, needle = GGUF_CASES[case]
    path = write_gguf(tmp_path / "bad.gguf", overrides)
    refused_in_one_line(lambda: read_gguf(path), path, needle)


def test_gguf_name_printed_with_its_control_characters_escaped(tmp_path, capsys):
    path = write_gguf(tmp_path / "evil.gguf", {"general.name": (EVIL, V.STRING)})
    assert read_gguf(path).spec.name == printable(EVIL) == "evil\\n\\x1b[31mred\\x1b[0m"
    assert cli.main(["spec", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.startswith("evil\\n\\x1b[31mred\\x1b[0m (olmoe)")


# ---- config.json ----------------------------------------------------------------------------------------------
def write_config(folder: Path, changes: dict[str, Any], base: dict[str, Any] = TINY_BENCH_CONFIG) -> Path:
    """config.json of `base` with `changes` (DELETE drops a key) in `folder`; NaN and infinities written as JSON's
    Python extension (what json.loads reads back)."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in (base | changes).items() if v is not DELETE}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "config.json"


DEEPSEEK = {"model_type": "deepseek_v2", "hidden_size": 32, "num_hidden_layers": 3, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 16, "intermediate_size": 48, "vocab_size": 96,
            "num_attention_heads": 4, "first_k_dense_replace": 1, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4, "v_head_dim": 8}
QWEN = {"model_type": "qwen3_moe", "hidden_size": 32, "num_hidden_layers": 3, "num_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16, "intermediate_size": 48, "vocab_size": 96,
        "num_attention_heads": 4}
GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 32, "num_hidden_layers": 2, "num_local_experts": 8,
           "num_experts_per_tok": 2, "intermediate_size": 16, "vocab_size": 96, "num_attention_heads": 4,
           "sliding_window": 4}
CONFIG_CASES = {
    "a hundred thousand layers": ({"num_hidden_layers": 100_000}, TINY_BENCH_CONFIG,
                                  "num_hidden_layers = 100000 must be an integer in 1..1,000"),
    "tying as a string": ({"tie_word_embeddings": "false"}, TINY_BENCH_CONFIG, "tie_word_embeddings = 'false'"),
    "more kv heads than heads": ({"num_key_value_heads": 8}, TINY_BENCH_CONFIG, "multiple of kv_heads = 8"),
    "heads not a multiple of kv heads": ({"num_key_value_heads": 3}, TINY_BENCH_CONFIG, "multiple of kv_heads = 3"),
    "expert counts that disagree": ({"num_local_experts": 4}, TINY_BENCH_CONFIG,
                                    "expert counts disagree: num_experts = 8, num_local_experts = 4"),
    "a float size": ({"hidden_size": 64.0}, TINY_BENCH_CONFIG, "hidden_size = 64.0"),
    "a NaN size": ({"intermediate_size": math.nan}, TINY_BENCH_CONFIG, "intermediate_size = nan"),
    "a huge vocabulary": ({"vocab_size": 10**30}, TINY_BENCH_CONFIG, "vocab_size = 10"),
    "model_type as a list": ({"model_type": ["olmoe"]}, TINY_BENCH_CONFIG, "model_type ['olmoe']"),
    "more heads than the hidden size": ({"num_attention_heads": 128}, TINY_BENCH_CONFIG, "no head_dim"),
    "mlp_only_layers outside the layers": ({"mlp_only_layers": [1, 7]}, QWEN, "mlp_only_layers holds [7]"),
    "a negative kv_lora_rank": ({"kv_lora_rank": -1}, DEEPSEEK, "kv_lora_rank = -1"),
    "q_lora_rank of zero": ({"q_lora_rank": 0}, DEEPSEEK, "q_lora_rank = 0"),
    "every layer dense": ({"first_k_dense_replace": 3}, DEEPSEEK, "no MoE layer left"),
    "layer_types of another length": ({"layer_types": ["sliding_attention"] * 5}, GPT_OSS, "each of the 2 layers"),
    "an unknown layer type": ({"layer_types": ["sliding_attention", "x"]}, GPT_OSS, "each of the 2 layers"),
    "attention_bias as a number": ({"attention_bias": 1}, GPT_OSS, "attention_bias = 1 must be true or false"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_fields_refused_in_one_line(case, tmp_path):
    changes, base, needle = CONFIG_CASES[case]
    path = write_config(tmp_path / "m", changes, base)
    refused_in_one_line(lambda: ModelSpec.from_config(path), path, needle)


def test_config_of_another_json_type_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1]")
    refused_in_one_line(lambda: ModelSpec.from_config(path), path, "expected a JSON object")


def test_the_bases_of_the_cases_load():
    for base in (TINY_BENCH_CONFIG, DEEPSEEK, QWEN, GPT_OSS):
        ModelSpec.from_config_dict(base)


def test_a_stored_spec_is_checked_as_a_read_one():
    deepseek = PRESETS["deepseek-v2-lite"].to_dict()
    for changes, needle in (({"kv_lora_rank": -1}, "kv_lora_rank = -1"), ({"tied_embeddings": "no"}, "tied_embeddings"),
                            ({"dense_layers": [[0]]}, "dense_layers"), ({"layers": 10**9}, "layers = 1000000000")):
        with pytest.raises(MoespecError, match=needle):
            ModelSpec.from_dict(deepseek | changes)
    with pytest.raises(MoespecError, match="missing fields"):
        ModelSpec.from_dict({k: v for k, v in deepseek.items() if k != "vocab"})


def test_the_bytes_of_the_most_layers_are_linear_and_unchanged():
    """kv(k) of sliding layers in closed form equals the per-layer sum; a spec of LAYERS_LIMIT layers, most of them
    dense or sliding, gives its summary (the per-layer membership tests were quadratic in the layers)."""
    gpt = PRESETS["gpt-oss-20b"]
    for k, depth in ((0, 0), (3, 100), (8, 10_000)):
        per_layer = sum(min(depth + k + 1, gpt.sliding_window + k) if i in gpt.sliding_layers else depth + k + 1
                        for i in range(gpt.layers))
        assert gpt.kv_bytes(k, depth) == per_layer * 2 * gpt.kv_heads * gpt.head_dim * 2
    most = SIZES["layers"][1]
    wide = replace(gpt, layers=most, sliding_layers=tuple(range(0, most, 2)))
    deep = replace(PRESETS["deepseek-v2-lite"], layers=most, dense_layers=tuple(range(most - 1)))
    assert summary(wide, "bf16", "bf16", 512, 32)["W"] == most * wide.expert_bytes(0, "bf16")
    assert deep.L == 1 and summary(deep, "bf16", "bf16", 512, 32)["expert_bytes"] == [deep.expert_bytes(0, "bf16")]


# ---- the commands: exit 2, one line, nothing written, no hang ---------------------------------------------------
MAIN = "import sys; from moespec import cli; sys.exit(cli.main())"  # the `moespec` entry point


def run_cli(argv: list[str], folder: Path) -> str:
    """`moespec argv` in a child process (a hang ends in its timeout, not in a stuck suite): exit 2, one line on
    stderr, no traceback, nothing on stdout, no file under `folder` created or changed. Returns the line."""
    before = snapshot(folder)
    done = subprocess.run([sys.executable, "-c", MAIN, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    err = one_line(done.stderr)
    assert snapshot(folder) == before
    return err


@pytest.mark.parametrize("command", ["spec", "bench", "trace --gguf"])
def test_commands_refuse_a_gguf_of_a_trillion_blocks(command, tmp_path):
    path = write_gguf(tmp_path / "big.gguf", BIG_BLOCKS)
    argv = {"spec": ["spec", path], "bench": ["bench", "--model", path, "--out", tmp_path / "bench.json"],
            "trace --gguf": ["trace", "--gguf", path, "--out", tmp_path / "trace.npz"]}[command]
    err = run_cli([str(a) for a in argv], tmp_path)
    assert str(path) in err and "block_count = 1000000000000" in err


def test_commands_refuse_a_config_of_a_hundred_thousand_layers(tmp_path, capsys):
    path = write_config(tmp_path / "m", {"num_hidden_layers": 100_000})
    for err in (run_cli(["spec", str(path.parent)], tmp_path),  # in a child: where the hang was
                refused(["bench", "--model", path.parent, "--out", tmp_path / "bench.json"], capsys, tmp_path)):
        assert str(path) in err and "num_hidden_layers = 100000" in err


def test_bench_refuses_experts_larger_than_the_memory_before_drawing_them(tmp_path, capsys):
    """Inside every size bound, yet 8 x 3 x 131072^2 bf16 weights (768 GiB) for one layer: one line, no allocation."""
    path = write_config(tmp_path / "m", {"hidden_size": 131_072, "intermediate_size": 131_072,
                                         "num_attention_heads": 1024})
    err = refused(["bench", "--model", path.parent, "--out", tmp_path / "bench.json"], capsys, tmp_path)
    assert "one MoE layer's experts take 768.0 GiB in bf16" in err and "free on cpu" in err


@pytest.mark.parametrize("case", ["zero heads", "architecture as an array", "float block_count"])
def test_spec_command_refuses_bad_gguf_metadata(case, tmp_path, capsys):
    path = write_gguf(tmp_path / "bad.gguf", GGUF_CASES[case][0])
    assert str(path) in refused(["spec", path], capsys, tmp_path)


# ---- a truncated checkpoint -------------------------------------------------------------------------------------
def test_truncated_safetensors_named_in_one_line(tiny_configs, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "ckpt"
    AutoModelForCausalLM.from_config(tiny_configs["olmoe"]).save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()  # the writer's progress bar
    refused_in_one_line(lambda: load_model(path=str(folder), dtype="fp32"), weights, "not a readable safetensors")
    err = refused(["trace", "--model", folder, "--out", tmp_path / "trace.npz"], capsys, tmp_path)
    assert str(weights) in err


# ---- npz traces -------------------------------------------------------------------------------------------------
def write_members(path: Path, members: dict[str, Any]) -> Path:
    """A zip of `members`: arrays saved as .npy, bytes as they are."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, value in members.items():
            if isinstance(value, np.ndarray):
                buffer = io.BytesIO()
                np.save(buffer, value)
                value = buffer.getvalue()
            archive.writestr(name, value)
    return path


@pytest.fixture(scope="module")
def trace_arrays(tmp_path_factory) -> dict[str, np.ndarray]:
    """The members of a valid small trace (with router weights), by name."""
    folder = tmp_path_factory.mktemp("trace")
    write_config(folder / "m", {})
    trace = synthesize(str(folder / "m"), "uniform", 30, 3, seed=0)
    trace = type(trace).from_arrays(trace.experts, trace.doc_starts, trace.num_experts,
                                    np.full(trace.experts.shape, 0.5, np.float32), trace.meta)
    with np.load(trace.save(folder / "t.npz")) as npz:
        return {name: npz[name] for name in npz.files}


TRACE_CASES = {
    "2-D doc_starts": (lambda a: a | {"doc_starts.npy": a["doc_starts.npy"][None, :]}, "doc_starts must be a 1-D"),
    "0-D doc_starts": (lambda a: a | {"doc_starts.npy": np.array(0)}, "doc_starts must be a 1-D"),
    "header not .npy": (lambda a: a | {"header.npy": b"{}"}, "member 'header' is not a .npy array"),
    "weights not .npy": (lambda a: a | {"weights.npy": b"garbage"}, "member 'weights' is not a .npy array"),
    "float expert ids": (lambda a: a | {"experts.npy": a["experts.npy"].astype(np.float32)},
                         "experts must be a 3-D array of integers"),
    "2-D weights": (lambda a: a | {"weights.npy": a["weights.npy"][:, 0]}, "weights must be a 3-D array of floats"),
    "an unknown member": (lambda a: a | {"evil\x1b.npy": a["header.npy"]}, "unexpected arrays evil\\x1b"),
}


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_trace_members_refused_in_one_line(case, trace_arrays, tmp_path, capsys):
    change, needle = TRACE_CASES[case]
    members = change({f"{name}.npy": array for name, array in trace_arrays.items()})
    path = write_members(tmp_path / "bad.npz", members)
    refused_in_one_line(lambda: load_trace(path), path, needle)
    assert str(path) in refused(["reuse", path], capsys, tmp_path)


def test_the_trace_members_as_written_load(trace_arrays, tmp_path):
    path = write_members(tmp_path / "good.npz", {f"{name}.npy": array for name, array in trace_arrays.items()})
    assert load_trace(path).weights is not None


# ---- random mutations -------------------------------------------------------------------------------------------
SETTINGS = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def sane(spec: ModelSpec, summary_of: dict[str, Any]) -> None:
    """A loaded spec within its bounds, with whole, positive byte counts that JSON holds, round-tripping."""
    for key, (least, most) in SIZES.items():
        value = getattr(spec, key)
        assert value is None or least <= value <= most, (key, value)
    assert printable(spec.name) == spec.name
    json.dumps(summary_of, allow_nan=False)
    numbers = [*summary_of["expert_bytes"], summary_of["W"], summary_of["D"], *summary_of["kv"]]
    assert all(isinstance(x, int) and x > 0 for x in numbers), numbers
    assert summary_of["kv"] == sorted(summary_of["kv"])
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


GGUF_KEYS = ["general.architecture", "general.name", *(f"{ARCH}.{key}" for key in (
    "block_count", "embedding_length", "feed_forward_length", "expert_feed_forward_length", "expert_count",
    "expert_used_count", "attention.head_count", "attention.head_count_kv", "attention.key_length"))]
GGUF_VALUES = [DELETE, (0, V.UINT32), (1, V.UINT32), (2, V.UINT32), (3, V.UINT32), (4, V.UINT32), (8, V.UINT32),
               (32, V.UINT32), (96, V.UINT32), (-1, V.INT32), (-(2**31), V.INT32), (10**12, V.UINT64),
               (2**64 - 1, V.UINT64), (2.0, V.FLOAT32), (math.nan, V.FLOAT32), (math.inf, V.FLOAT64), (True, V.BOOL),
               ("x", V.STRING), ("olmoe", V.STRING), ("llama", V.STRING), (EVIL, V.STRING), (b"\xff", V.STRING),
               ([2, 2], V.ARRAY), (["olmoe"], V.ARRAY)]


@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(GGUF_KEYS), st.sampled_from(GGUF_VALUES), min_size=1, max_size=3))
def test_random_gguf_metadata_loads_sane_or_is_refused(changes, tmp_path):
    path = write_gguf(tmp_path / "mutated.gguf", changes)
    try:
        model = read_gguf(path)
    except MoespecError as e:
        assert str(path) in str(e) and "\n" not in str(e), str(e)
        return
    sane(model.spec, model.summary(depth=64, kmax=3))


CONFIG_KEYS = ["model_type", "hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "num_experts",
               "num_local_experts", "n_routed_experts", "num_experts_per_tok", "intermediate_size",
               "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "layer_types", "sliding_window",
               "first_k_dense_replace", "n_shared_experts", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
               "qk_rope_head_dim", "v_head_dim"]
CONFIG_VALUES = [DELETE, None, True, False, "x", "false", "olmoe", [], {}, [0], [1], [-1], [0, 0], [0.0],
                 ["sliding_attention", "full_attention"], ["full_attention"] * 3, math.nan, math.inf, -math.inf, -1,
                 0, 0.5, 1, 2, 3, 4, 8, 16, 2.0, 1000, 100_000, 10**12, 10**30, 1e308]


@pytest.fixture(scope="module")
def config_bases(tiny_configs) -> list[dict[str, Any]]:
    """The tiny configs as transformers writes them, and the bench's."""
    return [json.loads(config.to_json_string()) for config in tiny_configs.values()] + [TINY_BENCH_CONFIG]


@SETTINGS
@given(which=st.integers(0, 5),
       changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), st.sampled_from(CONFIG_VALUES), min_size=1, max_size=3))
def test_random_config_fields_load_sane_or_are_refused(which, changes, config_bases, tmp_path):
    path = write_config(tmp_path / "mutated", changes, config_bases[which])
    try:
        spec = ModelSpec.from_config(path)
    except MoespecError as e:
        assert str(path) in str(e) and "\n" not in str(e), str(e)
        return
    sane(spec, summary(spec, "q4_k_m", "fp16", depth=64, kmax=3))
