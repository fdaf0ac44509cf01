"""Weight formats: the bytes a matrix or a one-dimensional tensor takes in each format a pass may read.

Formats. Block formats store `weights` weights in `bytes` bytes (FORMATS). Blocks run along a weight
matrix's input dimension (the contiguous row of a GGUF tensor), so a matrix of shape [out, in] costs
out * ceil(in / block) * bytes. Where `in` is not a multiple of a k-quant's 256-weight super-block
(gpt-oss 2880, DeepSeek-V2-Lite 1408), llama.cpp falls back to a 32-weight format (q4_k -> q5_0,
q6_k -> q8_0), and so do we. One-dimensional tensors (norms, biases, sinks) and the router matrix are
never quantized by llama.cpp: they cost 4 bytes a weight (F32) in every block format, and their float
size in fp32/bf16/fp16.

"q4_k_m" is an APPROXIMATION of llama.cpp's Q4_K_M mix: every matrix q4_k, except (a) the output head
(and the embedding when tied, since it serves as the head) at q6_k; (b) attn_v and every ffn_down (dense,
shared-expert and routed-expert) at q6_k in the layers llama.cpp's `use_more_bits` picks: layer i of n
with i < n//8, or i >= 7n//8, or (i - n//8) % 3 == 2 (about half the layers). Not modelled: llama.cpp's
model-specific bumps (e.g. attn_v at q8_0 and attn_output at q5_k for 8-expert models such as Mixtral,
which therefore read slightly more than counted here). MLA has no attn_v; its attention stays q4_k.
"""

from __future__ import annotations

import math

from moespec import ArgumentError, MoespecError

# name -> (bytes per block, weights per block). Block layouts are llama.cpp's (ggml-common.h) and OCP MX.
FORMATS: dict[str, tuple[int, int]] = {
    "fp32": (4, 1),
    "bf16": (2, 1),
    "fp16": (2, 1),
    "q8_0": (34, 32),  # 32 int8 + one fp16 scale
    "q5_0": (22, 32),  # 32 x 4 low bits + 32 high bits (4 B) + fp16 scale; llama.cpp's fallback for q4_k
    "q4_0": (18, 32),  # 32 x 4 bits + one fp16 scale
    "q4_k": (144, 256),  # 256 x 4 bits (128 B) + 12 B of 6-bit sub-block scales/mins + fp16 d and dmin
    "q6_k": (210, 256),  # 256 x 4 low bits (128) + 2 high bits (64) + 16 int8 scales + fp16 d
    "mxfp4": (17, 32),  # 32 x e2m1 (16 B) + one e8m0 shared exponent
}

MIXED_FORMATS = ("q4_k_m",)  # per-tensor mixes, resolved by matrix_format

ALL_FORMATS = (*FORMATS, *MIXED_FORMATS)

# k-quants need rows that are a whole number of 256-weight super-blocks; llama.cpp otherwise falls back.
_KQUANT_FALLBACK = {"q4_k": "q5_0", "q6_k": "q8_0"}

_FLOAT_FORMATS = ("fp32", "bf16", "fp16")

_F32_BYTES = 4  # llama.cpp keeps 1-D tensors and the router (ffn_gate_inp) in F32

# llama.cpp's names of float formats (a GGUF's tensor types, lower-cased) where they differ from ours; a runs file
# that names its dtype so ("f32": llama.cpp's runs of an f32 file wrote it) loads as ours
LLAMA_CPP_NAMES = {"f32": "fp32", "f16": "fp16"}

def format_name(name: str) -> str:
    """moespec's name of the weight format `name`, given as ours or as llama.cpp's (f32 -> fp32, f16 -> fp16); every
    other name as it is. The one place the two namings meet: a GGUF's expert format, a sweep's grid.format and a
    runs file's dtype pass through it, so a bench, a run and a plan of one file name its format alike."""
    if not isinstance(name, str):
        raise ArgumentError(f"name: a weight format's name, got {name!r}")
    return LLAMA_CPP_NAMES.get(name, name)

def check_format(fmt: str) -> str:
    """`fmt` if it names a weight format, else a one-line error."""
    if fmt not in ALL_FORMATS:
        raise ArgumentError(f"unknown weight format {fmt!r}; one of {', '.join(ALL_FORMATS)}")
    return fmt

def matrix_bytes(rows: int, cols: int, fmt: str) -> int:
    """Bytes of a [rows, cols] matrix in a single (non-mixed) format, blocks along the `cols` input axis."""
    if fmt not in FORMATS:
        check_format(fmt)
        raise MoespecError(f"{fmt!r} is a per-tensor mix; resolve it per matrix first")
    if fmt in _KQUANT_FALLBACK and cols % FORMATS[fmt][1]:
        fmt = _KQUANT_FALLBACK[fmt]
    block_bytes, block = FORMATS[fmt]
    return rows * math.ceil(cols / block) * block_bytes

def expert_matrix_bytes(hidden: int, width: int, fmt: str) -> int:
    """Bytes of one gated expert's matrices in a single format, no biases: its 2f gate and up rows of d weights and
    its d down rows of f."""
    return 2 * matrix_bytes(width, hidden, fmt) + matrix_bytes(hidden, width, fmt)

def expert_rows(hidden: int, width: int, gated: bool = True) -> int:
    """Weight rows of one routed expert of hidden size d and width f: its gate and up rows (f each, or up alone) and
    its d down rows."""
    return (2 if gated else 1) * width + hidden

def _use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers that get more bits in the _M k-quant mixes (about half)."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2

def matrix_format(fmt: str, role: str, layer: int, layers: int) -> str:
    """The single format a matrix of `role` in decoder layer `layer` is stored in under `fmt`."""
    check_format(fmt)
    if fmt != "q4_k_m":
        return fmt
    if role == "output" or (role in ("attn_v", "ffn_down") and _use_more_bits(layer, layers)):
        return "q6_k"
    return "q4_k"

def vector_bytes(fmt: str) -> int:
    """Bytes per weight of 1-D tensors (norms, biases, sinks): float formats keep their size, GGUF uses F32."""
    check_format(fmt)
    return FORMATS[fmt][0] if fmt in _FLOAT_FORMATS else _F32_BYTES

router_weight_bytes = vector_bytes  # llama.cpp never quantizes ffn_gate_inp: same rule as the vectors
