"""Weights and buffers in 2 MiB pages (Linux transparent huge pages, MADV_HUGEPAGE).

Physics. A cold stream pays a page walk for every page it enters. In 4 KiB pages a pass over 400 MB of weights
enters ~100,000 pages, whose table entries (~800 KB of them) the previous pass or a cache flush has pushed out of
the caches, and in a virtual machine each walk also walks the host's table; the kernels' streams then run below
what the memory delivers. In 2 MiB pages the same stream enters ~200. So everything this package streams is
placed in memory advised for huge pages: the model's weights (load_model, load_draft), the KV caches, the
bench's and the profile's expert weights, and the ceiling's and the flush's buffers (moespec.measure.timing), so
the streaming-read ceiling is read in the same pages the kernels read.

Where the kernel gives no huge pages (THP "never", not Linux) every function here returns its input unchanged:
the pages are a placement, never a change of values, dtype, shape or layout.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20  # bytes of an x86-64 / arm64 transparent huge page; smaller tensors stay where they are
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str:
    """The kernel's transparent-huge-page mode ("always", "madvise" or "never"), "none" where there is none."""
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return "none"
    chosen = [word[1:-1] for word in text.split() if word.startswith("[") and word.endswith("]")]
    return chosen[0] if chosen else "none"


def available() -> bool:
    """Whether memory advised with MADV_HUGEPAGE may get huge pages here."""
    return thp_mode() in ("always", "madvise") and hasattr(mmap, "MADV_HUGEPAGE")


def placement() -> str:
    """What `huge` gives here, in words, for a result's record."""
    return f"{'2 MiB' if available() else '4 KiB'} pages (transparent huge pages: {thp_mode()})"


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CPU tensor of `shape` and `dtype` in anonymous memory advised for huge pages, its start on a
    page boundary (zero-filled by the kernel). Under HUGE_PAGE bytes, or where `available()` is false, torch's
    own allocation."""
    if any(int(s) < 0 for s in shape):
        raise ValueError(f"shape must be non-negative sizes, got {tuple(shape)}")
    numel = 1
    for s in shape:
        numel *= int(s)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes < HUGE_PAGE or not available():
        return torch.empty(tuple(shape), dtype=dtype)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: the faults then take whole huge pages
    view = ctypes.c_char.from_buffer(region)
    offset = -ctypes.addressof(view) % HUGE_PAGE
    del view  # the export would keep the region from being unmapped once the tensor is gone
    raw = torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=offset)  # holds `region` alive
    return raw.view(dtype).view(tuple(shape))


def huge(t: torch.Tensor) -> torch.Tensor:
    """t's values in a tensor of huge pages (`empty`), or t itself where it stays: off the CPU, not contiguous,
    under HUGE_PAGE bytes, or no huge pages here."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.numel() * t.element_size() < HUGE_PAGE \
            or not available() or t.is_quantized or t.layout != torch.strided:
        return t
    out = empty(t.shape, t.dtype)
    out.copy_(t)
    return out


def to_huge_pages(module: torch.nn.Module) -> int:
    """Move every CPU parameter and buffer of `module` of HUGE_PAGE bytes or more into huge pages, in place (the
    same Parameter objects, so tied weights stay tied); returns the bytes moved."""
    moved = 0
    tensors = [p for p in module.parameters()] + [b for b in module.buffers()]
    for t in {id(t): t for t in tensors}.values():
        data = t.data  # a new tensor object at each access: compare with this one
        placed = huge(data)
        if placed is not data:
            t.data = placed
            moved += placed.numel() * placed.element_size()
    return moved


def huge_page_bytes(t: torch.Tensor) -> int:
    """Bytes of huge pages (AnonHugePages of /proc/self/smaps) in the mappings that hold t's storage; 0 where
    the system does not say."""
    start = t.untyped_storage().data_ptr()
    end = start + t.untyped_storage().nbytes()
    total, inside = 0, False
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low < end and start < high
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1]) * 1024
    return total


def expert_slices(tensors: list[torch.Tensor], experts: object) -> list[torch.Tensor]:
    """The slices of `tensors` (each [N, ...], the experts along dim 0) that hold `experts` (ids, any order,
    repeats allowed): one slice per run of consecutive ids, so a read of them reads each expert's bytes once."""
    ids = sorted({int(e) for e in torch.as_tensor(experts).reshape(-1).tolist()})
    runs: list[list[int]] = []
    for e in ids:
        if runs and e == runs[-1][1]:
            runs[-1][1] = e + 1
        else:
            runs.append([e, e + 1])
    return [t[a:b] for t in tensors for a, b in runs]
