"""Incremental detokenization: UTF-8 safe deltas, stop strings never leak (streaming or not)."""

from __future__ import annotations

import pytest

from radixlm.runtime.frontend.detokenizer import Detokenizer
from radixlm.runtime.processes import io
from radixlm.runtime.sampling.stop_match import StopChecker, max_stop_bytes


@pytest.fixture(scope="module")
def tokenizer():
    from radixlm.runtime.frontend.tokenizer import load_tokenizer
    from radixlm.runtime.models.default_model import default_model_path

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


def _first_stop(checker, ids, stops, min_new_tokens=0, skip_special=True):
    """The scheduler's loop: check after every appended token; (token count, stop) or None."""
    nbytes = max_stop_bytes(stops)
    for n in range(1, len(ids) + 1):
        if n >= min_new_tokens:
            stop = checker.match(ids[:n], stops, nbytes, skip_special, True)
            if stop is not None:
                return n, stop
    return None


@pytest.mark.parametrize("text, stop", [("我喜欢吃爆米花", "爆"), ("great 😄 day", "😄"),
                                        ("日本語のテキスト", "のテ")])  # fmt: skip
def test_stop_strings_of_multi_token_characters_match(tokenizer, text, stop) -> None:
    ids = tokenizer.encode(text)
    found = _first_stop(StopChecker(tokenizer), ids, [stop])
    assert found is not None and found[1] == stop
    # It fires at the token that completes the stop string, not later.
    assert stop in tokenizer.decode(ids[: found[0]]) and stop not in tokenizer.decode(
        ids[: found[0] - 1]
    )
    out = _out("mt", ids[: found[0]], True, {"type": "stop", "matched": stop}, True, [stop])
    assert Detokenizer(tokenizer).process(out).text_delta == text[: text.index(stop)]


def test_stop_after_min_new_tokens_keeps_the_text_before_it(tokenizer) -> None:
    """An occurrence before min_new_tokens never counts; the detokenizer trims at the one that
    did, streamed or not (it used to search from the start: ' Paris')."""
    ids = tokenizer.encode(" Paris. It is big. Yes")
    n, stop = _first_stop(StopChecker(tokenizer), ids, ["."], min_new_tokens=4)
    assert tokenizer.decode(ids[:n]) == " Paris. It is big."
    reason = {"type": "stop", "matched": stop}
    whole = _out("m1", ids[:n], True, reason, True, ["."])
    assert Detokenizer(tokenizer).process(whole).text_delta == " Paris. It is big"
    deltas = _stream(Detokenizer(tokenizer), "m2", ids[:n], stop=["."], reason=reason)
    assert "".join(deltas) == " Paris. It is big"


def test_stop_check_sees_the_text_without_special_tokens(tokenizer) -> None:
    """`<|im_end|>` between "." and "\\n" is not in the output text: the stop "53.\\n" matches."""
    ids = [*tokenizer.encode("It is 53."), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ids += tokenizer.encode("\nMore")
    checker = StopChecker(tokenizer)
    n, _ = _first_stop(checker, ids, ["53.\n"])
    assert tokenizer.decode(ids[:n], skip_special_tokens=True) == "It is 53.\n"
    # Shown with its special tokens, the text has no "53.\n": no match.
    assert _first_stop(checker, ids, ["53.\n"], skip_special=False) is None


def test_a_stop_spelling_a_special_token_still_matches(tokenizer) -> None:
    """The chat template's stop `<|im_end|>` is not in the visible text; it still stops."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer.encode("Fine."), end, *tokenizer.encode("\nMore")]
    n, stop = _first_stop(StopChecker(tokenizer), ids, ["<|im_end|>"])
    assert (n, stop) == (len(tokenizer.encode("Fine.")) + 1, "<|im_end|>")
    out = _out("sp", ids[:n], True, {"type": "stop", "matched": stop}, True, [stop])
    assert Detokenizer(tokenizer).process(out).text_delta == "Fine."
