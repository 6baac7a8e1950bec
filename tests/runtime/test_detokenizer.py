"""Incremental detokenization: UTF-8 safe deltas, stop strings never leak (streaming or not)."""

from __future__ import annotations

import pytest

from radixlm.runtime import io
from radixlm.runtime.detokenizer import Detokenizer


@pytest.fixture(scope="module")
def tokenizer():
    from radixlm.runtime.models.default_model import default_model_path
    from radixlm.runtime.tokenizer import load_tokenizer

    return load_tokenizer(default_model_path())


def _out(rid, ids, finished=False, reason=None, first=False, stop=None):
    out = io.ReqOut(rid, ids, finished, reason, 1, 0, 0)
    if first:
        out.stop = stop or []
    return out


def _stream(detok, rid, ids, step=1, stop=None, reason=None):
    deltas = []
    for i in range(0, len(ids), step):
        last = i + step >= len(ids)
        out = _out(rid, ids[i : i + step], last, reason if last else None, i == 0, stop)
        deltas.append(detok.process(out).text_delta)
    return deltas


def test_deltas_concatenate_to_the_full_decode_and_never_split_characters(tokenizer) -> None:
    text = "Grüße 日本語 🤖 done"
    ids = tokenizer.encode(text)
    deltas = _stream(Detokenizer(tokenizer), "a", ids, reason={"type": "length"})
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_is_trimmed_and_never_streamed(tokenizer) -> None:
    ids = tokenizer.encode("The answer is 42. END of story")
    reason = {"type": "stop", "matched": "END"}
    upto = len(tokenizer.encode("The answer is 42. END"))
    deltas = _stream(Detokenizer(tokenizer), "b", ids[:upto], stop=["END"], reason=reason)
    assert "".join(deltas) == "The answer is 42. "
    assert not any("EN" in d for d in deltas)


def test_partial_stop_prefix_is_released_when_it_does_not_complete(tokenizer) -> None:
    ids = tokenizer.encode("an ENDLESS road")
    deltas = _stream(Detokenizer(tokenizer), "c", ids, stop=["END."], reason={"type": "length"})
    assert "".join(deltas) == "an ENDLESS road"


def test_no_stop_trim_keeps_the_stop_string(tokenizer) -> None:
    detok = Detokenizer(tokenizer)
    out = _out(
        "d", tokenizer.encode("a b STOP"), True, {"type": "stop", "matched": "STOP"}, True, ["STOP"]
    )
    out.no_stop_trim = True
    assert detok.process(out).text_delta == "a b STOP"
