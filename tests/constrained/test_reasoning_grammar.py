"""Reasoning-aware constraints (constrained/reasoning.py) on a tokenizer whose `<think>` and
`</think>` are special tokens (as on reasoning models), both grammar backends: the `<think>`
section is free (every token allowed, the inner grammar untouched), the constraint applies after
`</think>`; qwen3 outputs that do not open `<think>` are constrained from the first token;
rollback across the marker restores the free section."""

from __future__ import annotations

import re

import pytest
import torch
from compat.tokenizers import special_tokenizer
from constrained.helpers import BACKENDS, EOS

REGEX = r"[0-9]{3}"


@pytest.fixture(scope="module", params=BACKENDS)
def compiler(request):
    tok = special_tokenizer()
    if request.param == "llguidance":
        from radixlm.runtime.constrained.llguidance_backend import LLGuidanceCompiler

        return LLGuidanceCompiler(tok, len(tok), (EOS,), None)
    if request.param == "xgrammar":
        from radixlm.runtime.constrained.xgrammar_backend import XGrammarCompiler

        return XGrammarCompiler(tok, len(tok), (EOS,), None)
    from radixlm.runtime.constrained.outlines_backend import OutlinesCompiler

    return OutlinesCompiler(tok, len(tok), (EOS,), None, None)


def _ids(text: str) -> list[int]:
    return special_tokenizer().encode(text, add_special_tokens=False)


def _allowed(grammar, vocab: int) -> set[int]:
    from radixlm.kernels.token_bitmask import unpack_bitmask

    row = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
    grammar.fill_mask(row)
    return set(torch.nonzero(unpack_bitmask(row.view(1, -1), vocab)[0]).flatten().tolist())


def _wrap(compiler, inside: bool):
    from radixlm.runtime.constrained import GrammarSpec
    from radixlm.runtime.constrained.reasoning import ReasoningGrammar

    (start,), (end,) = _ids("<think>"), _ids("</think>")
    inner = compiler.compile(GrammarSpec("regex", REGEX))
    return ReasoningGrammar(inner, (end,), None if inside else (start,)), inner.copy()


def test_free_before_marker_constrained_after(compiler) -> None:
    """deepseek-r1: the output starts inside the reasoning."""
    vocab = len(special_tokenizer())
    grammar, fresh = _wrap(compiler, inside=True)
    digits = _allowed(fresh, vocab)
    assert digits and all(re.fullmatch(r"[0-9]+", special_tokenizer().decode([t])) for t in digits)
    reasoning = [*_ids("Let me think: no digits here!"), EOS - 1]
    for token in reasoning:
        assert _allowed(grammar, vocab) == set(range(vocab))  # free: every token
        assert grammar.jump_forward() is None and not grammar.is_terminated()
        assert grammar.accept(token)
    assert grammar.accept(_ids("</think>")[0])
    assert _allowed(grammar, vocab) == digits  # constrained from here, the inner state untouched
    assert not grammar.accept(_ids("x")[0])
    answer = _ids("1")  # one digit per token in this vocabulary
    assert grammar.accept(answer[0]) and grammar.num_accepted == len(reasoning) + 2
    # Rollback across the marker: free again; the same marker constrains again from scratch.
    grammar.rollback(3)
    assert grammar.num_accepted == len(reasoning) - 1
    assert _allowed(grammar, vocab) == set(range(vocab)) and grammar.max_rollback == 0
    assert grammar.accept(reasoning[-1]) and grammar.accept(_ids("</think>")[0])
    assert _allowed(grammar, vocab) == digits
    for token in _ids("123"):
        assert grammar.accept(token)
    assert grammar.is_terminated() and _allowed(grammar, vocab) == {EOS}
    twin = grammar.copy()
    grammar.rollback(3)
    assert _allowed(grammar, vocab) == digits and twin.is_terminated()


def test_qwen3_opening_or_answer_from_the_start(compiler) -> None:
    """qwen3: `<think>` first opens a free section; any other first token starts the answer."""
    vocab = len(special_tokenizer())
    (start,), (end,) = _ids("<think>"), _ids("</think>")
    grammar, fresh = _wrap(compiler, inside=False)
    digits = _allowed(fresh, vocab)
    assert _allowed(grammar, vocab) == digits | {start}
    assert not grammar.accept(_ids("x")[0])  # no <think>: constrained from the first token
    assert grammar.accept(_ids("4")[0])
    assert _allowed(grammar, vocab) == _allowed(_advanced(fresh, "4"), vocab)
    grammar.rollback(1)  # back before the first token: the opening is possible again
    assert _allowed(grammar, vocab) == digits | {start}
    assert grammar.accept(start)
    assert _allowed(grammar, vocab) == set(range(vocab))
    for token in [*_ids("x y z"), end]:
        assert grammar.accept(token)
    assert _allowed(grammar, vocab) == digits
    for token in _ids("007"):
        assert grammar.accept(token)
    assert grammar.is_terminated()


def _advanced(grammar, text: str):
    g = grammar.copy()
    for token in _ids(text):
        assert g.accept(token)
    return g


