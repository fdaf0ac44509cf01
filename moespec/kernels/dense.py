"""Dense linear layers of a verification pass on the CPU: y = x W^T + b for a few tokens at once.

Physics. A verification pass pushes n <= 16 tokens through every dense layer (attention projections, the
LM head). A weight does n multiply-adds per call, so the layer is a stream of W past n input rows: its time
is W's bytes over the machine's streaming-read bandwidth (LM head 32768 x 2048 bf16 = 134 MB: ~4 ms at
~33 GB/s), the same for n = 1 as for n = 5, as long as the cores keep up with the multiply-adds. torch's
F.linear reaches ~55% of that bandwidth here (torch 2.13: ~8 ms for the LM head at n = 1..9). The native
kernel (dense_kernels.cpp) reads each W row once per call and applies it to all n tokens held in L1, with
fp32 accumulation, the OpenMP threads sharing the rows of W. Its fma path (AVX2 + FMA, every dtype) keeps up
with memory to n ~ 4-5 on two cores; its dot path (AVX512-BF16, for bf16 W and bf16 x on CPUs that have
it) doubles the multiply-add rate and keeps up to n ~ 6-8; past that, both are bound by their
multiply-adds and the time grows with n. Its AMX path (the tile registers, bf16 W and bf16 x with K a multiple of
32, on a CPU whose tiles the process is granted: `amx_path`) multiplies 16 rows by 16 tokens an instruction and
stays a stream of W from one row to dozens: it takes those calls, up to AMX_MAX_TOKENS rows (a batched pass of B
sequences), and gives each row the same bits whatever the call's other rows, so one-token decoding and a pass of
many tokens agree exactly in the dense layers. Past the rows the native kernel takes (`native_rows`) a call is a
GEMM: `pack` and `packed_linear` run it on oneDNN's own layout of a bf16 weight, faster than F.linear on it. Where
torch's oneDNN has no bf16 GEMM (an AVX2 CPU), such a bf16 call takes the lanes path (`linear_if_taken`, isa
"lanes", up to LANE_MAX_TOKENS rows, any dtypes), as `auto` does from 16 rows of a bf16 weight on a CPU without the
tiles or the dot path: the tokens lie in the 8 lanes of the registers and each chunk of W is widened to fp32 once and
applied to them all, where the fma path widens it again for every block of 2-3 tokens.

Shape legend
    n  tokens: the product of x's leading dimensions, 1..16 (1..AMX_MAX_TOKENS on the AMX and lanes paths)
    K  input features        M  output features

    x       [..., K]  fp32 or bf16
    weight  [M, K]    fp32 or bf16, contiguous (torch nn.Linear layout)
    bias    [M]       fp32 or bf16, or None
    y       [..., M]  in x's dtype: y = x.float() @ weight.float().T + bias.float(), rounded once

The kernel is built into the same library as the expert kernels (moespec.kernels.native): `MOESPEC_NATIVE=0`
disables both and `available()` / `native.status()` say why they are unavailable. The engine installs it in a
model with moespec.model.dense.
"""

from __future__ import annotations

import functools
import math

import torch

from moespec import ArgumentError
from moespec.arguments import show
from moespec.kernels import native

MAX_TOKENS = 16  # the rows a verification pass brings (k <= 15 drafts); a prefill goes to torch's GEMM
AMX_MAX_TOKENS = 256  # the AMX path's rows (dense_kernels.cpp kAmxMaxTokens): 16 sequences of 16 tokens
LANE_MAX_TOKENS = 256  # the lanes path's rows (dense_kernels.cpp kLaneMaxTokens): the same passes on AVX2
AMX_COLUMNS = 32  # K a multiple of this: one tile's columns (amx_tiles.h kAmxCols)
ISA = {"auto": 0, "fma": 1, "dot": 2, "amx": 3, "lanes": 4}
PACK_ROWS = 64  # the row count oneDNN lays a packed weight out for; 1, 17 or 64 run alike at 17-72 rows here


def available() -> bool:
    """Whether `linear` can run (the native library built and loaded)."""
    return native.load() is not None


def status() -> str:
    """One line: the native library and the dense paths this CPU runs, or why it is unavailable."""
    lib = native.load()
    if lib is None:
        return native.status()
    amx = f"AMX path for bf16 x bf16 of 1..{AMX_MAX_TOKENS} rows, " if amx_path() else ""
    dot = "dot path (AVX512-BF16) for bf16 x bf16, " if has_dot_path() else ""
    return f"{native.status()}; dense: {amx}{dot}fma path, lanes path (bf16 from 16 rows, to {LANE_MAX_TOKENS})"


def has_dot_path() -> bool:
    """Whether this CPU runs the AVX512-BF16 dot path (bf16 weight and bf16 x)."""
    lib = native.load()
    return lib is not None and bool(lib.moespec_dense_cpu_has_dot())


