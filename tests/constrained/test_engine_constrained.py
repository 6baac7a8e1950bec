"""Constrained decoding end to end on the default model: the corpus (16 regexes / choices and 21
JSON schemas) decoded in one batch next to unconstrained requests, with jump-forward on and off,
on the default grammar backend (llguidance) and on `grammar_backend="outlines"`; rejections of
bad patterns (each backend's messages) while other requests run; length limits; streaming;
logprobs; n > 1. KV accounting is checked after every test by the shared conftest."""

from __future__ import annotations

import itertools
import json
import threading

import pytest
from constrained.corpus import CASES, MAX_NEW_TOKENS, chat, check

FREE_PROMPTS = ["The capital of France is", "def fibonacci(n):", chat("Tell me a joke.")]


def run_corpus(engine):
    prompts = [c.prompt for c in CASES] + FREE_PROMPTS
    params = [c.params() for c in CASES] + [
        {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True} for _ in FREE_PROMPTS
    ]
    before = engine.get_server_info()["jump_forward"]
    outs = engine.generate(prompts, params)
    jumps = engine.get_server_info()["jump_forward"] - before
    for case, out in zip(CASES, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (case.name, out)
        check(case, out["text"])
    for out in outs[len(CASES) :]:
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 24}
    return outs, jumps


@pytest.fixture(scope="module")
def corpus_on(engine):
    return run_corpus(engine)


def test_corpus_valid_with_jump_forward(corpus_on):
    _outs, jumps = corpus_on
    assert jumps > 0  # the JSON cases force strings like `name"`


def test_corpus_valid_without_jump_forward(tmp_path_factory):
    from tests_helpers import get_engine, release_engine

    config = {
        "disable_jump_forward": True,
        "grammar_cache_dir": str(tmp_path_factory.getbasetemp() / "grammar-cache"),
    }
    try:
        _outs, jumps = run_corpus(get_engine(**config))
    finally:
        release_engine(**config)
    assert jumps == 0
    # NOTE: outputs may differ: a jump re-tokenizes, and greedy decoding continues from other
    # token boundaries. Validity must not (run_corpus checked every output).


def test_outlines_corpus_valid_with_jump_forward(outlines_engine):
    _outs, jumps = run_corpus(outlines_engine)
    assert jumps > 0


def test_xgrammar_corpus_valid_with_jump_forward(xgrammar_engine):
    _outs, jumps = run_corpus(xgrammar_engine)
    assert jumps > 0


# The outlines backend's messages (Python `re` dialect, its JSON-schema subset).
BAD_OUTLINES = [
    ({"regex": "(abc"}, "invalid regex"),
    ({"regex": "a(?=b)"}, "look-around"),
    ({"regex": r"(a)\1"}, "unsupported regex feature"),
    ({"regex": "a{3,1}"}, "invalid regex"),
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"json_schema": json.dumps({"type": "strin"})}, "invalid JSON schema"),
    ({"json_schema": json.dumps({"type": "integer", "multipleOf": 3})}, "multipleOf"),
    ({"json_schema": json.dumps({"type": "array", "uniqueItems": True})}, "uniqueItems"),
    ({"json_schema": json.dumps({"type": "string", "format": "hostname"})}, "format 'hostname'"),
    ({"json_schema": json.dumps({"$ref": "https://example.com/s.json"})}, "remote $ref"),
    ({"json_schema": json.dumps({"not": {"type": "null"}})}, "'not'"),
    ({"json_schema": json.dumps({"type": "number", "minimum": 0.5})}, "minimum 0.5"),
    ({"choices": ["a", ""]}, "choices"),
    ({"ebnf": "root ::= 'a'"}, "ebnf"),
    ({"regex": "a", "choices": ["a"]}, "only one of"),
]
# The default llguidance backend's messages (regexes read as Python `re` patterns, as on outlines;
# llguidance's JSON schema).
BAD_LLGUIDANCE = [
    ({"regex": "(abc"}, "invalid regex '(abc': missing ), unterminated subpattern"),
    ({"regex": "a(?=b)"}, "look-around"),
    ({"regex": r"(a)\1"}, "back-references"),
    ({"regex": "a{3,1}"}, "invalid regex"),
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"json_schema": json.dumps({"type": "strin"})}, "Invalid type: strin"),
    ({"json_schema": json.dumps({"type": "array", "uniqueItems": True})}, "'uniqueItems' at /uniqueItems"),
    ({"json_schema": json.dumps({"$ref": "https://example.com/s.json"})}, "https://example.com/s.json"),
    ({"json_schema": json.dumps({"not": {"type": "null"}})}, "'not' at /not"),
    ({"choices": ["a", ""]}, "choices"),
    ({"ebnf": "root ::= missing"}, "invalid ebnf grammar"),
    ({"regex": "a", "choices": ["a"]}, "only one of"),
]  # fmt: skip
# The xgrammar backend's messages: what XGrammar would ignore is refused by keyword and pointer.
BAD_XGRAMMAR = [
    ({"regex": "(abc"}, "invalid regex '(abc': missing ), unterminated subpattern"),
    ({"regex": "a(?=b)"}, "look-around"),
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"json_schema": json.dumps({"type": "strin"})}, 'Unsupported type "strin"'),
    ({"json_schema": json.dumps({"type": "array", "uniqueItems": True})}, "'uniqueItems' at /uniqueItems"),
    ({"json_schema": json.dumps({"$ref": "https://example.com/s.json"})}, "'$ref' at /$ref (remote 'https://example.com/s.json'"),
    ({"json_schema": json.dumps({"not": {"type": "null"}})}, "'not' at /not"),
    ({"json_schema": json.dumps({"oneOf": [{"type": "integer"}, {"type": "number"}]})}, "'oneOf' at /oneOf"),
    ({"json_schema": json.dumps({"allOf": [{"type": "integer"}, {"minimum": 3}]})}, "'allOf' at /allOf"),
    ({"json_schema": json.dumps({"type": "string", "format": "hostname"})}, "'format' at /format (format 'hostname'"),
    ({"json_schema": json.dumps({"type": "string", "pattern": "a", "maxLength": 3})}, "'maxLength' with 'pattern' at /"),
    ({"json_schema": json.dumps({"type": "integer", "minimum": 5, "const": 1})}, "no value of 'const' at /const"),
    ({"choices": ["a", ""]}, "choices"),
    ({"ebnf": "root ::= missing"}, "invalid ebnf"),
    ({"regex": "a", "choices": ["a"]}, "only one of"),
]  # fmt: skip