def test_multi_token_markers_without_vocabulary() -> None:
    """Without a vocabulary (no compiler bytes) a marker of several tokens is matched on its ids:
    only the whole id sequence ends the reasoning, and an opening started must be completed."""
    from constrained.helpers import make_compiler, tokenizer

    from radixlm.runtime.constrained import GrammarSpec
    from radixlm.runtime.constrained.reasoning import ReasoningGrammar

    tok = tokenizer()
    start = tuple(tok.encode("<think>", add_special_tokens=False))
    end = tuple(tok.encode("</think>", add_special_tokens=False))
    assert len(start) > 1 and len(end) > 1
    inner = make_compiler().compile(GrammarSpec("regex", REGEX))
    grammar = ReasoningGrammar(inner, end, start)
    assert grammar.accept(start[0])
    assert _allowed(grammar, 49152) == {start[1]}
    assert not grammar.accept(_ids("1")[0])
    for token in start[1:] + end[:-1]:
        assert grammar.accept(token)
    assert len(_allowed(grammar, 49152)) == 49152  # still free: the marker is incomplete
    assert grammar.accept(end[-1]) and not grammar.accept(start[0])


def _plain(*pieces: str) -> list[int]:
    """One token per piece on the default vocabulary."""
    from constrained.helpers import tokenizer

    out = []
    for piece in pieces:
        ids = tokenizer().encode(piece, add_special_tokens=False)
        assert len(ids) == 1, (piece, ids)
        out += ids
    return out


@pytest.fixture(scope="module", params=BACKENDS)
def plain_compiler(request):
    from constrained.helpers import make_compiler

    return make_compiler(backend=request.param)


def _text_grammar(compiler, regex: str, qwen3: bool):
    from constrained.helpers import tokenizer

    from radixlm.runtime.constrained import GrammarSpec
    from radixlm.runtime.constrained.reasoning import wrap_for_reasoning
    from radixlm.runtime.server.reasoning_parsers import REASONING_PARSERS

    params = REASONING_PARSERS["qwen3" if qwen3 else "deepseek-r1"].grammar_params(tokenizer())
    sp = type("SP", (), params)()
    inner = compiler.compile(GrammarSpec("regex", regex))
    return wrap_for_reasoning(inner.copy(), sp, compiler.vocab), inner


def test_text_marker_any_spelling(plain_compiler) -> None:
    """The default vocabulary spells `</think>` with ordinary tokens: the marker is found on the
    output's text however it is split, and a token that would run past it (`>.`) is never
    offered, so the answer starts on a token boundary and the inner grammar sees all of it."""
    from constrained.helpers import VOCAB

    grammar, fresh = _text_grammar(plain_compiler, REGEX, qwen3=False)
    digits = _allowed(fresh, VOCAB)
    past = set(_plain(">.", ">>", "><", ">,"))
    for token in [*_ids("hmm"), *_plain("></", "th", "ink")]:  # not the usual `</` `think` `>`
        assert grammar.accept(token) and grammar.jump_forward() is None
    free = _allowed(grammar, VOCAB)
    assert past.isdisjoint(free) and len(free) > VOCAB - 1000 and _plain(">")[0] in free
    assert not grammar.accept(_plain(">.")[0])  # would hide the answer's first character
    assert grammar.accept(_plain(">")[0])
    assert _allowed(grammar, VOCAB) == digits
    assert not grammar.accept(_plain("x")[0])
    for token in _ids("123"):
        assert grammar.accept(token)
    assert grammar.is_terminated() and grammar.num_accepted == 2 + 3 + 1 + 3


def test_text_opening_or_other_answer(plain_compiler) -> None:
    """qwen3 on the default vocabulary: `<think>` is `<` `think` `>`. An answer that also starts
    with `<` (`<tool>7`) stays constrained: both the opening and the inner grammar follow the
    output until it leaves one of them."""
    from constrained.helpers import VOCAB

    regex = r"<tool>[0-9]"
    grammar, fresh = _text_grammar(plain_compiler, regex, qwen3=True)
    lt, think, tool, gt = _plain("<", "think", "tool", ">")
    assert {lt} <= _allowed(grammar, VOCAB) and _plain("x")[0] not in _allowed(grammar, VOCAB)
    assert grammar.accept(lt)
    both = _allowed(grammar, VOCAB)
    assert {think, tool} <= both and _plain("x")[0] not in both
    assert grammar.accept(tool)  # left the opening: the answer, constrained from its start
    assert _allowed(grammar, VOCAB) == _allowed(_advanced_ids(fresh, [lt, tool]), VOCAB)
    grammar.rollback(1)  # back into the opening
    assert _allowed(grammar, VOCAB) == both
    for token in (think, gt):
        assert grammar.accept(token)
    assert len(_allowed(grammar, VOCAB)) > VOCAB - 1000  # reasoning: free
    for token in _plain("</", "think", ">"):
        assert grammar.accept(token)
    assert _allowed(grammar, VOCAB) == _allowed(fresh, VOCAB)
    for token in [lt, tool, gt, *_ids("7")]:
        assert grammar.accept(token)
    assert grammar.is_terminated()


