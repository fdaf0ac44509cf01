"""moespec.kernels.pages: tensors placed in 2 MiB pages keep their values, dtype, shape and sharing."""

from __future__ import annotations

import gc
import mmap
from dataclasses import replace

import pytest
import torch

from moespec.kernels import pages
from moespec.model.cache import new_cache
from moespec.model.load import load_model
from moespec.model.spec import PRESETS

# OLMoE's layout at widths whose expert tensors pass HUGE_PAGE (gate_up 8 MiB, down 4 MiB) and whose
# embedding and attention stay under it
SPEC = replace(PRESETS["olmoe-1b-7b"], name="pages-olmoe", hidden=256, expert_width=128, heads=4, kv_heads=4,
               head_dim=64)

needs_thp = pytest.mark.skipif(not pages.available(), reason="the kernel gives no transparent huge pages here")
HOST_THP_SETTING = pages.THP_SETTING  # read at collection, before the suite's small_pages fixture turns it off


@pytest.fixture(autouse=True)
def host_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """This module checks the placement itself: the host's huge pages, which the rest of the suite leaves off."""
    monkeypatch.setattr(pages, "THP_SETTING", HOST_THP_SETTING)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8, torch.int64])
def test_huge_keeps_values_dtype_and_shape(dtype: torch.dtype) -> None:
    t = (torch.randn(3, 1031, 1024) * 100).to(dtype)  # 3 x 1031 rows: not a whole number of huge pages
    out = pages.huge(t)
    assert out.dtype == dtype and out.shape == t.shape and out.is_contiguous() and torch.equal(out, t)
    out[0, 0, 0] = 0  # a copy, not a view of t
    assert t.data_ptr() != out.data_ptr()


def test_huge_leaves_what_it_cannot_place() -> None:
    small = torch.randn(16, 16)
    strided = torch.randn(2048, 1024).t()
    packed = torch.randn(8, 8).to_sparse()
    for t in (small, strided, packed):
        assert pages.huge(t) is t
    assert pages.empty((0, 5), torch.float32).shape == (0, 5)
    with pytest.raises(ValueError, match="shape"):
        pages.empty((-1, 5), torch.float32)


@needs_thp
def test_huge_places_the_tensor_in_huge_pages_aligned() -> None:
    t = pages.huge(torch.randn(4 * pages.HUGE_PAGE // 4))  # 16 MiB of fp32
    assert t.data_ptr() % pages.HUGE_PAGE == 0
    assert pages.huge_page_bytes(t) >= pages.HUGE_PAGE  # the advice taken: at least one huge page backs it
    # the same bytes in a mapping advised against huge pages hold none (torch's own allocation is no control: it can
    # land in memory that holds some)
    plain = mmap.mmap(-1, 4 * pages.HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    plain.madvise(mmap.MADV_NOHUGEPAGE)
    control = torch.frombuffer(plain, dtype=torch.uint8)
    control.fill_(1)
    assert pages.huge_page_bytes(control) == 0


@needs_thp
def test_the_tensor_outlives_its_source_and_its_name() -> None:
    t = torch.arange(pages.HUGE_PAGE, dtype=torch.int32)
    view = pages.huge(t)[5:9]  # only a view left of the placed tensor
    del t
    gc.collect()
    assert view.tolist() == [5, 6, 7, 8]


def test_thp_mode_reads_the_bracketed_word(tmp_path, monkeypatch) -> None:
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setattr(pages, "THP_SETTING", setting)
    assert pages.thp_mode() == "madvise"
    setting.write_text("always madvise [never]\n")
    assert pages.thp_mode() == "never" and not pages.available()
    t = torch.randn(pages.HUGE_PAGE)
    assert pages.huge(t) is t and pages.to_huge_pages(torch.nn.Linear(2048, 2048)) == 0
    monkeypatch.setattr(pages, "THP_SETTING", tmp_path / "absent")
    assert pages.thp_mode() == "none"


@needs_thp
def test_a_loaded_model_streams_from_huge_pages_and_computes_the_same() -> None:
    lm = load_model(preset=SPEC, layers=2, dtype="bf16", vocab=2048, seed=3)
    big = [p for p in lm.model.parameters() if p.numel() * p.element_size() >= pages.HUGE_PAGE]
    assert len(big) == 4 and all(p.data_ptr() % pages.HUGE_PAGE == 0 for p in big)  # 2 layers x gate_up, down
    ids = torch.tensor([[1, 7, 99, 5]])
    placed = lm.model(ids).logits
    assert pages.to_huge_pages(lm.model) > 0  # placed again: each tensor copied once more
    for p in lm.model.parameters():
        p.data = p.data.clone()  # back into torch's own pages
    assert torch.equal(lm.model(ids).logits, placed)


def test_tied_weights_stay_tied() -> None:
    module = torch.nn.Module()
    module.a = torch.nn.Embedding(2048, 512)  # 4 MiB of fp32
    module.b = torch.nn.Linear(512, 2048, bias=False)
    module.b.weight = module.a.weight
    assert pages.to_huge_pages(module) == (2048 * 512 * 4 if pages.available() else 0)
    assert module.a.weight is module.b.weight and module.a.weight.data_ptr() == module.b.weight.data_ptr()


@needs_thp
def test_the_kv_cache_grows_in_huge_pages() -> None:
    lm = load_model(preset=SPEC, layers=1, dtype="bf16", vocab=2048, seed=3)
    cache = new_cache(lm.model)
    keys, values = torch.randn(2, 1, 4, 1100, 64).bfloat16()  # 2200 rows of room: 1.1 MiB each
    more_keys, more_values = torch.randn(2, 1, 4, 3000, 64).bfloat16()  # grown to 8200 rows: 4.0 MiB each
    cache.update(keys, values, 0)
    got_keys, got_values = cache.update(more_keys, more_values, 0)
    buffers = cache.layers[0]._buffers
    assert all(b.data_ptr() % pages.HUGE_PAGE == 0 and b.shape[-2] == 8200 for b in buffers)
    assert torch.equal(got_keys, torch.cat([keys, more_keys], dim=-2))
    assert torch.equal(got_values, torch.cat([values, more_values], dim=-2))


@pytest.mark.parametrize("ids, runs", [([[3]], [(3, 4)]), ([[0, 1, 2, 3, 4]], [(0, 5)]),
                                       ([[4, 0], [1, 4]], [(0, 2), (4, 5)]), ([[6, 2, 3], [3, 2, 6]], [(2, 4), (6, 7)])])
def test_expert_slices_read_each_expert_once(ids: list[list[int]], runs: list[tuple[int, int]]) -> None:
    """One slice per run of consecutive ids, of every tensor, whatever the order and repeats of the ids: a pass's
    experts, each read once (the slices' bytes are the distinct experts' bytes)."""
    gate_up, down = torch.arange(7 * 6).reshape(7, 2, 3), torch.arange(7 * 3).reshape(7, 3, 1)
    slices = pages.expert_slices([gate_up, down], torch.tensor(ids))
    assert [(s.data_ptr() - t.data_ptr()) // t[0].nbytes for t, s in zip([gate_up] * len(runs) + [down] * len(runs),
                                                                            slices)] == [a for a, _ in runs] * 2
    assert [len(s) for s in slices] == [b - a for a, b in runs] * 2 and all(s.is_contiguous() for s in slices)
