"""Speculative decoding at tp_size > 1 (issues 25 x 26) through the real engine over gloo on
127.0.0.1: TP=2 with speculation gives the greedy tokens of TP=1 without it (conftest.py's
`reference`, the workload of tp_workload.py: a batch of requests with different acceptance, the
radix cache warm in a second round, chunked prefill, retraction, a regex-constrained request and
logprobs); after every part the KV accounting is exact and every follower's `req_to_token` table
equals rank 0's (`check_invariants`). Drafts are all verified (`speculative_verify_all`), so the
verify steps run whatever the gate would measure on this machine.

NGRAM drafts well on the counting and story prompts and not on the others; a STANDALONE draft is
a tiny random Llama with the default model's vocabulary (rank 0 alone holds it,
runtime/speculative/draft_setup.py), whose drafts are mostly rejected: the verify step's reject
path and the draft's own KV on rank 0. On two GPUs: NGRAM over NCCL (`test_nccl_tp2_ngram`).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from distributed.tp_workload import CONFIG, check_same, run_workload
from speculative.draft_heads import save_llama

from radixlm.runtime.models.loader import resolve_model

SPEC = {"speculative_verify_all": True}


def run_spec_engine(config: dict[str, Any], **spec: Any) -> dict[str, Any]:
    from radixlm.runtime.frontend.engine import Engine

    engine = Engine(tp_size=2, **config, **SPEC, **spec)
    try:
        return run_workload(engine)
    finally:
        engine.shutdown()


def check_speculated(got: dict[str, Any]) -> None:
    info = got["info"]
    assert info["spec_verify_steps"] > 0 and info["spec_draft_tokens"] > 0
    assert all(a is not None and a >= 1.0 for a in got["accept"])


def test_tp2_ngram_matches_tp1(reference: dict[str, Any]) -> None:
    got = run_spec_engine(CONFIG, speculative_algorithm="NGRAM")
    check_same(reference, got, 2)
    check_speculated(got)
    # the batch mixed acceptance: some requests committed several tokens a step, others one
    assert max(got["accept"]) > 1.5 and len(set(got["accept"])) > 1
    assert got["info"]["spec_committed_tokens"] > got["info"]["spec_verify_steps"]


def test_tp2_standalone_draft_matches_tp1(reference: dict[str, Any], tmp_path) -> None:
    vocab = resolve_model(None, "auto").config.vocab_size
    save_llama(str(tmp_path), seed=5, hidden=32, layers=1, heads=2, vocab=vocab)
    got = run_spec_engine(CONFIG, speculative_algorithm="STANDALONE",
                          speculative_draft_model_path=str(tmp_path),
                          speculative_num_steps=2)  # fmt: skip
    check_same(reference, got, 2)
    check_speculated(got)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)
def test_nccl_tp2_ngram() -> None:
    """NGRAM at TP=2 over NCCL (decode steps from CUDA graphs, verify steps eager, as at TP=1)
    against TP=1 without speculation, fp32."""
    from radixlm.runtime.frontend.engine import Engine

    gpu = {**CONFIG, "device": "cuda"}
    engine = Engine(**gpu)
    try:
        ref = run_workload(engine)
    finally:
        engine.shutdown()
    got = run_spec_engine(gpu, speculative_algorithm="NGRAM")
    check_same(ref, got, 2)
    check_speculated(got)
