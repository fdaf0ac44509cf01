"""moespec.measure.placement: experts read in blocks of at least BLOCK_BYTES, each block's median read rate over the
ceiling's sample, one value per expert; none off the CPU's memory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from moespec import ArgumentError
from moespec.measure import placement
from moespec.measure.timing import CpuTimer

MIB = 1 << 20


def test_blocks_hold_at_least_block_bytes_and_cover_every_expert_once() -> None:
    six = placement.blocks(6 * MIB, 64)  # 3 experts make 18 MiB; the one left over joins the last block
    assert [len(b) for b in six] == [3] * 20 + [4] and [e for b in six for e in b] == list(range(64))
    assert [len(b) for b in placement.blocks(40 * MIB, 5)] == [1] * 5  # an expert past 16 MiB is a block alone
    assert placement.blocks(24 << 10, 64) == [range(64)]  # 1.5 MiB in all: one block
    assert placement.blocks(16 * MIB, 2) == [range(0, 1), range(1, 2)]
    for bad in ((0, 4), (MIB, 0)):
        with pytest.raises(ArgumentError, match="expert_bytes and experts"):
            placement.blocks(*bad)


def fake_timer() -> SimpleNamespace:
    return SimpleNamespace(flush=lambda: None)


def test_each_expert_takes_its_blocks_median_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads whose rate depends on the block (by its first byte's address) over a ceiling sample of 10 GB/s: each
    expert's value is its block's rate / 10, the median over the rounds (one disturbed read per block left out)."""
    gate_up, down = torch.zeros(6, 3 * MIB, dtype=torch.uint8), torch.zeros(6, 5 * MIB, dtype=torch.uint8)
    base, row = gate_up.data_ptr(), gate_up[0].numel()
    spans = placement.blocks(8 * MIB, 6)
    assert spans == [range(0, 2), range(2, 4), range(4, 6)]
    rates = {s.start: 5.0 * (i + 1) for i, s in enumerate(spans)}
    calls: dict[int, int] = {}

    def read(parts: list[torch.Tensor]) -> float:
        first = (parts[0].data_ptr() - base) // row
        calls[first] = calls.get(first, 0) + 1
        return 1000.0 if calls[first] == 1 else rates[first]  # the first read of each block disturbed

    steps: list[str] = []
    monkeypatch.setattr(placement, "read_gbps", read)
    monkeypatch.setattr(placement, "read_pages", lambda parts: steps.append(f"in place {len(parts)}"))
    timer = SimpleNamespace(flush=lambda: steps.append("flush"))
    got = placement.expert_placement([gate_up, down], timer, lambda: 10.0, reps=5)
    assert got == [rates[s.start] / 10.0 for s in spans for _ in s]
    assert all(n == 5 for n in calls.values())
    assert steps == ["in place 2", "flush"] * 15  # each block read once before its flush, then timed


def test_real_reads_give_one_positive_value_per_expert() -> None:
    """Experts of 6 MiB (fp32): blocks of three, one value per block; a layer under BLOCK_BYTES has none."""
    gate_up, down = torch.randn(4, 1024, 1024), torch.randn(4, 1024, 512)
    got = placement.expert_placement([gate_up, down], CpuTimer(), lambda: 10.0, reps=2)
    assert got is not None and len(got) == 4 and min(got) > 0 and len(set(got)) == 1  # 24 MiB: one block
    small = [torch.randn(4, 256, 128), torch.randn(4, 128, 128)]  # 768 KiB in all
    assert placement.expert_placement(small, CpuTimer(), lambda: 10.0) is None


def test_no_placement_off_the_cpu_or_for_a_strided_tensor() -> None:
    strided = torch.zeros(4, 8, 8).transpose(1, 2)
    assert placement.expert_placement([strided], fake_timer(), lambda: 10.0) is None
    with pytest.raises(ArgumentError, match="share their expert count"):
        placement.expert_placement([torch.zeros(4, 8), torch.zeros(3, 8)], fake_timer(), lambda: 10.0)
