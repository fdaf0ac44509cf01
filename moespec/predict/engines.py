"""The best draft length per batch size in the forms serving engines take: vLLM, TensorRT-LLM, SGLang, llama.cpp.

Physics first. A serving engine verifies B sequences at once, each checking k + 1 tokens; the plan's batch block
(plan.json `batch`, written with `moespec plan --batch`) holds the step time V_B(k) of one such step per batch
size B of its grid. Throughput at batch B is B G(k) / V_B(k), B a constant factor, so the best draft length
k*(a, B) is the single-sequence theory applied to V_B: `theory.best_draft_length(V_B, a)` for a geometric
acceptance a (a = 1 through the all-ones profile, G(k) = k + 1) and `theory.best_draft_length_for(V_B, profile)`
for a measured per-position profile a_1..a_kmax. Engines pick k by the number of running sequences; each takes
the map batch size -> k in its own shape, and each fills the batch sizes between grid points its own way. The
forms below give a batch size between grid points the k of the grid point at or below it.

The forms, with what each engine's source says at the version followed:

- vLLM (`for_vllm`): `speculative_config.num_speculative_tokens_per_batch_size`, a list of inclusive ranges
  `[start_bs, end_bs, k]` whose first range starts at 1; a batch size past the last range keeps the last k, and
  every k is capped at `num_speculative_tokens`, which must be > 0 (vllm-project/vllm, PR #32374:
  docs/features/speculative_decoding/dynamic_speculative_decoding.md at 015a47e1282c9ef40d706ee3463cb699e04e93c0;
  vllm/config/speculative.py at 002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443, `list[tuple[int, int, int]] | None`;
  vllm/v1/spec_decode/dynamic/utils.py at 14b450ca590cbff96e7004bdb147a5d3acf5a4f6). The merged option reads no
  latency profile: the profile of step times per (batch size, k) this form also gives is for the record, in the
  shape of the offline profile the pull request generated before it merged (vllm/v1/spec_decode/dynamic/
  generate_config.py at 116e76b5f78ff176f834811fbe93d5b1f33c78c7: `batch_stats` {batch size: {num drafts: ms}}).
- TensorRT-LLM (`for_tensorrt_llm`): `speculative_config.draft_len_schedule` {batch size: k}: key b serves the
  batch sizes above the previous key up to b, past the last key k = 0 (speculation off); the value at the
  smallest key must equal `max_draft_len` and none may exceed it (NVIDIA/TensorRT-LLM:
  tensorrt_llm/llmapi/llm_args.py at 0004396720054fd8e205cbf616f21f0b57c6b412, DecodingBaseConfig;
  tensorrt_llm/_torch/speculative/utils.py at 011d0933dcb5e592f5fa2626beaf42a96324c578,
  get_draft_len_for_batch_size). The keys here are one below each next grid point, so a batch size between grid
  points gets the k of the point at or below; a grid point whose k* exceeds the first one's takes the best k
  within that cap (listed under `capped`).
- SGLang (`for_sglang`): adaptive speculative decoding (`--speculative-adaptive --speculative-adaptive-config
  FILE`, EAGLE/EAGLE3 with `--speculative-eagle-topk 1`), whose config holds one slot per batch-size lower bound,
  {"B": {"candidate_steps": [...]}}; a batch size (padded up to a captured CUDA-graph size) takes the slot of the
  largest key at or below it, below the first key the first (sgl-project/sglang:
  python/sglang/srt/speculative/adaptive_spec_params.py at 015c872628e328b530880bcf95ae91222604b225,
  adaptive_step_router.py at a12239f6ac74d804d169ee5d3cfed3c49fa7162c; PR #24055). One candidate per slot pins
  speculative_num_steps (= k for a topk-1 chain) to k*(a, B): the EMA has nothing to switch to.
- llama.cpp (`for_llama_cpp_parallel`): per batch size B of the grid, a llama-server with `-np, --parallel B`
  slots and the draft flags of moespec.predict.staircase for k*(a, B) (ggml-org/llama.cpp tools/server/README.md
  at 00dc8057ab28c9cb4c79a6dd6dfce07fe779f63b: `--parallel`, `--spec-draft-n-max`, `--spec-draft-n-min`,
  `--spec-draft-p-min`), on the dedup step times (llama.cpp's CPU expert kernel reads each expert once).

Every form is a plain JSON-able dict: engine, acceptance, policy, k_by_batch {"B": k}, config (what the engine
takes; None where it should run without speculative decoding), usage, source and notes. `write_engine_config`
writes a form's config as a JSON file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Union

from moespec import ArgumentError, theory
from moespec.arguments import is_real, items, real, show, whole
from moespec.defaults import DRAFT_LIMIT
from moespec.formats.files import check_output, write_json
from moespec.predict.plan import LLAMA_CPP_POLICY
from moespec.predict.staircase import LLAMA_CPP_FLAGS, LLAMA_CPP_PLAIN

Number = Union[int, float]
Acceptance = Union[Number, Sequence[Number]]

BATCH_KEYS = ("batches", "kmax", "policy", "source", "per_batch")  # what the forms read of a plan's batch block

SOURCES = {
    "vllm": "vllm-project/vllm PR #32374: docs/features/speculative_decoding/dynamic_speculative_decoding.md "
            "(015a47e1), vllm/config/speculative.py (002e77c1), vllm/v1/spec_decode/dynamic/utils.py (14b450ca)",
    "tensorrt-llm": "NVIDIA/TensorRT-LLM: tensorrt_llm/llmapi/llm_args.py (00043967), "
                    "tensorrt_llm/_torch/speculative/utils.py (011d0933)",
    "sglang": "sgl-project/sglang PR #24055: python/sglang/srt/speculative/adaptive_spec_params.py (015c8726), "
              "adaptive_step_router.py (a12239f6)",
    "llama.cpp": "ggml-org/llama.cpp: tools/server/README.md (00dc8057)",
}


def check_batch(batch: Any) -> dict[int, Mapping[str, Any]]:
    """The plan's batch block checked for what the forms read: batches ascending distinct integers >= 1 (at least
    one), kmax in 1..DRAFT_LIMIT, a policy, a source and per batch size a step_time_s entry of kmax + 1 positive
    step times for that policy and for llama.cpp's. Returns {B: per_batch entry}; ValueError naming the key."""
    if not isinstance(batch, Mapping):
        raise ArgumentError(f"batch must be a plan's batch block (a dict), got {show(batch)}")
    missing = [key for key in BATCH_KEYS if key not in batch]
    if missing:
        raise ArgumentError(f"batch: missing key {missing[0]!r} (a plan's batch block holds {', '.join(BATCH_KEYS)})")
    batches = [whole(f"batch['batches'][{i}]", b, 1) for i, b in enumerate(items("batch['batches']",
                                                                                  batch["batches"]))]
    if not batches:
        raise ArgumentError("batch['batches']: an empty list of batch sizes")
    if any(b <= prev for prev, b in zip(batches, batches[1:])):
        raise ArgumentError(f"batch['batches'] = {show(batches)}: batch sizes must be ascending and distinct")
    kmax = whole("batch['kmax']", batch["kmax"], 1, DRAFT_LIMIT)
    if not isinstance(batch["policy"], str) or not isinstance(batch["source"], str):
        raise ArgumentError("batch['policy'] and batch['source'] must be strings")
    if not isinstance(batch["per_batch"], Mapping):
        raise ArgumentError(f"batch['per_batch'] must be a dict by batch size, got {show(batch['per_batch'])}")
    entries = {}
    for b in batches:
        entry = batch["per_batch"].get(str(b))
        where = f"batch['per_batch']['{b}']['step_time_s']"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("step_time_s"), Mapping):
            raise ArgumentError(f"{where}: missing (one entry per batch size of batch['batches'])")
        for policy in dict.fromkeys((batch["policy"], LLAMA_CPP_POLICY)):
            times = entry["step_time_s"].get(policy)
            try:
                count = len(theory.check_step_times(times))
            except ArgumentError as e:
                raise ArgumentError(f"{where}['{policy}']: {e}") from None
            if count != kmax + 1:
                raise ArgumentError(f"{where}['{policy}']: {count} step times, kmax = {kmax} needs {kmax + 1}")
        entries[b] = entry
    return entries


