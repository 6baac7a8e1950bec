"""The llguidance backend: an Earley parser over a lexer, driven token by token (`LLMatcher`).
Context-free grammars (ebnf / Lark), recursive JSON schemas, ECMA-262 patterns; compiles take
milliseconds, so there is no disk cache.

- `LLGuidanceCompiler` (one per scheduler process) owns the `LLTokenizer` (built once from our
  tokenizer, lazily, under a lock) and an LRU of *template* matchers in their initial state,
  keyed by (spec, whitespace pattern), each with its first mask already computed (`_warm`).
  Each request gets `template.deep_copy()`.
- `LLGuidanceGrammar` (one per request, scheduler loop thread only) wraps one `LLMatcher`.

NOTE: an `LLMatcher` never raises on user errors: it enters a sticky error state. So `accept`
tries the token first (`try_consume_tokens` leaves the state unchanged on rejection) and
`rollback` is bounded by the tokens accepted so far; `rollback` also recomputes the mask of the
state it returns to (llguidance's one-entry mask cache survives a rollback: see `rollback`).

NOTE: there is no mask cache on our side: `LLMatcher` (1.9.1) exposes no state identity (lexer
state, parser row) to key one exactly, and llguidance already reuses the last mask while
(lexer state, row) stay the same (the body of an unbounded string). Large masks inside bounded
free text (`maxLength`, `{m,n}`) are full token-trie walks (issue 23 measured slices: no gain).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from radixlm.runtime.constrained.base import Grammar, GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.cache import CompileCache
from radixlm.runtime.constrained.llguidance_specs import check_spec_llguidance, spec_to_llguidance
from radixlm.runtime.constrained.vocab import TokenVocab
from radixlm.runtime.errors import GrammarError


class LLGuidanceGrammar(Grammar):
    def __init__(
        self, matcher: Any, eos_ids: tuple[int, ...], num_accepted: int = 0, eos_free: bool = False
    ) -> None:
        self.matcher = matcher
        self.eos_ids = eos_ids
        self._num = num_accepted
        # NOTE: a stopped matcher takes EOS without recording it (its rollback would undo the
        # token before); True while such an EOS is the last accepted token.
        self._eos_free = eos_free

    # ---- Grammar --------------------------------------------------------------------------------
    def fill_mask(self, row: torch.Tensor) -> None:
        # NOTE: llguidance writes exactly ceil(n_vocab / 32) words, n_vocab = the model's vocab
        # size (the compiler builds its tokenizer so); EOS bits are set in accepting states.
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def allows(self, token_id: int) -> bool | None:
        # NOTE: the mask's own rule: EOS iff the output is complete, any other token iff the
        # lexer and parser take its bytes (`validate_tokens` runs them without a state change).
        # Where the grammar forces bytes the mask keeps only their canonical tokens, which
        # `validate_tokens` does not know: there the mask decides.
        if token_id in self.eos_ids:
            return self.matcher.is_accepting()
        if self.matcher.is_stopped():
            return False
        if self.matcher.compute_ff_bytes():
            return None
        return self.matcher.validate_tokens([token_id]) == 1

    def accept(self, token_id: int) -> bool:
        if token_id in self.eos_ids:
            # NOTE: `try_consume_tokens` refuses EOS once the matcher has stopped (nothing else
            # may follow); `consume_token` takes it whenever the output is complete.
            stopped = self.matcher.is_stopped()
            if not self.matcher.is_accepting() or not self.matcher.consume_token(token_id):
                return False
            self._eos_free = stopped
        elif self.matcher.try_consume_tokens([token_id]) != 1:
            return False
        self._num += 1
        return True

    def is_terminated(self) -> bool:
        # NOTE: stopped = only EOS may follow (or EOS was consumed); we never enter the error
        # state (see the module docstring), which also reads as stopped.
        return self.matcher.is_stopped()

    def jump_forward(self) -> str | None:
        if self.matcher.is_stopped():
            return None
        forced = self.matcher.compute_ff_bytes()
        if not forced or (forced[0] & 0xC0) == 0x80:  # starts inside a character: never jump
            return None
        # NOTE: "ignore" drops a trailing partial character (its last bytes are not forced yet).
        return forced.decode("utf-8", errors="ignore") or None

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        if n > self._num:
            raise ValueError(f"cannot roll back {n} tokens ({self._num} accepted)")
        if self._eos_free:
            self._eos_free = False
            self._num -= 1
            n -= 1
            if n == 0:
                return
        if not self.matcher.rollback(n) or self.matcher.is_error():
            raise RuntimeError(f"llguidance rollback failed: {self.matcher.get_error()[:200]}")
        self._num -= n
        # NOTE: llguidance (<= 1.9.1) keeps the last mask keyed by (lexer state, parser row
        # index) and `rollback` does not drop it: a different path that reaches the same key
        # (row indices are reused after a rollback) would get the stale mask. Computing the
        # mask of the state we rolled back to replaces that entry with a valid one (rows up
        # to the current one are unchanged by the rollback).
        self.matcher.compute_bitmask()
        if self.matcher.is_error():
            raise RuntimeError(f"llguidance mask after rollback: {self.matcher.get_error()[:200]}")

    @property
    def max_rollback(self) -> int:
        # NOTE: llguidance keeps the parser state of every consumed token: any prefix can go.
        return self._num

    @property
    def num_accepted(self) -> int:
        return self._num

    def copy(self) -> LLGuidanceGrammar:
        return LLGuidanceGrammar(self.matcher.deep_copy(), self.eos_ids, self._num, self._eos_free)


class LLGuidanceCompiler(GrammarCompiler):
    """Compiles specs to template matchers over one tokenizer (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_ids: tuple[int, ...],
        whitespace_pattern: str | None = None,
        capacity: int = 256,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.whitespace_pattern = whitespace_pattern
        self.cache: CompileCache[Any] = CompileCache(capacity)
        self.stats = self.cache.stats
        self._lltok: Any = None
        self._vocab: TokenVocab | None = None
        self._lock = threading.Lock()

    @property
    def vocab(self) -> TokenVocab:
        """Our tokenizer's bytes (jump-forward re-tokenizes with them)."""
        with self._lock:
            if self._vocab is None:
                self._vocab = TokenVocab.from_tokenizer(
                    self.tokenizer, self.vocab_size, self.eos_ids
                )
            return self._vocab

    @property
    def lltokenizer(self) -> Any:
        with self._lock:
            if self._lltok is None:
                self._lltok = make_lltokenizer(self.tokenizer, self.vocab_size, self.eos_ids)
            return self._lltok

    def key(self, spec: GrammarSpec) -> tuple:
        return (spec.kind, spec.value, self.whitespace_pattern)

    def validate(self, spec: GrammarSpec) -> None:
        check_spec_llguidance(spec, self.whitespace_pattern)

    def cached(self, spec: GrammarSpec) -> LLGuidanceGrammar | None:
        hit = self.cache.get(self.key(spec))
        return None if hit is None else LLGuidanceGrammar(hit.deep_copy(), self.eos_ids)

    def compile(self, spec: GrammarSpec) -> LLGuidanceGrammar:
        return LLGuidanceGrammar(self.compile_shared(spec).deep_copy(), self.eos_ids)

    def compile_shared(self, spec: GrammarSpec) -> Any:
        """The template matcher of `spec` (never advanced; callers deep-copy it)."""
        return self.cache.get_or_build(self.key(spec), lambda: self._build(spec))

    def _build(self, spec: GrammarSpec) -> Any:
        from llguidance import LLMatcher

        grammar = spec_to_llguidance(spec, self.whitespace_pattern)
        matcher = LLMatcher(self.lltokenizer, grammar, log_level=0)
        if matcher.is_error():
            first = (matcher.get_error().strip().splitlines() or ["invalid grammar"])[0]
            raise GrammarError(f"cannot compile {spec.describe()}: {first}", spec.kind)
        self._warm(matcher, spec)
        return matcher

    def _warm(self, matcher: Any, spec: GrammarSpec) -> None:
        """Compute the template's first mask here, in the compile worker, off the decode path.

        NOTE: llguidance builds its lexer automaton lazily (regex derivatives) and caches the
        last mask per parser state; `deep_copy` copies both. So every request's copy starts with
        the initial lexer states built and its first mask cached: on a big schema that first
        mask was the slowest of all (the first walk of the token trie derives every lexer state
        the trie reaches). A grammar whose first mask is an error (no token can start it) fails
        here, as a compile error of that request."""
        words = (self.vocab_size + 31) // 32
        scratch = torch.empty(words, dtype=torch.int32)
        matcher.unsafe_compute_mask_ptr(scratch.data_ptr(), words * 4)
        if matcher.is_error():
            first = (matcher.get_error().strip().splitlines() or ["NoExtensionBias"])[0]
            if first == "NoExtensionBias":  # llguidance's name for an empty first mask
                first = "no token of the model's vocabulary can start an output of it"
            raise GrammarError(f"cannot compile {spec.describe()}: {first}", spec.kind)


def make_lltokenizer(tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    """llguidance's tokenizer for our HF tokenizer; masks are `vocab_size` (the model's) wide."""
    import llguidance.hf

    try:
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_ids))
    except ValueError:  # not a fast tokenizer: describe the vocabulary by its bytes instead
        return _lltokenizer_from_bytes(tokenizer, vocab_size, eos_ids)


class _BytesTokenizer:
    """What `llguidance.TokenizerWrapper` reads: per-id bytes, specials, and an encoder."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        vocab = TokenVocab.from_tokenizer(tokenizer, vocab_size, ())
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        self.special_token_ids = [i for i, b in enumerate(vocab.token_bytes) if b is None]
        names = tokenizer.convert_ids_to_tokens(self.special_token_ids)
        self.tokens = list(vocab.token_bytes)
        for tid, name in zip(self.special_token_ids, names, strict=True):
            self.tokens[tid] = (name or f"<[{tid}]>").encode("utf-8")
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)


def _lltokenizer_from_bytes(tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    import llguidance

    wrapper = llguidance.TokenizerWrapper(_BytesTokenizer(tokenizer, vocab_size, eos_ids))
    return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=list(eos_ids))
