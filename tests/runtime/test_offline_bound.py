"""The offline workload's bound (`radixlm bench gpu --sections offline`), on a config small
enough to count by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from radixlm.bench.gpu import main
from radixlm.bench.gpu_offline import offline_bound

# 2 layers, hidden 4, 4 query dims, 2 kv dims, intermediate 8, vocab 10:
# linears per layer (4 + 2 * 2) * 4 + 4 * 4 + 3 * 8 * 4 = 144, so 288 in all; the LM head 40.
CFG = SimpleNamespace(
    num_hidden_layers=2, hidden_size=4, q_size=4, kv_size=2, intermediate_size=8, vocab_size=10
)


def test_bound_counts_flops_and_bytes() -> None:
    # 3 prompts of 5 tokens, 4 new tokens each; 1000 FLOP/s and 1000 B/s.
    b = offline_bound(CFG, 3, 5, 4, 1000.0, 1000.0)
    # prefill, per prompt: the first layer's linears on 5 rows (2 * 144 * 5), the last layer's
    # K/V projections on 5 rows (2 * 16 * 5) and the rest of it on the last row (2 * 128);
    # attention over 15 causal pairs in the first layer, 5 in the last (4 * 4 FLOPs a pair);
    # the LM head on the last row (2 * 40)
    linears, attention = 1440 + 160 + 256, 4 * 4 * (15 + 5)
    assert b.prefill_s == pytest.approx(3 * (linears + attention + 80) / 1000)
    # 3 decode steps of 3 requests: 2 * (288 + 40) FLOPs a token; the weights (696 B) read
    # once a step take less
    assert b.decode_linear_s == pytest.approx(9 * 2 * 328 / 1000)
    # the steps attend over 6, 7, 8 tokens of 3 requests, 16 B of K/V per token in bf16
    assert b.decode_kv_s == pytest.approx(3 * 21 * 16 / 1000)
    assert b.seconds == pytest.approx(b.prefill_s + b.decode_linear_s + b.decode_kv_s)


def test_bound_with_slow_memory_and_an_fp8_kv_cache() -> None:
    b = offline_bound(CFG, 3, 5, 4, 1000.0, 100.0, kv_dtype_bytes=1)
    assert b.decode_linear_s == pytest.approx(3 * 696 / 100)  # weight reads dominate
    assert b.decode_kv_s == pytest.approx(3 * 21 * 8 / 100)  # half the bytes of bf16


def test_cli_help_parses() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0


def test_moe_weight_reads_grow_with_the_batch() -> None:
    """A mixture of experts: a decode token reads the router and its k experts; a batch reads
    every expert some token routes to (E * (1 - (1 - k / E) ** B) on average), so the offline
    bound's per-step weight reads are those of the whole batch."""
    from radixlm.bench.gpu_common import linear_params_per_layer, weight_bytes

    # 1 sparse layer, hidden 4, 8 experts of 2 active, expert intermediate 2 (3 * 2 * 4 = 24 each)
    moe = SimpleNamespace(
        **{**vars(CFG), "num_hidden_layers": 1, "num_experts": 8, "num_experts_per_tok": 2},
        moe_intermediate_size=2,
        moe_layers=(True,),
    )
    attn = 48  # (4 + 2 * 2) * 4 + 4 * 4
    assert linear_params_per_layer(moe) == attn + 8 * 4 + 2 * 24
    many = linear_params_per_layer(moe, batch=64)
    assert many == round(attn + 8 * 4 + 8 * (1 - 0.75**64) * 24)  # ~ all 8 experts
    b = offline_bound(moe, 64, 5, 4, 1e30, 100.0)  # weight reads dominate the decode linears
    assert b.decode_linear_s == pytest.approx(3 * weight_bytes(moe, batch=64) / 100)
    shared = SimpleNamespace(**vars(moe), shared_expert_intermediate_size=3)
    assert linear_params_per_layer(shared) == linear_params_per_layer(moe) + 3 * 3 * 4 + 4
