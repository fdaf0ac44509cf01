"""Expert kernels: the expert operation of one MoE layer for a verification pass, per-slot or deduplicating.

Physics. A pass verifies n <= 9 tokens; each token's router picks m experts and every expert is three
matrices (gate, up, down) of b bytes in all (OLMoE: 3 x 2048 x 1024 weights = 12.6 MB in bf16). A weight
applied to G tokens costs G multiply-adds, so a bf16 expert does G FLOPs per byte it streams. An AVX2 core
issues ~32 FLOPs per cycle while DRAM feeds it ~4-6 bytes per cycle (this machine: ~48 GMAC/s of FMA peak,
~10 GB/s per core, ~20 GB/s for both), so the operation is memory-bound, its time the bytes it streams over
the bandwidth it streams them at, as long as an expert serves fewer than ~6 tokens at once; an expert that a
deduplicating kernel applies to more tokens becomes compute-bound. The two kernels differ in the bytes
they request:
- per-slot (`slot`): each of the n*m slots multiplies its token by its expert, so an expert chosen by
  several tokens is requested once per slot: n*m*b bytes (llama.cpp MMVQ, Metal mul_mv_id, MLX gather_qmv);
- deduplicating (`dedup`): tokens are grouped by expert and each distinct expert is streamed once and
  applied to all its tokens: U*b bytes for U distinct experts (llama.cpp CPU / MMQ, vLLM fused_moe).
Whether dedup's fewer bytes make a faster pass depends on the bandwidth each kernel reaches on its bytes;
both kernels here run the same streaming code and differ only in how slots are grouped, so neither is
handicapped.

Shape legend
    n  tokens in the pass            m  slots (distinct experts) per token
    N  experts in the layer          d  hidden size              f  expert width (intermediate size)

    x        [n, d]      hidden states of the pass
    ids      [n, m]      int expert ids, each in [0, N)
    weights  [n, m]      router weights
    gate_up  [N, 2f, d]  f gate rows then f up rows: `gate_up_proj` of transformers v5's OlmoeExperts,
                         Qwen3MoeExperts, MixtralExperts and DeepseekV2Experts as stored
    down     [N, d, f]   `down_proj` of the same classes
    gate_up_bias [N, 2f], down_bias [N, d]   optional (gpt-oss has both)
    out      [n, d]      out[t] = sum_j weights[t, j] * (down[e] h + down_bias[e]),  e = ids[t, j],
                         h = act(gate[e] x[t] + gate_bias[e], up[e] x[t] + up_bias[e])

gpt-oss stores its experts transposed with gate and up interleaved (`gate_up_proj` [N, d, 2f] with columns
g0 u0 g1 u1 ..., `down_proj` [N, f, d]) and uses a clamped SwiGLU; `from_hf_experts` converts any of these
modules to the layout above once, and `Activation` carries the activation (`SILU` or `GPT_OSS`).

Implementations. On the CPU `slot` and `dedup` run the native AVX2/FMA kernels of moespec/kernels/csrc (fp32 or bf16
weights, fp32 accumulation, the threads sharing the rows of every weight matrix; see moespec.kernels.native; bf16
weights with bf16 x take the AVX512-BF16 dot product where the CPU has it, with h rounded to bf16 between the two
matrices as the model's own bf16 forward rounds it, 512-bit tiles for experts serving several tokens, and on a CPU
with AMX the tile registers for experts serving 6 or more, which keep such an expert near its weights' stream to
16 tokens and more; MOESPEC_NATIVE_AMX=0 turns them off) and fall
back to a pure-torch loop with the same results when the native library is unavailable or the weights are
neither fp32 nor bf16; on a CUDA device they run the Triton kernels of moespec.kernels.triton_experts.
`implementation(kernel, dtype, device)` says which runs. `reference` (float64) is every test's ground truth. Peers:
- `torch-slot`, `torch-dedup`: plain torch loops (F.linear per slot, or per distinct expert on its tokens);
- `hf-batched_mm` (per-slot), `hf-grouped_mm`, `hf-eager` (dedup): transformers' experts implementations,
  called on a real experts module of the model's class (OlmoeExperts; GptOssExperts for the gpt-oss
  activation) that shares our weight tensors (gpt-oss's layout: converted once);
- when installed, `ggml-mul_mat_id` (dedup; ggml-python: llama.cpp's MUL_MAT_ID on the ggml CPU backend, which
  groups rows by expert) and `ggml-per-slot` (the same with one node per token: each token's m experts, per-slot
  bytes), also on q8_0 and q4_0 experts (peers.ggml_quantized, what a quantized GGUF runs), and `mlx-gather` /
  `mlx-sorted` (mlx[cpu] + mlx-lm: SwitchGLU's layers with its sort decision forced: per-slot gather_mm, or slots
  sorted by expert; float32 only on the CPU).
"""

