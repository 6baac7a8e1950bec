"""Sampling parameters validation and the sampler's math (filters, penalties, seeds)."""

from __future__ import annotations

import math

import pytest
import torch
from speculative.tree_stats import ALPHA, chi2_pvalue

from radixlm.kernels.cpu.sample import sample_rows_ref
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.sampling.sampler import apply_logit_processors, sample
from radixlm.runtime.sampling.sampling_batch import SamplingBatch
from radixlm.runtime.sampling.sampling_params import SamplingParams

V = 50

BAD_PARAMS = [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"max_new_tokens": "8"}, "max_new_tokens"),
    ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
    ({"frequency_penalty": 3.0}, "frequency_penalty"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"n": 0}, "n"),
    ({"n": 1000}, "n"),
    ({"seed": 2**63}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"stop": [""]}, "stop"),
    ({"stop": 3}, "stop"),
    ({"stop": ["x"] * 1000}, "stop"),
    ({"stop_token_ids": [V + 1]}, "stop_token_ids"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"regex": "a", "json_schema": "{}"}, "json_schema"),
    ({"regex": ""}, "regex"),
    ({"choices": []}, "choices"),
    ({"logit_bias": {"99999": 1.0}}, "logit_bias"),
    ({"logit_bias": {"1": 500.0}}, "logit_bias"),
    ({"max_tokens": 8}, "max_tokens"),
    ({"temprature": 0.5}, "temprature"),
]


@pytest.mark.parametrize(("params", "field"), BAD_PARAMS)
def test_invalid_params_name_the_field(params, field) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_dict(params, vocab_size=V)
    assert info.value.field == field
    assert field in str(info.value)


def test_defaults_and_normalisation() -> None:
    sp = SamplingParams.from_dict(
        {"stop": "END", "stop_token_ids": 7, "max_new_tokens": 4.0, "seed": None}
    )
    assert sp.stop == ["END"] and sp.stop_token_ids == [7] and sp.max_new_tokens == 4
    assert sp.seed is None and not sp.is_greedy
    assert SamplingParams.from_dict({"temperature": 0}).is_greedy


class _Req:
    def __init__(
        self,
        seed: int | None = None,
        out: list[int] | None = None,
        prompt: list[int] | None = None,
        **sp,
    ):
        self.sampling_params = SamplingParams.from_dict(sp, V)
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.origin_input_ids = prompt or [1]
        self.output_ids = out or []
        self.stop_ids_for_min_tokens = (2,)


def _batch(*reqs: _Req) -> SamplingBatch:
    return SamplingBatch.from_reqs(list(reqs), V, torch.device("cpu"))


def test_greedy_is_argmax_and_logprobs_are_log_softmax() -> None:
    logits = torch.randn(3, V)
    out = sample(logits.clone(), _batch(*[_Req(temperature=0)] * 3), True, 4)
    assert out.next_token_ids.tolist() == logits.argmax(-1).tolist()
    ref = torch.log_softmax(logits, -1)
    assert torch.allclose(out.logprobs, ref.gather(1, out.next_token_ids[:, None]).squeeze(1))
    assert torch.equal(out.top_logprobs[1], ref.topk(4).indices)


def test_seeded_rows_are_reproducible_and_independent_of_the_batch() -> None:
    logits = torch.randn(4, V)
    a = sample(logits.clone(), _batch(_Req(seed=7), _Req(seed=8), _Req(seed=9), _Req(seed=10)))
    b = sample(logits[[0, 2]].clone(), _batch(_Req(seed=7), _Req(seed=9)))
    assert a.next_token_ids[[0, 2]].tolist() == b.next_token_ids.tolist()
    # Different seeds draw differently somewhere over many steps.
    draws = {
        sample(logits[:1].clone(), _batch(_Req(seed=s))).next_token_ids.item() for s in range(30)
    }
    assert len(draws) > 1


def test_top_k_top_p_min_p_keep_only_allowed_tokens() -> None:
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1] + [0.0] * (V - 4))
    logits = probs.clamp_min(1e-12).log().expand(200, V).clone()
    for sp, allowed in (
        ({"top_k": 2}, {0, 1}),
        ({"top_p": 0.65}, {0, 1}),
        ({"top_p": 0.75}, {0, 1, 2}),
        ({"min_p": 0.6}, {0, 1}),
    ):
        reqs = [_Req(seed=i, **sp) for i in range(200)]
        drawn = set(sample(logits.clone(), _batch(*reqs)).next_token_ids.tolist())
        assert drawn == allowed, sp


def test_penalties_follow_openai_and_hf_definitions() -> None:
    logits = torch.full((1, V), 1.0)
    logits[0, 3] = -2.0
    out = apply_logit_processors(
        logits.clone(), _batch(_Req(out=[5, 5, 3], frequency_penalty=0.5, presence_penalty=0.25))
    )
    assert out[0, 5] == pytest.approx(1.0 - 2 * 0.5 - 0.25)
    assert out[0, 3] == pytest.approx(-2.0 - 0.5 - 0.25)
    assert out[0, 7] == 1.0
    rep = apply_logit_processors(
        logits.clone(), _batch(_Req(out=[3], prompt=[5], repetition_penalty=2.0))
    )
    assert rep[0, 5] == pytest.approx(0.5) and rep[0, 3] == pytest.approx(-4.0) and rep[0, 7] == 1.0


