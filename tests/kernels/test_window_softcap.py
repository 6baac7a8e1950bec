"""Sliding windows and attention-logit soft-capping in the Triton extend and decode kernels,
against their torch references. Pool slots a windowed query must not see hold NaN: a kernel that
read them (even masked) would return NaN."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels._triton import HAS_TRITON
from radixlm.kernels.decode_attention import decode_attention
from radixlm.kernels.decode_attention_ref import decode_attention_ref
from radixlm.kernels.extend_attention import extend_attention, extend_attention_ref
from radixlm.kernels.testing import PagedBatch, assert_close, make_paged_batch

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

WINDOW = 12


def _poison_outside_window(batch: PagedBatch, first_query: list[int]) -> None:
    """NaN into the pool slots of positions < (first query position - WINDOW + 1)."""
    for b, q_pos in enumerate(first_query):
        row = int(batch.req_pool_indices[b])
        hidden = batch.req_to_token[row, : max(0, q_pos - WINDOW + 1)].long()
        batch.k_buffer[hidden] = float("nan")
        batch.v_buffer[hidden] = float("nan")


@pytest.mark.parametrize(
    ("window", "softcap", "dtype"),
    [(WINDOW, None, torch.float32), (None, 2.0, torch.float32), (WINDOW, 2.0, torch.float16)],
)
def test_extend_window_softcap_matches_reference(device, window, softcap, dtype) -> None:
    # a prefix longer than the window, one shorter, none; query blocks past the window
    batch = make_paged_batch([40, 5, 0], [70, 3, 33], 4, 2, 64, dtype, device, seed=5)
    if window is not None:
        _poison_outside_window(batch, batch.prefix_lens.tolist())
    args = batch.extend_args()
    out = torch.full_like(batch.q, float("nan"))
    kw = {"window": window, "softcap": softcap, "sm_scale": 0.4}
    extend_attention(*args, batch.max_extend_len, out=out, **kw)
    assert not out.isnan().any()
    assert_close(out, extend_attention_ref(*args, **kw), dtype, "windowed extend attention")


@pytest.mark.parametrize("fused_merge", [True, False])
@pytest.mark.parametrize(("window", "softcap"), [(WINDOW, None), (None, 2.0), (WINDOW, 2.0)])
def test_decode_window_softcap_matches_reference(device, window, softcap, fused_merge) -> None:
    lens = [1, 9, 37, 100]
    batch = make_paged_batch([n - 1 for n in lens], [1] * 4, 8, 2, 64, torch.float32, device)
    if window is not None:
        _poison_outside_window(batch, [n - 1 for n in lens])
    args = batch.decode_args()
    out = torch.full_like(batch.q, float("nan"))
    kw = {"window": window, "softcap": softcap}
    decode_attention(*args, num_kv_splits=3, out=out, fused_merge=fused_merge, **kw)
    assert not out.isnan().any()
    assert_close(out, decode_attention_ref(*args, **kw), torch.float32, "windowed decode")


def test_softcap_changes_the_result(device) -> None:
    """The cap bites at these scales (so the tests above are not vacuous)."""
    batch = make_paged_batch([30], [1], 4, 2, 64, torch.float32, device, seed=1)
    batch.q.mul_(8.0)
    args = batch.decode_args()
    capped = decode_attention(*args, softcap=1.0)
    assert (capped - decode_attention(*args)).abs().max() > 1e-2