from __future__ import annotations

import torch

from moespec import ArgumentError, theory
from moespec.arguments import show
from moespec.defaults import KERNELS as OURS
from moespec.kernels.experts import (
    GPT_OSS,
    SILU,
    Activation,
    Kernel,
    _check,
    _check_run,
    _ours,
    _reference,
    _torch_loop,
    distinct_experts,
    expert_bytes,
    from_hf_experts,
    implementation,
    reference_float64,
)
from moespec.kernels.peers import GGML_PEERS, PEERS

__all__ = [
    "Activation", "SILU", "GPT_OSS", "Kernel", "KERNELS", "expert_op", "reference_float64", "implementation",
    "expert_bytes", "distinct_experts", "requested_bytes", "from_hf_experts", "PAIRS",
]


# ---------------------------------------------------------------- registry and entry point

KERNELS: dict[str, Kernel] = {
    "reference": Kernel("reference", "slot", _reference, "float64 loop over slots: the ground truth"),
    "slot": Kernel("slot", "slot", _ours("slot"), "ours, per-slot: each slot streams its expert"),
    "dedup": Kernel("dedup", "dedup", _ours("dedup"), "ours, deduplicating: each distinct expert streamed once"),
    "torch-slot": Kernel("torch-slot", "slot", _torch_loop("slot"), "torch loop: one F.linear pair per slot"),
    "torch-dedup": Kernel("torch-dedup", "dedup", _torch_loop("dedup"),
                          "torch loop: one F.linear pair per distinct expert on its tokens"),
    **PEERS,
}


# The (per-slot, deduplicating) pairs of one engine that a plan can compare: ours, and llama.cpp's ggml kernels
# (per token, and over the whole pass). A bench that times a pair records it; the plan reads the pair's times as
# the slot and dedup of (7), (18) and (22).
PAIRS = (OURS, GGML_PEERS)


def _kernel(name: str) -> Kernel:
    if not isinstance(name, str) or name not in KERNELS:
        raise ArgumentError(f"unknown kernel {show(name)}; choose from {', '.join(KERNELS)}")
    return KERNELS[name]


def expert_op(kernel: str, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
              down: torch.Tensor, gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
              act: Activation = SILU, threads: int | None = None) -> torch.Tensor:
    """Run the expert operation with `kernel` (a key of KERNELS); returns out [n, d] in x's dtype.

    `threads` applies to our native kernels (default: torch.get_num_threads())."""
    run = _kernel(kernel).run
    _check(x, ids, weights, gate_up, down, gate_up_bias, down_bias)
    _check_run(act, threads)
    return run(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads)


def requested_bytes(kernel: str, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                    gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None) -> int:
    """Expert bytes the kernel requests for this pass: n*m*b for a per-slot kernel, U*b for a deduplicating one."""
    kind = _kernel(kernel).kind
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ArgumentError(f"ids must be a tensor [n, m] of expert ids, got {show(ids)}")
    n, m = ids.shape
    b = expert_bytes(gate_up, down, gate_up_bias, down_bias)
    return int(theory.requested_bytes(kind, n, distinct_experts(ids), m, b))
