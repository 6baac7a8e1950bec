"""Draft heads through the `Engine` (its processes: the head loads in the scheduler process, the
target captures its layers there): a random EAGLE-3 head on the `tiny-smollm` preset (dummy
weights, the default model's tokenizer), greedy text and ids identical with speculation on and
off, the speculative `meta_info` keys, and the KV accounting exact at the end."""

from __future__ import annotations

import pytest
from speculative.draft_heads import save_head

from radixlm.runtime.models.default_model import default_model_path
from tests_helpers import get_engine, release_engine

PROMPTS = ["1, 2, 3, 4,", "The capital of France is"]
GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    head = str(tmp_path_factory.mktemp("eagle3_smollm"))
    save_head(head, "EAGLE3", seed=2, vocab=49152, theta=100000.0)
    common = {"model_path": "tiny-smollm", "load_format": "dummy", "num_threads": 1,
              "tokenizer_path": default_model_path(), "random_seed": 0}  # fmt: skip
    spec = {**common, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": head,
            "speculative_eagle_topk": 2}  # fmt: skip
    try:
        yield get_engine(**common), get_engine(**spec)
    finally:
        release_engine(**spec)
        release_engine(**common)


def test_eagle3_head_through_the_engine(engines) -> None:
    plain, spec = engines
    off = [plain.generate(p, GREEDY) for p in PROMPTS]
    on = [spec.generate(p, GREEDY) for p in PROMPTS]
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    assert [o["text"] for o in on] == [o["text"] for o in off]
    for o in on:
        meta = o["meta_info"]
        assert meta["spec_verify_ct"] >= 1
        assert meta["spec_verify_ct"] * meta["spec_accept_length"] == pytest.approx(15)
    assert spec.get_server_info()["speculative_num_draft_tokens"] == 8
