"""CPU weights in 2 MB pages: one anonymous mapping advised `MADV_HUGEPAGE` (Linux).

A decode step streams every weight once, and in 4 KB pages the stream pays a TLB walk per page
and the hardware prefetchers stop at each page's end: on the AVX-512 CI machine (THP `madvise`)
the same fp32 GEMV sweep over the default model read 22.2 GB/s from 4 KB pages and 27.7 GB/s from
2 MB pages on one core (40.9 vs 48.8 GB/s on two). llama.cpp gets the file's pages from `mmap`.

`HugeArena.rehome(tensors)` copies tensors into one such mapping (each 64-byte aligned) and
returns the copies; the arena owns the mapping and must outlive them (its owner keeps it: see
runtime/models/cpu_linear.py). Where the mapping or the advice is refused (another OS, THP
`never`) or `RADIXLM_CPU_HUGEPAGES=0`, it returns None and the tensors stay where they are.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys

import torch

logger = logging.getLogger(__name__)

HUGE = 2 << 20
_ALIGN = 64
_MADV_HUGEPAGE = 14
DISABLE_ENV = "RADIXLM_CPU_HUGEPAGES"  # "0": keep the weights in ordinary pages


def _madvise_huge(address: int, length: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc.madvise(address, length, _MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False


def supported() -> bool:
    """Whether this OS backs memory with transparent huge pages (Linux built with THP)."""
    return sys.platform.startswith("linux") and os.path.isdir("/sys/kernel/mm/transparent_hugepage")


class HugeArena:
    """Owns one anonymous mapping advised for huge pages (see the module docstring)."""

    def __init__(self) -> None:
        self.mappings: list[mmap.mmap] = []
        self.nbytes = 0

    def rehome(self, tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """Copies of contiguous CPU `tensors` in 2 MB-advised memory, or None (not possible)."""
        if not supported() or not tensors or os.environ.get(DISABLE_ENV) == "0":
            return None
        sizes = [t.numel() * t.element_size() for t in tensors]
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += (n + _ALIGN - 1) // _ALIGN * _ALIGN
        length = (total + HUGE - 1) // HUGE * HUGE + HUGE  # + one page: room to align the start
        try:
            m = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError, AttributeError):
            return None
        view = ctypes.c_char.from_buffer(m)
        base = ctypes.addressof(view)
        del view  # NOTE: an exported buffer would keep the mapping from ever closing
        start = (-base) % HUGE
        if not _madvise_huge(base + start, length - start):
            m.close()
            return None
        out = []
        for t, n, off in zip(tensors, sizes, offsets):
            flat = torch.frombuffer(m, dtype=torch.uint8, count=n, offset=start + off)
            copy = flat.view(t.dtype).view(t.shape)
            copy.copy_(t)
            out.append(copy)
        self.mappings.append(m)
        self.nbytes += total
        return out