def _advanced_ids(grammar, ids: list[int]):
    g = grammar.copy()
    for token in ids:
        assert g.accept(token)
    return g


@pytest.mark.parametrize("seed", range(8))
def test_rollback_equals_replay(plain_compiler, seed: int) -> None:
    """Random walks over the masks (tokens drawn from marker pieces, digits and words, the
    grammar's own mask deciding what may follow), with rollbacks of any depth, also across
    the markers: after each, the state equals a fresh grammar fed the same tokens."""
    import random

    from constrained.helpers import VOCAB

    rng = random.Random(seed)
    pool = _plain("<", "think", ">", "</", "th", "ink", ">.", "1", "2", " x", "tool")
    spellings = [
        _plain("</", "think", ">"),
        _plain("</", "th", "ink", ">"),
        _plain("<", "think", ">"),
    ]
    grammar, _ = _text_grammar(plain_compiler, r"[0-9]{2,4}", qwen3=seed % 2 == 0)
    history: list[int] = []
    phases = set()
    for _ in range(60):
        burst = [rng.choice(pool)] if rng.random() < 0.8 else rng.choice(spellings)
        for token in burst:
            if grammar.is_terminated() or token not in _allowed(grammar, VOCAB):
                break
            assert grammar.accept(token)
            history.append(token)
            phases.add(grammar.phase)
        if history and rng.random() < 0.3:
            n = rng.randint(1, len(history))
            grammar.rollback(n)
            del history[len(history) - n :]
            twin, _ = _text_grammar(plain_compiler, r"[0-9]{2,4}", qwen3=seed % 2 == 0)
            for t in history:
                assert twin.accept(t)
            assert grammar.num_accepted == twin.num_accepted == len(history)
            assert _allowed(grammar, VOCAB) == _allowed(twin, VOCAB)
            assert grammar.is_terminated() == twin.is_terminated()
    assert "answer" in phases and "thinking" in phases


def test_sampling_params_validate_markers() -> None:
    from radixlm.runtime.errors import InvalidRequestError
    from radixlm.runtime.sampling.sampling_params import SamplingParams

    sp = SamplingParams.from_dict({"regex": "a", "think_end_ids": [5], "think_start_ids": [4]}, 10)
    assert sp.think_end_ids == [5]
    for bad in ({"think_end_ids": []}, {"think_end_ids": [99]}, {"think_start_ids": [1]}):
        with pytest.raises(InvalidRequestError) as err:
            SamplingParams.from_dict(bad, 10)
        assert err.value.field in ("think_end_ids", "think_start_ids")


def test_parser_grammar_params() -> None:
    """The chat endpoint's ids: both markers for qwen3, the end marker for deepseek-r1, on a
    vocabulary with think tokens and on the default one (several ordinary tokens each)."""
    from constrained.helpers import tokenizer

    from radixlm.runtime.server.reasoning_parsers import REASONING_PARSERS

    special = special_tokenizer()
    (start,), (end,) = _ids("<think>"), _ids("</think>")
    assert REASONING_PARSERS["qwen3"].grammar_params(special) == {
        "think_end_ids": [end],
        "think_start_ids": [start],
    }
    assert REASONING_PARSERS["deepseek-r1"].grammar_params(special) == {"think_end_ids": [end]}
    plain = tokenizer()
    ends = plain.encode("</think>", add_special_tokens=False)
    starts = plain.encode("<think>", add_special_tokens=False)
    assert REASONING_PARSERS["qwen3"].grammar_params(plain) == {
        "think_end_ids": ends,
        "think_start_ids": starts,
    }
    assert REASONING_PARSERS["deepseek-r1"].grammar_params(plain) == {"think_end_ids": ends}


def test_jump_forward_never_retokenizes_the_marker() -> None:
    """After `</think>` (3 tokens on the default vocabulary), the forced `{"answer": ` is jumped
    over without touching the reasoning or the marker ids (`>{"` could merge otherwise)."""
    from constrained.helpers import make_compiler, tokenizer

    from radixlm.runtime.constrained import GrammarSpec
    from radixlm.runtime.constrained.jump_forward import apply_jump, plan_jump
    from radixlm.runtime.constrained.reasoning import ReasoningGrammar

    tok, compiler = tokenizer(), make_compiler()
    end = tuple(tok.encode("</think>", add_special_tokens=False))
    grammar = ReasoningGrammar(
        compiler.compile(GrammarSpec("regex", r'\{"answer": [0-9]\}')), end, None
    )
    out = tok.encode("hmm, ok", add_special_tokens=False)
    for token in out:
        assert grammar.accept(token)
    assert plan_jump(grammar, out, compiler.vocab, tok, 0, 100) is None  # free: no jump
    out += list(end)
    for token in end:
        assert grammar.accept(token)
    plan = plan_jump(grammar, out, compiler.vocab, tok, 0, 100)
    assert plan is not None and plan.keep == len(out) and apply_jump(grammar, out, plan)
    new = out[: plan.keep] + plan.tail
    assert tok.decode(new) == 'hmm, ok</think>{"answer": ' and grammar.num_accepted == len(new)
    assert grammar.max_rollback <= len(plan.tail)
