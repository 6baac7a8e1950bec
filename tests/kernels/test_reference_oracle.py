"""The oracle of the oracle: the paged torch references agree with dense SDPA.

For every request, the paged batch is re-laid out contiguously (prefix K/V then new K/V) and fed to
`torch.nn.functional.scaled_dot_product_attention` with a lower-right causal mask.
"""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.decode_attention_ref import decode_attention_ref
from radixlm.kernels.extend_attention import extend_attention_ref
from radixlm.kernels.testing import dense_attention_sdpa, make_paged_batch


def _dense_kv(batch, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    row = int(batch.req_pool_indices[b])
    slots = batch.req_to_token[row, : int(batch.seq_lens[b])].long()
    return batch.k_buffer[slots], batch.v_buffer[slots]


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 4, 64), (8, 2, 128), (8, 1, 80)])
def test_extend_reference_matches_sdpa(heads: int, kv_heads: int, dim: int) -> None:
    batch = make_paged_batch([0, 37, 5], [70, 1, 33], heads, kv_heads, dim, torch.float32)
    got = extend_attention_ref(*batch.extend_args())
    for b in range(3):
        start, ext = int(batch.extend_start_loc[b]), int(batch.extend_lens[b])
        k, v = _dense_kv(batch, b)  # the pool holds the new tokens too
        expected = dense_attention_sdpa(batch.q[start : start + ext], k, v)
        torch.testing.assert_close(got[start : start + ext], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 4, 64), (32, 8, 128)])
def test_decode_reference_matches_sdpa(heads: int, kv_heads: int, dim: int) -> None:
    lens = [1, 37, 200]
    batch = make_paged_batch([n - 1 for n in lens], [1, 1, 1], heads, kv_heads, dim, torch.float32)
    got = decode_attention_ref(*batch.decode_args(), sm_scale=0.05)
    for b in range(3):
        k, v = _dense_kv(batch, b)
        expected = dense_attention_sdpa(batch.q[b : b + 1], k, v, sm_scale=0.05)[0]
        torch.testing.assert_close(got[b], expected, atol=1e-5, rtol=1e-5)


def test_paged_batch_layout() -> None:
    """make_paged_batch scatters rows and slots and never hands out slot 0."""
    batch = make_paged_batch([3, 0], [2, 4], 2, 1, 16, torch.float32, seed=1)
    for b in range(2):
        row = int(batch.req_pool_indices[b])
        slots = batch.req_to_token[row, : int(batch.seq_lens[b])]
        assert (slots > 0).all()
        assert not torch.isnan(batch.k_buffer[slots.long()]).any()
    assert torch.isnan(batch.k_buffer[0]).all()  # padding slot poisoned
    assert batch.extend_start_loc.tolist() == [0, 2]
