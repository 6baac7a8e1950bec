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
path and the draft's own KV on rank 0. Draft heads (EAGLE, EAGLE3) on a tiny random target with
the default model's vocabulary. On two GPUs: NGRAM and STANDALONE over NCCL
(`test_nccl_tp2_speculation`).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from distributed.tp_workload import CONFIG, check_same, run_workload
from speculative.draft_heads import save_head, save_llama

from radixlm.runtime.models.loader import resolve_model
from tests_helpers import PARITY_PROMPTS, wait_idle_and_check

SPEC = {"speculative_verify_all": True}
HEAD_PROMPTS = [PARITY_PROMPTS[6], PARITY_PROMPTS[0], PARITY_PROMPTS[7]]
TINY_GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


def run_spec_engine(config: dict[str, Any], **spec: Any) -> dict[str, Any]:
    from radixlm.runtime.frontend.engine import Engine

    engine = Engine(tp_size=2, **config, **SPEC, **spec)
    try:
        return run_workload(engine)
    finally:
        engine.shutdown()


def test_a_head_needs_a_llama_style_target() -> None:
    """Refused by name at start-up (before rank 0 sends anything), not a hang or a wrong head."""
    from radixlm.runtime.distributed.head_parts import check_head_target
    from radixlm.runtime.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as err:
        check_head_target(torch.nn.Linear(2, 2))
    assert err.value.field == "speculative_algorithm"


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
def test_nccl_tp2_speculation(tmp_path) -> None:
    """NGRAM and a STANDALONE draft at TP=2 over NCCL (the target's decode and verify steps and
    the draft's steps from CUDA graphs, every rank replaying the same verify graph) against TP=1
    without speculation, fp32."""
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
    assert got["info"]["spec_verify_graph_steps"] > 0
    save_llama(str(tmp_path), seed=5, hidden=32, layers=1, heads=2,
               vocab=resolve_model(None, "auto").config.vocab_size)  # fmt: skip
    got = run_spec_engine(gpu, speculative_algorithm="STANDALONE",
                          speculative_draft_model_path=str(tmp_path))  # fmt: skip
    check_same(ref, got, 2)
    check_speculated(got)
    assert got["info"]["spec_verify_graph_steps"] > 0


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> dict[str, Any]:
    """A tiny random Llama with the default model's vocabulary (4 heads, 2 KV heads: one per rank
    at TP=2; an untied LM head), its greedy outputs at TP=1 without speculation, and the two
    random heads for it."""
    from radixlm.runtime.frontend.engine import Engine
    from radixlm.runtime.models.default_model import default_model_path

    vocab = resolve_model(None, "auto").config.vocab_size
    paths = {k: str(tmp_path_factory.mktemp(k.lower())) for k in ("target", "EAGLE", "EAGLE3")}
    save_llama(paths["target"], seed=0, vocab=vocab)
    for kind in ("EAGLE", "EAGLE3"):
        save_head(paths[kind], kind, seed=1, vocab=vocab)
    config = {**CONFIG, "model_path": paths["target"], "tokenizer_path": default_model_path()}
    engine = Engine(**config)
    try:
        ref = engine.generate(HEAD_PROMPTS, TINY_GREEDY)
        wait_idle_and_check(engine)
    finally:
        engine.shutdown()
    return {"config": config, "paths": paths, "ids": [o["output_ids"] for o in ref]}


@pytest.mark.parametrize("algo, gated", [("EAGLE", False), ("EAGLE3", False), ("NGRAM", True)])
def test_tp2_tiny_target_matches_tp1(tiny_target: dict[str, Any], algo: str, gated: bool) -> None:
    """TP=1's greedy tokens at TP=2 with a draft head (rank 0 runs it on gathered copies of the
    target's embedding and LM head; every rank captures the target's layers alike; tree drafts),
    and with NGRAM under the cost-aware gate (its timing-driven choices made on rank 0 alone)."""
    from radixlm.runtime.frontend.engine import Engine

    spec: dict[str, Any] = {"speculative_algorithm": algo, "speculative_verify_all": not gated}
    if algo != "NGRAM":
        spec.update(speculative_draft_model_path=tiny_target["paths"][algo],
                    speculative_eagle_topk=2)  # fmt: skip
    engine = Engine(tp_size=2, **tiny_target["config"], **spec)
    try:
        outs = engine.generate(HEAD_PROMPTS, TINY_GREEDY)
        wait_idle_and_check(engine)
        info = engine.get_server_info()
    finally:
        engine.shutdown()
    assert [o["output_ids"] for o in outs] == tiny_target["ids"]
    assert info["spec_verify_steps"] > 0
    assert gated or info["spec_draft_tokens"] > 0