@functools.cache  # read on every dense call of a pass; the CPU does not change under a process
def amx_path() -> bool:
    """Whether this process runs the dense kernel's AMX path (the CPU's tiles granted; see the module docstring)."""
    lib = native.load()
    return lib is not None and bool(lib.moespec_dense_amx())


def native_rows(x: torch.Tensor, weight: torch.Tensor | None = None) -> int:
    """The most rows `linear` takes for inputs like x (and weight, where given): AMX_MAX_TOKENS for bf16 x (and W)
    of K a multiple of AMX_COLUMNS where `amx_path`, else MAX_TOKENS."""
    tiles = x.dtype == torch.bfloat16 and x.shape[-1] % AMX_COLUMNS == 0 and (
        weight is None or weight.dtype == torch.bfloat16)
    return AMX_MAX_TOKENS if tiles and amx_path() else MAX_TOKENS


def takes(x: object, weight: object, bias: object = None) -> bool:
    """Whether `linear` runs this call natively: the library loaded, CPU tensors of fp32 or bf16, a contiguous 2-D
    weight [M, K], x [..., K] of 1..native_rows rows, bias None or [M]. A check, never an error: the engine sends
    everything else (a prefill, another dtype) to torch."""
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and available()):
        return False
    tensors = (x, weight) if bias is None else (x, weight, bias)
    codes = native.DTYPE_CODE
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype in codes for t in tensors):
        return False
    if weight.dim() != 2 or not weight.is_contiguous() or x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        return False
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        return False
    return 1 <= math.prod(x.shape[:-1]) <= native_rows(x, weight) and weight.shape[0] >= 1 and weight.shape[1] >= 1


def _check_tensor(name: str, t: object) -> None:
    """Raise unless t is a CPU tensor of a supported dtype, naming it."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{name} must be a torch.Tensor, got {show(t)}")
    if not t.is_cpu:
        raise ArgumentError(f"{name} is on {t.device}; linear runs on the CPU")
    if t.dtype not in native.DTYPE_CODE:
        raise ArgumentError(f"{name} is {t.dtype}; linear takes float32 or bfloat16")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           threads: int | None = None, isa: str = "auto") -> torch.Tensor:
    """y = x @ weight.T + bias with the native kernel: y [..., M] in x's dtype (see the module docstring).

    Every argument is checked before a pointer reaches native code: CPU tensors of float32 or bfloat16,
    weight 2-D and contiguous (a transposed weight is refused rather than copied on every call), x [..., K]
    with at most native_rows rows once its leading dimensions are flattened (AMX_MAX_TOKENS or LANE_MAX_TOKENS on
    those paths), bias [M]. `threads` defaults to torch.get_num_threads(); `isa` is "auto", "fma", "dot", "amx" or
    "lanes" (see the module docstring). The result carries no autograd graph. Zero-size shapes (n, K or M = 0) are
    computed by `linear_reference`.

    Lean on purpose: right after a cache flush each torch call costs microseconds of misses, and a 2048 x
    2048 bf16 layer streams in ~0.25 ms, so every attribute is read once and a 2-D x is not reshaped."""
    _check_tensor("x", x)
    _check_tensor("weight", weight)
    if bias is not None:
        _check_tensor("bias", bias)
    if not isinstance(isa, str) or isa not in ISA:
        raise ArgumentError(f"isa must be one of {', '.join(ISA)}, got {show(isa)}")
    native.check_threads(threads)
    ws, xs = weight.shape, x.shape
    if len(ws) != 2:
        raise ValueError(f"weight must be 2-D [M, K], got {tuple(ws)}")
    M, K = ws
    if len(xs) == 0 or xs[-1] != K:
        raise ValueError(f"x {tuple(xs)} must be [..., K={K}] for weight {tuple(ws)}")
    if bias is not None and bias.shape != (M,):
        raise ValueError(f"bias {tuple(bias.shape)} must be [M={M}] for weight {tuple(ws)}")
    lead = xs[:-1]
    n = lead[0] if len(lead) == 1 else math.prod(lead)
    most = {"amx": AMX_MAX_TOKENS, "lanes": LANE_MAX_TOKENS, "auto": native_rows(x, weight)}.get(isa, MAX_TOKENS)
    if n > most:
        raise ValueError(f"x has n={n} rows (leading dims {tuple(lead)}); linear takes at most {most} here "
                         f"({AMX_MAX_TOKENS} on the AMX path: bf16 x and weight, K a multiple of {AMX_COLUMNS}; "
                         f"{LANE_MAX_TOKENS} with isa='lanes')")
    if not weight.is_contiguous():
        raise ValueError(f"weight {tuple(ws)} with strides {weight.stride()} is not contiguous; pass "
                         "weight.contiguous() once instead of a copy on every call")
    if n == 0 or K == 0 or M == 0:
        return linear_reference(x, weight, bias)
    if native.load() is None:
        raise RuntimeError(f"native dense kernels unavailable: {native.status()}")
    return _run(x, weight, bias, threads, isa)


def linear_if_taken(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """`linear` where the kernel takes the call (`takes`), else None: the engine's path, checked once. Past the
    native rows, bf16 x and W on a CPU where torch has no bf16 GEMM (`packs_bf16` false, an AVX2 CPU: F.linear there
    multiplies at ~7-11 GFLOP/s) run on the lanes path in blocks of LANE_MAX_TOKENS rows (benchmarks/dense_paths.py
    on a Zen 3: at 18-72 rows 0.72-0.89x the time of the fma path's row blocks of MAX_TOKENS, each reading W again)."""
    if takes(x, weight, bias):
        return _run(x, weight, bias, None, "auto")
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and x.dim() >= 1
            and x.dtype == weight.dtype == torch.bfloat16 and not packs_bf16()):
        return None
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if not takes(x2[:native_rows(x, weight)], weight, bias):
        return None
    rows = LANE_MAX_TOKENS
    y = torch.cat([_run(x2[i:i + rows], weight, bias, None, "lanes") for i in range(0, x2.shape[0], rows)])
    return y.reshape(*x.shape[:-1], weight.shape[0])


