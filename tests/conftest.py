"""Shared fixtures: tiny random checkpoints of the five supported MoE classes, saved with a word-level
tokenizer built on the fly (nothing can be downloaded), used by test_spec (configs), test_tracer and test_run
(models); a tiny model config and trace for `moespec bench` (test_bench, test_lost_work); the tiny checkpoints
loaded in fp32 (test_engine, test_cache)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

# Without a CUDA device the Triton kernels run in Triton's CPU interpreter (set before anything imports them).
if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from moespec.measure import timing  # noqa: E402 - after TRITON_INTERPRET is set

# A word-level vocabulary from this corpus; unknown words map to [UNK]. The configs' vocab_size covers it.
CORPUS = """the cat sat on the mat and the dog ran to the park . a bird sang in the tall tree while rain fell
experts route tokens to layers of a model ; each layer picks a few of many experts for every token
valkyria chronicles is a game about war , soldiers and tanks in a small country = 1 2 3 4 5 6 7 8 9 0"""
VOCAB_SIZE = 96
# Router weights drawn with std 0.2 on hidden 32 give logits spread near 1, far from exact ties.
INIT_STD = 0.2
# A tiny OLMoE-class layer for the bench: N = 8 experts, m = 2, hidden 64, width 32 (an expert is 12 KiB in bf16).
TINY_BENCH_CONFIG = {"model_type": "olmoe", "hidden_size": 64, "num_hidden_layers": 2, "num_experts": 8,
                     "num_experts_per_tok": 2, "intermediate_size": 32, "vocab_size": 100, "num_attention_heads": 4}
SUITE_LLC_BYTES = 32 << 20  # the last-level cache every timed call of the suite flushes for (small_flush)
HOST_KEPT_CACHE = timing.kept_cache  # the probe itself, for the tests that time a real op (host_flush)
# Few reps, windows and U values keep a bench to ~1 s of timed calls (each after a 64 MiB flush): 6 units.
BENCH_SMOKE_ARGS = ["--n", "1-3", "--layers", "0,1", "--reps", "1", "--windows", "2", "--u-values", "3"]


@pytest.fixture(scope="session", autouse=True)
def no_level_wait() -> Iterator[None]:
    """Timed jobs in the tests keep rounds at any bandwidth level (moespec.measure.level.WAIT_S = 0): the suite
    shares the machine with itself, so a pinned level would wait out its budget; tests of the level give theirs.
    Session-scoped, so that it holds before any module's fixtures run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("moespec.measure.level.WAIT_S", 0.0)
        yield


@pytest.fixture(scope="session", autouse=True)
def small_flush() -> Iterator[None]:
    """Every timed call in the tests flushes 64 MiB (a 32 MiB last-level cache), whatever cache the host reports: the
    suite's time does not grow with a host that reports its socket's cache (480 MiB on some virtual machines), and
    no test measures a real time."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("moespec.measure.timing.kept_cache", lambda: SUITE_LLC_BYTES)
        yield


@pytest.fixture(scope="session", autouse=True)
def small_pages() -> Iterator[None]:
    """The suite's timers, benches and models stay in torch's 4 KiB pages (moespec.kernels.pages finds no transparent
    huge pages): on a host whose memory is fragmented the kernel compacts it to fault 2 MiB pages in, seconds for a
    timer's 512 MiB of buffers, and the suite makes hundreds of them. tests/test_pages.py gives the placement back to
    check it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("moespec.kernels.pages.THP_SETTING", Path("/nonexistent/transparent_hugepage/enabled"))
        yield


