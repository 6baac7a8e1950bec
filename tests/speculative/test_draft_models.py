"""Draft-model proposers (runtime/speculative/draft_worker.py): EAGLE / EAGLE-3 heads loaded from
random checkpoints in their Hugging Face formats and checked against a reference written from
those formats, STANDALONE drafts, the trees they propose, their draft KV, and greedy outputs
token-identical with speculation on and off (a minimal speculative loop, spec_loop.py)."""

from __future__ import annotations

import json

import pytest
import torch
from speculative.draft_heads import AUX_LAYER_IDS, reference_head, save_head

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.draft_setup import build_draft_proposer

PROMPTS = [[5, 17, 250, 3, 99, 42, 7], [11, 300, 8, 8, 64], [400, 2, 77, 19, 5, 23, 123, 88, 6]]


def build(algo: str, draft: str, device: str = "cpu", **flags):
    """A tiny-llama target runner (dummy weights) and the proposer for `algo` / `draft`."""
    args = ServerArgs(
        model_path="tiny-llama", load_format="dummy", device=device, max_total_tokens=1024,
        max_running_requests=8, speculative_algorithm=algo, speculative_draft_model_path=draft,
        **flags,
    )  # fmt: skip
    target = ModelRunner(args, resolve_model("tiny-llama", "dummy"))
    return target, build_draft_proposer(args, target)


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> dict[str, tuple[str, dict]]:
    out = {}
    for kind in ("EAGLE", "EAGLE3"):
        path = str(tmp_path_factory.mktemp(kind.lower()))
        out[kind] = (path, save_head(path, kind, seed=1))
    return out


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory) -> str:
    """A one-layer Llama config with the target's vocabulary (dummy weights: random, not the
    target's)."""
    path = tmp_path_factory.mktemp("small_draft")
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def _head_forward(runner, ids, feats, positions, prefix: int, row: int, slots) -> torch.Tensor:
    """One request's rows through the draft runner (EXTEND after `prefix` held rows)."""
    n = ids.shape[0]
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    runner.req_to_token.write(row, prefix, slots)
    batch = ForwardBatch(
        ForwardMode.EXTEND, 1, ids, positions, slots, t([row]), t([prefix + n]), [prefix + n],
        [prefix], [n], t([prefix]), t([n]), t([0]), t(list(range(n))), list(range(n)),
        spec_features=feats,
    )  # fmt: skip
    return runner.forward(batch)


@pytest.mark.parametrize("kind", ["EAGLE", "EAGLE3"])
def test_head_forward_matches_the_reference(heads, kind) -> None:
    """Every row's logits and next feature equal the reference's, over a prefill of 8 rows and
    one more row attending to them through the draft KV pool."""
    path, tensors = heads[kind]
    target, proposer = build(kind, path)
    runner, head = proposer.runner, proposer.runner.model
    g = torch.Generator().manual_seed(3)
    n = 9
    ids = torch.randint(0, 512, (n,), generator=g)
    feats = torch.randn(n, head.feature_dim, generator=g)
    if kind == "EAGLE3":  # the last row is a draft step: the head's own H-wide feature
        feats_rows = [feats[: n - 1], torch.randn(1, 64, generator=g)]
    else:
        feats_rows = [feats[: n - 1], feats[n - 1 :]]
    embed = target.model.embed_tokens.weight.detach()
    row = runner.req_to_token.alloc()
    slots = runner.kv_pool.allocator.alloc(n)
    first = _head_forward(runner, ids[:-1], feats_rows[0], torch.arange(n - 1), 0, row, slots[:-1])
    last = _head_forward(
        runner, ids[-1:], feats_rows[1], torch.tensor([n - 1]), n - 1, row, slots[-1:]
    )
    if kind == "EAGLE3":  # NOTE: the reference takes H-wide rows as they are: project the rest
        ref_in = torch.cat([feats_rows[0] @ tensors["fc.weight"].T, feats_rows[1]])
    else:
        ref_in = torch.cat(feats_rows)
    ref_logits, ref_next = reference_head(kind, tensors, embed, ids, ref_in)
    for out, rows in ((first, slice(0, n - 1)), (last, slice(n - 1, n))):
        logit_in, nxt = head.split_output(out)
        logits = runner.compute_logits(logit_in)
        assert torch.allclose(logits, ref_logits[rows], atol=1e-4)
        assert torch.allclose(nxt, ref_next[rows], atol=1e-4)
    if kind == "EAGLE3":  # draft ids map to target ids through d2t
        d = torch.arange(128)
        assert torch.equal(head.to_target_ids(d), d + tensors["d2t"])
        assert target.model.capture == tuple(i + 1 for i in AUX_LAYER_IDS)
    else:
        assert target.model.capture == (2,)  # the final normed hidden of the 2-layer target