def check_acceptance_input(acceptance: Any, kmax: int) -> Number | list[Number]:
    """One acceptance a in [0, 1], or a per-position profile a_1..a_m (m >= kmax, each in [0, 1]); ValueError naming
    `acceptance` otherwise."""
    if is_real(acceptance):
        a = real("acceptance", acceptance)
        theory.check_acceptance(a, closed=True)
        return a
    try:
        return theory.check_profile(items("acceptance", acceptance), kmax)
    except ArgumentError as e:
        raise ArgumentError(f"acceptance: {e}") from None


def _best(V: Sequence[Number], acceptance: Number | list[Number]) -> int:
    """k* on the step times V(0..K): geometric (a = 1 as the all-ones profile) or for a profile."""
    if isinstance(acceptance, list):
        return theory.best_draft_length_for(V, acceptance)
    if acceptance == 1:
        return theory.best_draft_length_for(V, [1] * (len(V) - 1))
    return int(theory.best_draft_length(V, acceptance))


def draft_lengths(batch: Mapping[str, Any], acceptance: Acceptance, policy: str | None = None) -> dict[int, int]:
    """k*(a, B) for every batch size B of the block's grid, on the step times of `policy` (default the block's):
    the single-sequence theory applied to V_B (module docstring)."""
    entries = check_batch(batch)
    policy = batch["policy"] if policy is None else policy
    if policy not in (batch["policy"], LLAMA_CPP_POLICY):
        raise ArgumentError(f"policy = {show(policy)}: the forms read {batch['policy']!r} or {LLAMA_CPP_POLICY!r}")
    acceptance = check_acceptance_input(acceptance, batch["kmax"])
    return {b: _best(entry["step_time_s"][policy], acceptance) for b, entry in entries.items()}


