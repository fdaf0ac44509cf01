"""Edge-shape cases shared by the CPU kernel tests and the Triton kernel tests."""

from __future__ import annotations

import torch

# (name, n, m, N, d, f, same_ids): n = 1; all tokens on the same experts; m = N - 1; prime N; up to n = 9;
# d and f not multiples of the SIMD width; a shape with several row tasks and chunks per matrix; a hidden
# size wide enough to be split in column blocks; OLMoE's ratios at small size; a prime number of tokens on each
# expert (13: token blocks of 5, 4 and 4); a pass of 72 tokens (B = 8 sequences of 9), ~36 on each expert; on a CPU
# with AMX, 40 tokens on each expert's tiles (token tiles of 16, 16 and 8; row tiles of 32 then 16; the down rows on
# the wide tiles, f = 48 not a whole column block) and 17 tokens (a second token tile of one; both phases on the
# tiles, 8 gate rows past the last whole row tile).
SHAPES = [
    ("n1_prime7", 1, 2, 7, 37, 13, False),
    ("same_experts", 9, 4, 13, 48, 24, True),
    ("m_is_N_minus_1", 5, 6, 7, 40, 16, False),
    ("prime13_odd", 9, 3, 13, 67, 29, False),
    ("n9_olmoe_like", 9, 8, 64, 64, 32, False),
    ("many_tasks", 4, 2, 5, 1030, 515, True),
    ("wide_hidden", 7, 2, 3, 3000, 24, True),
    ("prime_group_13", 13, 2, 5, 70, 33, True),
    ("pass_of_72", 72, 8, 16, 96, 40, False),
    ("amx_40_tokens", 40, 2, 3, 64, 48, True),
    ("amx_17_tokens", 17, 3, 5, 96, 72, True),
]


def make(n, m, N, d, f, dtype, same=False, bias=False, seed=0):
    """Random inputs with unit-scale activations: x ~ N(0, 1), weights ~ N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(N, generator=g)[:m] for _ in range(n)])
    if same:
        ids = ids[:1].repeat(n, 1)
    weights = torch.rand(n, m, generator=g).to(dtype)
    gate_up = (torch.randn(N, 2 * f, d, generator=g) / d**0.5).to(dtype)
    down = (torch.randn(N, d, f, generator=g) / f**0.5).to(dtype)
    gub = torch.randn(N, 2 * f, generator=g).to(dtype) if bias else None
    db = torch.randn(N, d, generator=g).to(dtype) if bias else None
    return x, ids, weights, gate_up, down, gub, db


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()