def _run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, threads: int | None,
         isa: str) -> torch.Tensor:
    """The native call, once the arguments are known to fit (`linear`'s checks or `takes`)."""
    lib = native.load()
    (M, K), xs = weight.shape, x.shape
    lead = xs[:-1]
    n = lead[0] if len(lead) == 1 else math.prod(lead)
    xdtype = x.dtype
    x2 = x if len(xs) == 2 else x.reshape(n, K)
    row_stride, col_stride = x2.stride()
    if col_stride != 1 or (n > 1 and row_stride < K):
        x2, row_stride = x2.contiguous(), K
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    y = torch.empty((*lead, M), dtype=xdtype)  # contiguous: [n, M] with row stride M
    codes = native.DTYPE_CODE
    xcode = codes[xdtype]
    rc = lib.moespec_linear(
        codes[weight.dtype], xcode, 0 if bias is None else codes[bias.dtype], xcode, n, K, M, x2.data_ptr(),
        row_stride if n > 1 else K, weight.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(), M,
        threads or torch.get_num_threads(), ISA[isa])
    if rc == 4:
        raise ValueError(f"isa={isa!r} needs bf16 weight and bf16 x on a CPU with "
                         + ("AVX512-BF16" if isa == "dot" else f"AMX tiles, and K a multiple of {AMX_COLUMNS}"))
    if rc != 0:
        raise RuntimeError(f"moespec_linear rejected its arguments (code {rc})")
    return y


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked copy of a contiguous 2-D CPU bf16 weight [M, K], for `packed_linear`; None for any other weight,
    or where torch's oneDNN does not pack bf16 on this CPU (`packs_bf16`). Past the native kernel's rows a call is a
    small GEMM: in oneDNN's own layout (the one Inductor's CPU freezing packs) it multiplies a cold weight at 1.1-1.4x
    F.linear's rate at 17-72 rows on a CPU without AMX (the 32768 x 2048 head: 300-425 GFLOP/s against 220-370), with
    the same result; the copy costs the weight's bytes again."""
    ok = (isinstance(weight, torch.Tensor) and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
          and weight.dim() == 2 and weight.is_contiguous() and min(weight.shape) >= 1)
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS) if ok and packs_bf16() else None


@functools.cache  # the CPU and torch do not change under a process
def packs_bf16() -> bool:
    """Whether torch's oneDNN lays out and multiplies a bf16 weight on this CPU: it refuses (RuntimeError) on one
    without AVX512-BW/VL/DQ or AVX-NE-CONVERT, where a bf16 call past the native kernel's rows runs in native row
    blocks instead (`linear_if_taken`)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    w = torch.ones(2, 2, dtype=torch.bfloat16)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        return bool(packed_linear(w, packed).float().eq(2).all())
    except RuntimeError:
        return False


def packed_takes(x: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether a call goes to `packed_linear`: x [n, K] bf16 of more rows than the native kernel takes
    (native_rows), bias None or bf16."""
    return x.dim() == 2 and x.dtype == torch.bfloat16 and x.shape[0] > native_rows(x) and (
        bias is None or bias.dtype == torch.bfloat16)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T + b [n, M] for x [n, K] bf16 and `pack`'s copy of W; bias None or [M] bf16."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The definition in plain torch: fp32 products and sums, one rounding to x's dtype at the end."""
    y = x.float() @ weight.float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
