"""The CPU sampling kernel (`kernels/cpu/sample.cpp`) against its torch reference: driven by a
grid of uniforms, each token's share of the draws is its probability after the filters."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.cpu.linear import _lib
from radixlm.kernels.cpu.sample import sample_rows, sample_rows_ref

pytestmark = pytest.mark.skipif(_lib() is None, reason="no CPU kernel library")

V = 1003  # not a multiple of the 8 lanes or the 64-token groups
N = 100_000  # grid points: a token's share is within 1 / N of its probability

# (temperature, top_k, top_p, min_p)
PARAMS = [
    (1.0, V, 1.0, 0.0),
    (0.7, V, 1.0, 0.0),
    (1.3, 20, 1.0, 0.0),
    (1.0, V, 0.9, 0.0),
    (1.0, V, 1.0, 0.05),
    (0.8, 50, 0.8, 0.02),
    (1.0, 1, 1.0, 0.0),
]


def _grid_shares(logits: torch.Tensor, t: float, k: int, p: float, mp: float) -> torch.Tensor:
    uniforms = ((torch.arange(N, dtype=torch.float64) + 0.5) / N).tolist()
    drawn = sample_rows(logits, [0] * N, [t] * N, [k] * N, [p] * N, [mp] * N, uniforms)
    assert drawn is not None
    return torch.bincount(drawn, minlength=logits.shape[1]).double() / N


@pytest.mark.parametrize("params", PARAMS)
def test_each_token_is_drawn_in_proportion_to_its_filtered_probability(params) -> None:
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(0)) * 3
    logits[0, ::7] = float("-inf")  # masked tokens
    shares = _grid_shares(logits, *params)
    ref = sample_rows_ref(logits, [0], [params[0]], [params[1]], [params[2]], [params[3]])[0]
    assert (shares - ref).abs().max().item() <= 2.0 / N
    assert shares[ref == 0].sum().item() == 0.0  # filtered and masked tokens: never


def test_a_long_nucleus_grows_the_candidate_set() -> None:
    """Probabilities from 1 down to 1e-13 and top_p near 1: the kept tokens reach far below the
    first candidate threshold (1e-3 of the largest)."""
    logits = torch.linspace(0.0, -30.0, V).view(1, V)
    shares = _grid_shares(logits, 1.0, V, 0.999999, 0.0)
    ref = sample_rows_ref(logits, [0], [1.0], [V], [0.999999], [0.0])[0]
    assert int((ref > 0).sum()) > 300
    assert (shares - ref).abs().max().item() <= 2.0 / N


@pytest.mark.parametrize(
    "params", [(1.0, 6007, 0.9, 0.0), (1.0, 3000, 1.0, 0.0), (2.0, 6007, 0.5, 1e-4)]
)
def test_flat_rows_go_through_the_buckets(params) -> None:
    """Over 4096 tokens within 1e-3 of the largest: the filters walk the buckets of e."""
    logits = torch.randn(1, 6007, generator=torch.Generator().manual_seed(3)) * 0.5
    logits[0, ::11] = float("-inf")
    shares = _grid_shares(logits, *params)
    ref = sample_rows_ref(logits, [0], *([x] for x in params))[0]
    assert int((ref > 0).sum()) > 100
    assert (shares - ref).abs().max().item() <= 2.0 / N
    assert shares[ref == 0].sum().item() == 0.0


def test_uniforms_at_the_ends_draw_allowed_tokens() -> None:
    logits = torch.full((1, V), float("-inf"))
    logits[0, [5, 600, 1002]] = torch.tensor([0.0, 1.0, -1.0])
    ends = [0.0, 1.0 - 2.0**-53]
    for t, k, p, mp in PARAMS:
        drawn = sample_rows(logits, [0, 0], [t] * 2, [k] * 2, [p] * 2, [mp] * 2, ends)
        assert set(drawn.tolist()) <= {5, 600, 1002}


def test_rows_are_drawn_independently() -> None:
    logits = torch.randn(len(PARAMS), V, generator=torch.Generator().manual_seed(1))
    cols = list(zip(*PARAMS))
    uniforms = torch.rand(len(PARAMS), generator=torch.Generator().manual_seed(2)).tolist()
    rows = list(range(len(PARAMS)))
    batch = sample_rows(logits, rows, *cols, uniforms)
    alone = [
        sample_rows(logits, [i], [t], [k], [p], [mp], [uniforms[i]]).item()
        for i, (t, k, p, mp) in enumerate(PARAMS)
    ]
    assert batch.tolist() == alone


def test_a_row_without_any_allowed_token_draws_minus_one() -> None:
    logits = torch.full((2, 64), float("-inf"))
    logits[0, 3] = 0.0
    drawn = sample_rows(logits, [0, 1], [1.0] * 2, [64] * 2, [1.0] * 2, [0.0] * 2, [0.5] * 2)
    assert drawn.tolist() == [3, -1]
