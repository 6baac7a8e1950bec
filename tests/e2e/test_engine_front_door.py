"""The front door validates and tokenizes a request once: the tokenizer's `encode` runs once per
prompt of a generate call (its n > 1 samples and their shared-prompt prefill reuse the ids), and
the results are those of the one request path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def encode_calls(engine) -> Iterator[list[str]]:
    """Record the texts the engine's tokenizer encodes (a spy on the third-party tokenizer)."""
    tokenizer = engine.tokenizer_manager.tokenizer
    original = tokenizer.encode
    calls: list[str] = []

    def encode(text: str, *args: Any, **kwargs: Any) -> list[int]:
        calls.append(text)
        return original(text, *args, **kwargs)

    tokenizer.encode = encode
    try:
        yield calls
    finally:
        del tokenizer.encode  # back to the class's method


def test_a_prompt_is_tokenized_once(engine, encode_calls) -> None:
    out = engine.generate("Once upon a time", {"max_new_tokens": 4, "temperature": 0})
    assert encode_calls == ["Once upon a time"]
    assert len(out["output_ids"]) == 4


def test_n_samples_share_one_tokenization_and_the_prefill_adds_none(engine, encode_calls) -> None:
    outs = engine.generate(
        ["Colors:", "Fruits:"], {"n": 2, "max_new_tokens": 3, "temperature": 0.8, "seed": 1}
    )
    assert [len(group) for group in outs] == [2, 2]
    assert encode_calls == ["Colors:", "Fruits:"]
    assert all(o["meta_info"]["cached_tokens"] > 0 for group in outs for o in group)


def test_streams_tokenize_once(engine, encode_calls) -> None:
    chunks = list(engine.generate("Hello", {"max_new_tokens": 3, "temperature": 0}, stream=True))
    assert encode_calls == ["Hello"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