@pytest.mark.parametrize("backend", ["llguidance", "outlines", "xgrammar"])
def test_bad_patterns_rejected_others_unaffected(request, backend):
    from radixlm.runtime.errors import GrammarError, InvalidRequestError

    fixture = {"llguidance": "engine", "outlines": "outlines_engine"}
    engine = request.getfixturevalue(fixture.get(backend, "xgrammar_engine"))
    bad = {"llguidance": BAD_LLGUIDANCE, "outlines": BAD_OUTLINES}.get(backend, BAD_XGRAMMAR)
    good = [c for c in CASES if c.name in ("person", "ipv4", "choices_plain")]
    results: list = []
    worker = threading.Thread(
        target=lambda: results.append(
            engine.generate([c.prompt for c in good], [c.params() for c in good])
        )
    )
    worker.start()
    for params, needle in bad:
        with pytest.raises(InvalidRequestError) as info:
            engine.generate(chat("hi"), {"max_new_tokens": 8, **params})
        assert needle in str(info.value), (params, str(info.value))
        if ("regex" in params and "choices" not in params) or "json_schema" in params:
            assert isinstance(info.value, GrammarError), params
    worker.join(timeout=300)
    for case, out in zip(good, results[0]):
        check(case, out["text"])


def test_scheduler_side_compile_error(engine):
    """A regex that passes the cheap checks but that no token sequence can produce (byte 0x04
    has no token) fails in the scheduler's compile worker: that request only."""
    from radixlm.runtime.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="cannot compile"):
        engine.generate(chat("hi"), {"max_new_tokens": 8, "regex": "\x04"})
    out = engine.generate(chat("hi"), {"max_new_tokens": 4, "regex": "[a-z]{4}"})
    assert len(out["text"]) == 4


def test_max_new_tokens_inside_constraint_reports_length(engine):
    out = engine.generate(
        chat("Spell the alphabet."), {"max_new_tokens": 5, "temperature": 0, "regex": "[a-z ]{200}"}
    )
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert out["meta_info"]["completion_tokens"] == 5
    import re

    assert re.fullmatch("[a-z ]*", out["text"])


def test_streaming_is_consistent(engine):
    case = next(c for c in CASES if c.name == "person")
    chunks = list(engine.generate(case.prompt, case.params(), stream=True))
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    final = chunks[-1]
    check(case, final["text"])
    tok = engine.tokenizer
    assert tok.decode(final["output_ids"]) == final["text"]


def test_logprobs_with_constraint(engine):
    case = next(c for c in CASES if c.name == "person")
    out = engine.generate(case.prompt, case.params(), return_logprob=True)
    check(case, out["text"])
    lps = out["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == out["output_ids"]
    assert all(lp is not None and lp <= 0 for lp, _, _ in lps)


def test_sampling_n_and_min_tokens(engine):
    case = next(c for c in CASES if c.name == "choices_plain")
    outs = engine.generate(case.prompt, case.params(temperature=1.0, n=4, seed=7, min_new_tokens=3))
    for out in outs:
        check(case, out["text"])
        assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_stop_strings_and_ignore_eos_with_constraint(engine):
    out = engine.generate(
        chat("Count."),
        {
            "max_new_tokens": MAX_NEW_TOKENS,
            "temperature": 0,
            "regex": "[0-9]{1,3}(,[0-9]{1,3}){0,5}",
            "stop": [","],
        },
    )
    assert "," not in out["text"]
    out = engine.generate(
        chat("Yes?"),
        {"max_new_tokens": 16, "temperature": 0, "choices": ["yes", "no"], "ignore_eos": True},
    )
    assert out["text"] in ("yes", "no") and out["meta_info"]["finish_reason"]["type"] == "stop"
