"""What the expert-op bench times on one MoE layer: the layer's seeded random weights in its real shape and format
(moespec.kernels shape legend), each pass's inputs, and the kernels that can run them.

Shapes: N experts, d hidden, f expert width, n tokens of a pass, m experts per token; x [n, d], ids [n, m], router
weights [n, m]; gate_up [N, 2f, d], down [N, d, f] (GGUF blocks, uint8, for a quantized format).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from moespec import MoespecError, kernels
from moespec.defaults import QUANTIZED, TORCH_DTYPES
from moespec.kernels import GPT_OSS, SILU, Activation, expert_op, pages
from moespec.kernels.peers import ggml_quantized
from moespec.measure.passes import Pass, chosen_ids
from moespec.model.spec import ModelSpec

WEIGHT_STD = 0.02  # random weights ~ a trained expert's entries: keeps activations finite; time is value-blind
Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # one pass's (x [n, d], ids [n, m], router weights [n, m])


def bench_kernels() -> dict[str, str]:
    """name -> kind of every kernel worth timing (the float64 reference is the tests' ground truth, not a kernel)."""
    return {name: k.kind for name, k in kernels.KERNELS.items() if name != "reference"}  # the registry as it is now


def parse_kernels(text: str, spec: ModelSpec, dtype: str, device: str = "cpu") -> tuple[list[str], dict[str, str]]:
    """The kernels to time and, for `all`, those left out because they cannot run this layer at `dtype` on
    `device` (with why); a kernel named explicitly that cannot run is an error, found before anything is timed."""
    known = bench_kernels()
    names = list(known) if text == "all" else list(dict.fromkeys(text.split(",")))
    for name in names:
        if name not in known:
            raise MoespecError(f"unknown kernel {name!r}; choose from {', '.join(known)}, or all")
    failing = _cannot_run(names, spec, dtype, device)
    if failing and text != "all":
        name, why = next(iter(failing.items()))
        raise MoespecError(f"kernel {name} cannot run {spec.name} experts in {dtype} on {device}: {why}")
    return [name for name in names if name not in failing], failing


def _cannot_run(names: list[str], spec: ModelSpec, dtype: str, device: str) -> dict[str, str]:
    """kernel -> why it fails on a tiny layer with this model's structure (N, m, biases, activation) at dtype
    on device."""
    size = 32  # a quantized format's block
    layer = layer_weights(dataclasses.replace(spec, hidden=size, expert_width=size), 0, dtype, 0, device)
    ids = chosen_ids(2, spec.m, spec.N, spec.m + 1, np.random.default_rng(0))
    inputs = pass_inputs([Pass("chosen", ids, spec.m + 1)], size, layer.x_dtype, device)[0]
    failing = {}
    for name in names:
        try:
            layer.run(name, *inputs)
        except Exception as e:  # noqa: BLE001 - a peer library may fail in its own ways; all mean "not here"
            failing[name] = " ".join(str(e).split())[:200] or type(e).__name__
    return failing


@dataclass
class LayerWeights:
    """Random expert weights of one MoE layer in the kernels' layout (moespec.kernels shape legend); for a
    quantized `fmt` (QUANTIZED) gate_up and down hold the GGUF blocks of those weights (uint8) and only
    ggml's kernels run them."""

    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None
    act: Activation
    fmt: str = "bf16"
    shape: tuple[int, int, int] = (0, 0, 0)  # (N, d, f)

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The tensors a pass reads experts from, each [N, ...]: gate_up, down and the biases there are."""
        return [t for t in (self.gate_up, self.down, self.gate_up_bias, self.down_bias) if t is not None]

    @property
    def x_dtype(self) -> torch.dtype:
        """The dtype of the pass's inputs: the weights' own, fp32 for quantized weights (ggml's activations)."""
        return torch.float32 if self.fmt in QUANTIZED else self.gate_up.dtype

    def run(self, kernel: str, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if self.fmt in QUANTIZED:
            return ggml_quantized(kernel, x, ids, weights, self.gate_up, self.down, self.fmt, self.shape)
        return expert_op(kernel, x, ids, weights, self.gate_up, self.down, self.gate_up_bias, self.down_bias,
                         self.act)


# Share of the memory free when the bench starts that one layer's weights may take: the flush buffer, the inputs and
# the kernels' scratch need the rest.
MEMORY_SHARE = 0.8


def available_memory(device: str) -> int | None:
    """Bytes free for new allocations on `device` (MemAvailable of /proc/meminfo on the CPU, free device memory on
    a GPU); None where the system does not say."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(spec: ModelSpec, dtype: str, device: str) -> None:
    """Refuse, before anything is drawn, a layer whose random weights (gate_up [N, 2f, d] and down [N, d, f], drawn
    in fp32 for a quantized format) would take more than MEMORY_SHARE of the memory free on `device`."""
    need = 3 * spec.N * spec.hidden * spec.expert_width * torch_dtype(dtype).itemsize
    free = available_memory(device)
    if free is not None and need > MEMORY_SHARE * free:
        raise MoespecError(f"{spec.name}: one MoE layer's experts take {need / 2**30:,.1f} GiB in {dtype} "
                           f"({spec.N} x 3 x {spec.hidden} x {spec.expert_width}), more than "
                           f"{MEMORY_SHARE:.0%} of the {free / 2**30:,.1f} GiB free on {device}")


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, TORCH_DTYPES["fp32" if name in QUANTIZED else name])  # quantized: fp32, then blocks


def gguf_blocks(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """The GGUF blocks of t's rows (the last dimension) in `fmt`, quantized by the gguf package as llama.cpp's
    converter does: uint8 [..., K / block x block bytes]."""
    rows = gguf_quants.quantize(t.reshape(-1, t.shape[-1]).numpy(), GGMLQuantizationType[fmt.upper()])
    return torch.from_numpy(rows).reshape(*t.shape[:-1], rows.shape[-1])


def layer_weights(spec: ModelSpec, layer: int, dtype: str, seed: int, device: str = "cpu") -> LayerWeights:
    """Seeded random weights of the layer's real shape and dtype on `device`; biases and the clamped SwiGLU for
    gpt-oss. Drawn by the CPU generator whatever the device, so every device gets the same values. A quantized
    dtype draws fp32 weights and stores their GGUF blocks (CPU only)."""
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, layer]).generate_state(1)[0]))

    def normal(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=torch_dtype(dtype)).normal_(0.0, WEIGHT_STD, generator=gen).to(device)

    N, d, f = spec.N, spec.hidden, spec.expert_width  # noqa: N806
    biases = (normal(N, 2 * f), normal(N, d)) if spec.expert_bias else (None, None)
    act = GPT_OSS if spec.model_type == "gpt_oss" else SILU
    gate_up, down = normal(N, 2 * f, d), normal(N, d, f)
    if dtype in QUANTIZED:
        if device != "cpu":
            raise MoespecError(f"--dtype {dtype}: quantized experts run on the CPU (ggml's kernels) only")
        gate_up, down = gguf_blocks(gate_up, dtype), gguf_blocks(down, dtype)
    gate_up, down = pages.huge(gate_up), pages.huge(down)  # in the pages the engine's weights are in
    return LayerWeights(gate_up, down, *biases, act, dtype, (N, d, f))


def pass_inputs(passes: list[Pass], d: int, dtype: torch.dtype, device: str | torch.device) -> list[Inputs]:
    """(x, ids, router weights) per pass on `device`; values are seeded on the CPU (the same on every device)
    and do not change a memory-bound time."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for p in passes:
        n, m = p.ids.shape
        x = torch.randn(n, d, generator=gen).to(dtype)
        weights = torch.softmax(torch.randn(n, m, generator=gen), dim=-1).to(dtype)
        out.append((x.to(device), torch.from_numpy(p.ids).to(device), weights.to(device)))
    return out