@pytest.fixture
def host_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test whose plan needs a bench that timed a real expert op: the flush sized on the cache this host keeps
    (timing.kept_cache's probe), as outside the suite. The suite's 64 MiB leaves part of a 200 MB op in a cache that
    keeps 128-256 MiB (a 2-core Xeon VM), whose re-reads then scatter the bench's fits past the plan's eps of 1/2."""
    monkeypatch.setattr("moespec.measure.timing.kept_cache", HOST_KEPT_CACHE)


@pytest.fixture(scope="session", autouse=True)
def no_loading_bars() -> Iterator[None]:
    """transformers' weight-loading bar off, so a command's stderr holds moespec's lines alone."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    yield
    logging.enable_progress_bar()


@pytest.fixture
def bench_stopper(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Makes `moespec bench` stop as at Ctrl-C once its first round is saved. `.timed`: the round keys saved
    (clear it to count a rerun's); `.resume()`: time rounds again as usual."""
    from moespec.formats.checkpoint import Checkpoint
    from moespec.measure import bench_rounds

    save, time_round, timed = Checkpoint.save, bench_rounds.time_round, []
    monkeypatch.setattr(Checkpoint, "save", lambda self, key, unit: (" round " in key and timed.append(key))
                        or save(self, key, unit))

    def interrupt_second_round(*args: Any, **kwargs: Any) -> Any:
        if timed:
            raise KeyboardInterrupt
        return time_round(*args, **kwargs)

    monkeypatch.setattr(bench_rounds, "time_round", interrupt_second_round)
    return SimpleNamespace(timed=timed, resume=lambda: monkeypatch.setattr(bench_rounds, "time_round", time_round))


@pytest.fixture(scope="session")
def tiny_configs() -> dict:
    """model_type -> one tiny config per supported class, exercising each routing rule and layer layout."""
    from transformers import DeepseekV2Config, GptOssConfig, MixtralConfig, OlmoeConfig, Qwen3MoeConfig

    common = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB_SIZE,
                  max_position_embeddings=256, initializer_range=INIT_STD, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return {
        "olmoe": OlmoeConfig(**common, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                             intermediate_size=16),
        # layer 1 dense via mlp_only_layers; renormalized top-k weights
        "qwen3_moe": Qwen3MoeConfig(**common, num_hidden_layers=3, num_experts=8, num_experts_per_tok=3,
                                    moe_intermediate_size=16, intermediate_size=48, head_dim=8,
                                    mlp_only_layers=[1], norm_topk_prob=True),
        # a 4-token sliding window on alternate layers, so chunks cross windows
        "gpt_oss": GptOssConfig(**common, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
                                intermediate_size=16, head_dim=8, sliding_window=4,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        # dense first layer, one shared expert, MLA; group-limited greedy top-3 from the best 2 of 4 groups
        # of 2 experts, which differs from plain greedy top-3 on about half the tokens
        "deepseek_v2": DeepseekV2Config(**common | {"num_key_value_heads": 4}, num_hidden_layers=3,
                                        n_routed_experts=8, num_experts_per_tok=3,
                                        moe_intermediate_size=16, intermediate_size=48, first_k_dense_replace=1,
                                        n_shared_experts=1, q_lora_rank=None, kv_lora_rank=16,
                                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                                        topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                        routed_scaling_factor=1.5),
        "mixtral": MixtralConfig(**common, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                                 intermediate_size=16),
    }


def save_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([CORPUS], trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>", "</s>"]))
    assert tok.get_vocab_size() <= VOCAB_SIZE
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)


@pytest.fixture(scope="session")
def tiny_checkpoints(tiny_configs, tmp_path_factory) -> Iterator[dict[str, Path]]:
    """model_type -> folder holding a random tiny checkpoint and the tokenizer. Torch runs one thread
    meanwhile: tiny matrices gain nothing from intra-op threads and lose several-fold to a busy core."""
    import torch
    from transformers import AutoModelForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("checkpoints")
    folders = {}
    for i, (name, config) in enumerate(tiny_configs.items()):
        torch.manual_seed(i)
        folder = root / name
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        save_tokenizer(folder)
        folders[name] = folder
    yield folders
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def bench_model(tmp_path_factory) -> dict[str, Path]:
    """{"model": a folder holding TINY_BENCH_CONFIG, "trace": a uniform trace of it (300 tokens, 3 documents)}."""
    import json

    from moespec.routing.synth import synthesize

    root = tmp_path_factory.mktemp("bench-model")
    model = root / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_BENCH_CONFIG))
    synthesize(str(model), "uniform", 300, 3, seed=0).save(root / "trace.npz")
    return {"model": model, "trace": root / "trace.npz"}


@pytest.fixture(scope="session")
def bench_argv(bench_model) -> Callable[..., list[str]]:
    """bench_argv(out, *extra): the command line of a ~1 s `moespec bench` of bench_model (2 layers x 3 n)."""
    def argv(out: Path, *extra: str) -> list[str]:
        return ["bench", "--model", str(bench_model["model"]), "--trace", str(bench_model["trace"]),
                *BENCH_SMOKE_ARGS, "--out", str(out), *extra]
    return argv


@pytest.fixture(scope="module")
def models(tiny_checkpoints) -> dict:
    """model_type -> LoadedModel (fp32, cpu) of the tiny checkpoint, one intra-op thread; shared by test_engine and
    test_cache."""
    import torch

    from moespec.model.load import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {name: load_model(path=str(folder), dtype="fp32") for name, folder in tiny_checkpoints.items()}
    torch.set_num_threads(threads)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: an end-to-end test of a minute or more on a 2-core machine "
                                       "(`make test-quick` leaves it out)")


# MOESPEC_REQUIRE_NATIVE=1 (set by .ci/run) turns a skip for missing native kernels into a failure, so that a CI
# machine whose native build broke does not pass on the torch fallback. Every such skip names them in its reason.
REQUIRE_NATIVE = os.environ.get("MOESPEC_REQUIRE_NATIVE") == "1"
NATIVE_SKIP = re.compile(r"native (dense )?kernels")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_NATIVE and report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2]
        if NATIVE_SKIP.search(reason):
            report.outcome = "failed"
            report.longrepr = (f"MOESPEC_REQUIRE_NATIVE=1 and the native kernels are unavailable: {reason} "
                               "(unset it to let these tests skip)")


# Where each command's work begins (past its checks of arguments, inputs and outputs): synthesizing, timing the
# ceiling, loading the model, building the plan, teacher-forcing a document, computing reuse, the demo's first step.
WORK = ("moespec.cli.synth.synthesize", "moespec.measure.timing.CpuTimer.ceiling", "moespec.measure.run.load_model",
        "moespec.predict.plan.build_plan", "moespec.routing.tracer.trace_document", "moespec.cli.reuse.reuse_stats",
        "moespec.demo.routing_and_theory")


@pytest.fixture
def work_started(monkeypatch) -> list[str]:
    """The WORK entry points called during the test, in order (each still runs): a command refused before any work
    leaves it empty, however loaded the host is."""
    import pkgutil

    called: list[str] = []
    for target in WORK:
        def counted(*args, _target=target, _original=pkgutil.resolve_name(target), **kwargs):
            called.append(_target)
            return _original(*args, **kwargs)

        monkeypatch.setattr(target, counted)
    return called
