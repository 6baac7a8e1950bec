"""Decode-step inputs assembled by one kernel, against the torch reference."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.decode_inputs import DECODE_INPUT_ROWS, decode_inputs, decode_inputs_ref

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


@pytest.mark.parametrize("ids_on_device", [False, True])
@pytest.mark.parametrize("bs", [1, 5, 130])
def test_decode_inputs_match_reference(device: str, bs: int, ids_on_device: bool) -> None:
    gen = torch.Generator().manual_seed(bs)
    rows = torch.randperm(200, generator=gen)[:bs]
    positions = torch.randint(0, 64, (bs,), generator=gen)
    ids = torch.randint(0, 50_000, (bs,), generator=gen)
    slots = torch.randperm(10_000, generator=gen)[:bs] + 1
    cols = torch.stack([rows, positions] if ids_on_device else [rows, positions, ids])
    results = []
    for fn in (decode_inputs, decode_inputs_ref):
        table = torch.full((200, 64), -7, dtype=torch.int32)
        # a wider buffer (as the CUDA graphs' static inputs): columns past bs stay untouched
        out = torch.full((len(DECODE_INPUT_ROWS), bs + 3), -1, dtype=torch.int64)
        table, out = table.to(device), out.to(device)
        args = (cols.to(device), ids.to(device) if ids_on_device else None, slots.to(device))
        fn(*args, table, out[:, :bs])
        results.append((table.cpu(), out.cpu()))
    (table, out), (ref_table, ref_out) = results
    assert torch.equal(out, ref_out) and torch.equal(table, ref_table)
    assert out[:, :bs].tolist() == [
        ids.tolist(),
        positions.tolist(),
        slots.tolist(),
        rows.tolist(),
        (positions + 1).tolist(),
    ]
    assert (out[:, bs:] == -1).all()
    assert table[rows, positions].tolist() == slots.tolist()
    assert int((table != -7).sum()) == bs  # nothing else in the table written
