"""Large constraints are checked off the tokenizer manager's event loop: while a request with a
large JSON schema waits for its check in the worker pool, a small constrained request is served
end to end; then the large one is checked, sent, and decodes valid JSON. The order is forced by
holding the pool's workers (a gate), never by timing. Outputs are sampled at temperature 0.8 over
8 seeds and checked with re.fullmatch / json.loads + jsonschema."""

from __future__ import annotations

import json
import re
import threading

from constrained.corpus import chat

from radixlm.runtime.constrained import request_checks
from radixlm.runtime.constrained.request_checks import LARGE_CONSTRAINT_CHARS

SEEDS = range(8)
# A large schema whose outputs are short: the size is in an annotation validators ignore.
BIG = {
    "type": "object",
    "description": "padding " * (LARGE_CONSTRAINT_CHARS // 8 + 1),
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
}


def params(extra: dict) -> list[dict]:
    return [{"temperature": 0.8, "seed": s, "max_new_tokens": 24, **extra} for s in SEEDS]


def test_small_request_served_while_a_large_schema_is_checked(engine):
    import jsonschema

    assert len(json.dumps(BIG)) >= LARGE_CONSTRAINT_CHARS
    gate = threading.Event()
    holders = [
        request_checks.check_pool().submit(gate.wait) for _ in range(request_checks.CHECK_WORKERS)
    ]
    big: list = []
    worker = threading.Thread(
        target=lambda: big.append(
            engine.generate(
                [chat("Pick a number, as JSON.")] * len(SEEDS),
                params({"json_schema": json.dumps(BIG)}),
            )
        )
    )
    try:
        worker.start()
        assert request_checks.wait_pending(1, timeout=120), "the large check never reached the pool"
        small = engine.generate([chat("Three digits:")] * len(SEEDS), params({"regex": "[0-9]{3}"}))
        for out in small:
            assert re.fullmatch("[0-9]{3}", out["text"]), out["text"]
        # NOTE: the large request is still waiting for its check: it was never sent.
        assert worker.is_alive() and request_checks.pending_checks() == 1 and not big
    finally:
        gate.set()
    worker.join(timeout=300)
    assert all(h.done() for h in holders) and request_checks.pending_checks() == 0
    for out in big[0]:
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(out["text"]), BIG)
    assert any(o["meta_info"]["finish_reason"]["type"] == "stop" for o in big[0])


def test_large_schema_error_is_reported_and_cached():

    import pytest

    from radixlm.runtime.errors import GrammarError
    from radixlm.runtime.sampling.sampling_params import SamplingParams

    bad = {**BIG, "properties": {"n": {"type": "array", "uniqueItems": True}}}
    for backend in ("llguidance", "outlines", "xgrammar"):
        sp = SamplingParams.from_dict({"json_schema": json.dumps(bad)})
        for _ in range(2):  # the second time from the verdict cache: the same error
            with pytest.raises(GrammarError, match="uniqueItems"):
                request_checks.check_constraint(sp, backend, None)