def _form(engine: str, batch: Mapping[str, Any], acceptance: Acceptance, ks: Mapping[int, int], policy: str,
          config: Any, usage: str, notes: list[str]) -> dict[str, Any]:
    """The fields every form has (module docstring)."""
    given = check_acceptance_input(acceptance, batch["kmax"])
    return {"engine": engine, "acceptance": [float(x) for x in given] if isinstance(given, list) else float(given),
            "policy": policy, "step_times_from": batch["source"], "k_by_batch": {str(b): k for b, k in ks.items()},
            "config": config, "usage": usage, "source": SOURCES[engine], "notes": notes}


def vllm_ranges(ks: Mapping[int, int]) -> list[list[int]]:
    """{B: k} over an ascending grid as vLLM's inclusive ranges [start_bs, end_bs, k]: each grid point's range runs
    to one below the next point, the first starts at 1, the last ends at its point (vLLM keeps its k beyond);
    neighbours of equal k merged."""
    grid = list(ks)
    rows: list[list[int]] = []
    for i, b in enumerate(grid):
        lo, hi = (1 if i == 0 else b), (grid[i + 1] - 1 if i + 1 < len(grid) else b)
        if rows and rows[-1][2] == ks[b]:
            rows[-1][1] = hi
        else:
            rows.append([lo, hi, ks[b]])
    return rows


def for_vllm(batch: Mapping[str, Any], acceptance: Acceptance) -> dict[str, Any]:
    """vLLM's dynamic speculative decoding: config = {"num_speculative_tokens": max k, "num_speculative_tokens_per
    _batch_size": vllm_ranges} to merge into --speculative-config (None where k* = 0 at every batch size: vLLM
    needs num_speculative_tokens > 0); `step_time_profile_ms` {"B": {"k": V_B(k) in ms}} beside it."""
    ks = draft_lengths(batch, acceptance)
    top = max(ks.values())
    config = None if top == 0 else {"num_speculative_tokens": top,
                                    "num_speculative_tokens_per_batch_size": vllm_ranges(ks)}
    notes = ["step_time_profile_ms is not a vLLM option: vLLM's merged dynamic speculative decoding reads the "
             "schedule only"]
    if config is None:
        notes.insert(0, "config null where k* = 0 at every batch size of the grid: run without --speculative-config")
    form = _form("vllm", batch, acceptance, ks, batch["policy"], config,
                 "vllm serve MODEL --speculative-config '{\"method\": ..., \"model\": ..., <config>}'", notes)
    form["step_time_profile_ms"] = {
        str(b): {str(k): float(v) * 1e3 for k, v in enumerate(batch["per_batch"][str(b)]["step_time_s"]
                                                              [batch["policy"]])} for b in ks}
    return form


def for_tensorrt_llm(batch: Mapping[str, Any], acceptance: Acceptance) -> dict[str, Any]:
    """TensorRT-LLM's dynamic draft length: config = {"speculative_config": {"max_draft_len": k at the first grid
    point, "draft_len_schedule": {"threshold": k}}} for --extra_llm_api_options (JSON is YAML); thresholds one
    below each next grid point and the last grid point, equal neighbours merged, trailing zeros dropped (past the
    last key TensorRT-LLM drafts 0). None where the first grid point's k* is 0."""
    ks = draft_lengths(batch, acceptance)
    given = check_acceptance_input(acceptance, batch["kmax"])
    grid = list(ks)
    cap = ks[grid[0]]
    capped, schedule = [], {}
    for i, b in enumerate(grid):
        k = ks[b]
        if k > cap:
            V = batch["per_batch"][str(b)]["step_time_s"][batch["policy"]][:cap + 1]
            k = _best(V, given)
            capped.append({"batch": b, "k_star": ks[b], "k": k})
        threshold = grid[i + 1] - 1 if i + 1 < len(grid) else b
        if schedule and list(schedule.values())[-1] == k:
            schedule.pop(list(schedule)[-1])
        schedule[str(threshold)] = k
    while schedule and list(schedule.values())[-1] == 0:
        schedule.pop(list(schedule)[-1])
    config = {"speculative_config": {"max_draft_len": cap, "draft_len_schedule": schedule}} if schedule else None
    notes = [f"batch sizes above {grid[-1]} draft 0 (TensorRT-LLM's implicit cut-off past the last key)"]
    if capped:
        notes.append("TensorRT-LLM caps every k at the first key's (max_draft_len): " + ", ".join(
            f"B = {row['batch']}: k* = {row['k_star']}, best k <= {cap} is {row['k']}" for row in capped))
    if config is None:
        notes.insert(0, f"config null where k* = 0 at B = {grid[0]}, whose k caps the others: run without "
                        "speculative_config")
    form = _form("tensorrt-llm", batch, acceptance, ks, batch["policy"], config,
                 "trtllm-serve MODEL --extra_llm_api_options FILE (add decoding_type and the draft model to "
                 "speculative_config)", notes)
    form["capped"] = capped
    return form


