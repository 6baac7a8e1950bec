"""kernels/cpu/hugepages.py: weights copied into one mapping advised for 2 MB pages, unchanged."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.cpu.hugepages import DISABLE_ENV, HugeArena, supported

linux = pytest.mark.skipif(not supported(), reason="no transparent huge pages (Linux with THP)")


def _vm_flags(address: int) -> str:
    """The VmFlags of the mapping of this process that holds `address`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line
    return ""


@linux
def test_rehome_copies_into_one_advised_mapping() -> None:
    tensors = [torch.randn(300, 7), torch.randn(5).half(), torch.randint(0, 255, (9, 34)).byte()]
    arena = HugeArena()
    moved = arena.rehome(tensors)
    assert moved is not None and len(arena.mappings) == 1
    for old, new in zip(tensors, moved):
        assert torch.equal(old, new) and new.dtype == old.dtype and new.data_ptr() % 64 == 0
        assert new.data_ptr() != old.data_ptr()
        assert " hg" in _vm_flags(new.data_ptr()), "MADV_HUGEPAGE not on the mapping"
    moved[0].add_(1.0)  # the copies are writable and independent of the originals
    assert torch.equal(moved[0], tensors[0] + 1.0)


def test_disabled_by_env(monkeypatch) -> None:
    monkeypatch.setenv(DISABLE_ENV, "0")
    assert HugeArena().rehome([torch.zeros(4)]) is None