def test_min_new_tokens_bans_eos_and_logit_bias_applies() -> None:
    logits = torch.zeros(1, V)
    logits[0, 2] = 10.0
    out = sample(logits.clone(), _batch(_Req(temperature=0, min_new_tokens=3)))
    assert out.next_token_ids.item() != 2
    biased = sample(torch.zeros(1, V), _batch(_Req(temperature=0, logit_bias={"9": 5.0})))
    assert biased.next_token_ids.item() == 9


def test_cpu_argmax_picks_the_first_maximum_as_torch():
    from radixlm.runtime.sampling.sampler import argmax

    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (8, 1000), generator=gen).float()  # many tied maxima
    logits[3] = float("-inf")
    got = argmax(logits)
    assert got.dtype == torch.int64 and torch.equal(got, logits.argmax(dim=-1))


def _packed(allowed: torch.Tensor) -> torch.Tensor:
    """A bool `[B, V]` as the grammar's int32 bitmask `[B, ceil(V / 32)]`."""
    bits = torch.zeros(allowed.shape[0], -(-V // 32) * 32, dtype=torch.int64)
    bits[:, :V] = allowed.long()
    packed = (bits.view(allowed.shape[0], -1, 32) * 2 ** torch.arange(32)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def _constrained(reqs: list[_Req], allowed: torch.Tensor) -> SamplingBatch:
    from radixlm.runtime.sampling.vocab_mask import DenseMask

    sb = _batch(*reqs)
    sb.set_vocab_mask(DenseMask(_packed(allowed)))
    return sb


@pytest.mark.parametrize(
    "sp",
    [{"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.8}, {"temperature": 1.5, "top_k": 5}],
)
def test_constrained_draws_follow_the_masked_distribution(sp) -> None:
    """At temperature, a grammar's row draws from the masked distribution: the CPU path draws
    from the unmasked row first and masks only where the grammar refuses (filters: masked
    first). 4000 seeds of one row, against softmax(masked / T) through the filters."""
    n = 4000
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(5)) * 2
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[[0, 3, 7, 11, 19, 23, 31, 42, 47]] = True
    allowed[logits.argmax()] = False  # the unmasked favourite is refused
    reqs = [_Req(seed=i, **sp) for i in range(n)]
    drawn = sample(logits.expand(n, V).clone(), _constrained(reqs, allowed.expand(n, V)))
    masked = logits.masked_fill(~allowed, float("-inf"))
    ref = sample_rows_ref(
        masked, [0], [sp["temperature"]], [sp.get("top_k", V)], [sp.get("top_p", 1.0)], [0.0]
    )[0]
    assert allowed[drawn.next_token_ids].all()
    assert chi2_pvalue(drawn.next_token_ids, ref) > ALPHA


def test_unconstrained_draws_follow_the_model_distribution() -> None:
    n = 4000
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(6))
    for sp in ({"temperature": 0.8}, {"temperature": 1.0, "top_p": 0.7, "min_p": 0.1}):
        reqs = [_Req(seed=i, **sp) for i in range(n)]
        drawn = sample(logits.expand(n, V).clone(), _batch(*reqs)).next_token_ids
        ref = sample_rows_ref(
            logits, [0], [sp["temperature"]], [V], [sp.get("top_p", 1.0)], [sp.get("min_p", 0.0)]
        )[0]
        assert chi2_pvalue(drawn, ref) > ALPHA, sp


def test_seeded_constrained_rows_do_not_depend_on_the_batch_or_logprobs() -> None:
    gen = torch.Generator().manual_seed(8)
    for step in range(20):
        logits = torch.randn(4, V, generator=gen) * 2
        allowed = torch.rand(4, V, generator=gen) < 0.3
        allowed[:, 0] = True
        params = [
            {"seed": step, "temperature": 1.0},
            {"temperature": 0},
            {"seed": 100 + step, "temperature": 0.8, "top_p": 0.8},
            {"seed": 200 + step, "temperature": 1.2},
        ]
        full = sample(logits.clone(), _constrained([_Req(**p) for p in params], allowed), True, 2)
        masked = logits.masked_fill(~allowed, float("-inf"))
        ref_lp = torch.log_softmax(masked, -1).gather(1, full.next_token_ids.view(-1, 1))
        assert torch.allclose(full.logprobs, ref_lp.view(-1))
        assert allowed.gather(1, full.next_token_ids.view(-1, 1)).all()
        for i in (0, 2, 3):
            alone = sample(logits[[i]].clone(), _constrained([_Req(**params[i])], allowed[[i]]))
            assert alone.next_token_ids.item() == full.next_token_ids[i].item()