def for_sglang(batch: Mapping[str, Any], acceptance: Acceptance) -> dict[str, Any]:
    """SGLang's batch-size-aware adaptive speculative decoding: config = {"B": {"candidate_steps": [k]}} per grid
    point (equal neighbours merged under the lower key), the file for --speculative-adaptive-config; None where
    k* = 0 at every batch size."""
    ks = draft_lengths(batch, acceptance)
    config: dict[str, dict[str, list[int]]] = {}
    for b, k in ks.items():
        if not config or list(config.values())[-1]["candidate_steps"] != [k]:
            config[str(b)] = {"candidate_steps": [k]}
    top = max(ks.values())
    config = config if top else None
    usage = ("python -m sglang.launch_server --model-path MODEL --speculative-algorithm EAGLE "
             "--speculative-eagle-topk 1 --speculative-num-steps K --speculative-num-draft-tokens K+1 "
             "--speculative-adaptive --speculative-adaptive-config FILE (K: the largest k of the config)")
    notes = ["one candidate per slot fixes speculative_num_steps at k* for its batch sizes",
             f"batch sizes above {list(ks)[-1]} keep its slot; SGLang pads a batch up to a captured CUDA-graph "
             "size before the lookup"]
    if config is None:
        notes.insert(0, "config null where k* = 0 at every batch size of the grid: run without --speculative-algorithm")
    return _form("sglang", batch, acceptance, ks, batch["policy"], config, usage, notes)


def for_llama_cpp_parallel(batch: Mapping[str, Any], acceptance: Acceptance) -> dict[str, Any]:
    """llama.cpp's parallel slots: config = {"B": {"k": k, "args": "--parallel B <draft flags>"}} per grid point, on
    the dedup step times; k = 0 is plain decoding (no --model-draft)."""
    ks = draft_lengths(batch, acceptance, LLAMA_CPP_POLICY)
    config = {str(b): {"k": k, "args": f"--parallel {b}" + (f" {LLAMA_CPP_FLAGS.format(k=k)}" if k else "")}
              for b, k in ks.items()}
    notes = ["one llama-server per expected number of concurrent requests B: --parallel B slots decode together",
             f"k = 0: {LLAMA_CPP_PLAIN}, start llama-server without --model-draft"]
    return _form("llama.cpp", batch, acceptance, ks, LLAMA_CPP_POLICY, config,
                 "llama-server -m MODEL.gguf --model-draft DRAFT.gguf <args>", notes)


FORMS: dict[str, Callable[[Mapping[str, Any], Acceptance], dict[str, Any]]] = {
    "llama.cpp": for_llama_cpp_parallel, "vllm": for_vllm, "tensorrt-llm": for_tensorrt_llm, "sglang": for_sglang}


def engine_form(engine: str, batch: Mapping[str, Any], acceptance: Acceptance) -> dict[str, Any]:
    """The form of `engine` (one of FORMS) for the batch block at one acceptance or profile."""
    if engine not in FORMS:
        raise ArgumentError(f"engine = {show(engine)}: one of {', '.join(FORMS)}")
    return FORMS[engine](batch, acceptance)


def write_engine_config(path: str | Path, form: Mapping[str, Any], flag: str = "--engine-out") -> Path:
    """Write the form's config as a JSON file at `path` (checked first, written atomically); ValueError naming
    `form` when it has none (the engine should run without speculative decoding)."""
    target = check_output(path, flag)
    if not isinstance(form, Mapping) or "config" not in form or "engine" not in form:
        raise ArgumentError(f"form must be a dict from engine_form, got {show(form)}")
    if form["config"] is None:
        raise ArgumentError(f"form: {form['engine']} has no config to write: {form['notes'][0]}")
    return write_json(target, form["config"])
