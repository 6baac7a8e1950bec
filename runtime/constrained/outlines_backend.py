"""The outlines-core backend: `CompiledGrammar` (an `Index` over our vocabulary, shared by every
request with the same spec), `OutlinesGrammar` (a `Guide` per request) and the compiler.

Threading: `OutlinesCompiler.compile` runs on compile worker threads (outlines-core releases the
GIL while it builds an Index). A `CompiledGrammar` is immutable except for its per-state memo
dicts, which only the scheduler loop thread writes (through `OutlinesGrammar`).

Jump-forward without a second automaton: every byte value has a one-byte token in a byte-level
vocabulary, so the byte-level structure of the FSM is visible in the token `Index`. A state forces
byte `b` when it is not accepting and every allowed token starts with `b`; its successor is the
state after the one-byte token of `b`. Chains of forced bytes are memoised per state.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import torch

from radixlm.runtime.constrained.base import Grammar, GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.cache import DiskCache, LRUCache
from radixlm.runtime.constrained.patterns import check_spec, spec_to_regex
from radixlm.runtime.constrained.vocab import TokenVocab
from radixlm.runtime.errors import GrammarError

MAX_JUMP_BYTES = 4096
DEFAULT_MAX_ROLLBACK = 64


class CompiledGrammar:
    def __init__(self, index: Any, vocab: TokenVocab, regex: str) -> None:
        self.index = index
        self.vocab = vocab
        self.regex = regex
        self.initial_state = index.get_initial_state()
        self._forced: dict[int, tuple[int, int] | None] = {}
        self._jump: dict[int, str | None] = {}
        self._eos_only: dict[int, bool] = {}

    def eos_only(self, state: int) -> bool:
        """An accepting state from which nothing but EOS may follow."""
        hit = self._eos_only.get(state)
        if hit is None:
            allowed = self.index.get_allowed_tokens(state) or []
            hit = self._eos_only[state] = all(t in self.vocab.eos_ids for t in allowed)
        return hit

    def forced_edge(self, state: int) -> tuple[int, int] | None:
        """(forced byte, next state) or None."""
        if state in self._forced:
            return self._forced[state]
        edge = None
        if not self.index.is_final_state(state):
            allowed = self.index.get_allowed_tokens(state) or []
            first = self.vocab.first_byte[np.asarray(allowed, dtype=np.int64)]
            first = first[first >= 0]
            if first.size and (first == first[0]).all():
                byte = int(first[0])
                token = self.vocab.byte_token.get(byte)
                nxt = None if token is None else self.index.get_next_state(state, token)
                edge = None if nxt is None else (byte, nxt)
        self._forced[state] = edge
        return edge

    def jump_string(self, state: int, guide: Any = None) -> str | None:
        """The longest forced text from `state` (whole characters only), memoised. `guide`: a
        Guide at `state`, whose bitmask gives a cheap first test."""
        if state in self._jump:
            return self._jump[state]
        if guide is not None and not self._one_first_byte(guide):
            # NOTE: ~0.3 ms against ~3 ms for `get_allowed_tokens` on a string state (49k ids
            # as a Python list); most states force nothing, and each is tested once.
            self._jump[state] = None
            return None
        out = bytearray()
        cur, seen = state, {state}
        while len(out) < MAX_JUMP_BYTES:
            edge = self.forced_edge(cur)
            if edge is None:
                break
            out.append(edge[0])
            cur = edge[1]
            if cur in seen:  # NOTE: a forced cycle never reaches an accepting state; stop
                break
            seen.add(cur)
        text = out.decode("utf-8", errors="ignore") if out else ""
        # NOTE: "ignore" drops a trailing partial character; a leading continuation byte (the
        # output ends inside a character) would be dropped too, so such states never jump.
        if out and (out[0] & 0xC0) == 0x80:
            text = ""
        result = text or None
        self._jump[state] = result
        return result

    def _one_first_byte(self, guide: Any) -> bool:
        """Whether every token the guide allows starts with the same byte."""
        n = self.vocab.vocab_size
        mask = np.empty((n + 31) // 32, dtype=np.int32)
        guide.write_mask_into(mask.ctypes.data, mask.size, 4)
        allowed = np.unpackbits(mask.view(np.uint8), bitorder="little")[:n].view(bool)
        first = self.vocab.first_byte[:n][allowed]
        first = first[first >= 0]
        return bool(first.size) and bool((first == first[0]).all())


class OutlinesGrammar(Grammar):
    def __init__(self, compiled: CompiledGrammar, max_rollback: int = DEFAULT_MAX_ROLLBACK) -> None:
        from outlines_core import Guide

        self.compiled = compiled
        self._max_rollback = max_rollback
        self.guide = Guide(compiled.index, max_rollback=max_rollback)
        self.tokens: list[int] = []  # accepted tokens (for `copy`); EOS last if accepted
        self.eos_accepted = False
        self._extra_eos = [t for t in compiled.vocab.eos_ids[1:] if t < compiled.vocab.vocab_size]

    # ---- Grammar --------------------------------------------------------------------------------
    def fill_mask(self, row: torch.Tensor) -> None:
        # NOTE: outlines-core writes all `numel` words (zeroing those past its vocabulary) and
        # sets its EOS bit exactly in accepting states.
        self.guide.write_mask_into(row.data_ptr(), row.numel(), 4)
        if self._extra_eos and self.guide.is_finished():
            for t in self._extra_eos:
                row[t >> 5] |= _bit(t & 31)

    def allows(self, token_id: int) -> bool:
        if self.eos_accepted:
            return False
        if token_id in self.compiled.vocab.eos_ids:
            return token_id < self.compiled.vocab.vocab_size and self.guide.is_finished()
        return self.compiled.index.get_next_state(self.guide.get_state(), token_id) is not None

    def accept(self, token_id: int) -> bool:
        if self.eos_accepted:
            return False
        if token_id in self.compiled.vocab.eos_ids:
            if not self.guide.is_finished():
                return False
            self.eos_accepted = True
        else:
            try:
                self.guide.advance(token_id, return_tokens=False)
            except ValueError:
                return False
        self.tokens.append(token_id)
        return True

    def is_terminated(self) -> bool:
        if self.eos_accepted:
            return True
        return self.guide.is_finished() and self.compiled.eos_only(self.guide.get_state())

    def jump_forward(self) -> str | None:
        if self.eos_accepted:
            return None
        return self.compiled.jump_string(self.guide.get_state(), self.guide)

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        if n > min(self._max_rollback, len(self.tokens)):
            raise ValueError(f"cannot roll back {n} tokens (max {self._max_rollback})")
        if self.eos_accepted:
            self.eos_accepted = False
            self.tokens.pop()
            n -= 1
        if n:
            self.guide.rollback_state(n)
            del self.tokens[-n:]

    @property
    def max_rollback(self) -> int:
        return self._max_rollback

    @property
    def num_accepted(self) -> int:
        return len(self.tokens)

    def copy(self) -> OutlinesGrammar:
        other = OutlinesGrammar(self.compiled, self._max_rollback)
        for t in self.tokens:
            other.accept(t)
        return other

    # ---- extras ---------------------------------------------------------------------------------
    @property
    def state(self) -> int:
        return self.guide.get_state()


def _bit(j: int) -> int:
    """int32 word with bit j set (bit 31 is the sign bit)."""
    return -(1 << 31) if j == 31 else 1 << j


class OutlinesCompiler(GrammarCompiler):
    """Compiles specs to `CompiledGrammar`s over one tokenizer; caches them in an LRU keyed by
    (spec, whitespace pattern, tokenizer fingerprint) and, with `cache_dir`, on disk."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_ids: tuple[int, ...],
        whitespace_pattern: str | None = None,
        cache_dir: str | None = None,
        capacity: int = 256,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.whitespace_pattern = whitespace_pattern
        self.memory: LRUCache[tuple, CompiledGrammar] = LRUCache(capacity)
        self.disk = DiskCache(cache_dir) if cache_dir else None
        self._vocab: TokenVocab | None = None
        self._lock = threading.Lock()
        self.stats = {"compiled": 0, "memory_hits": 0, "disk_hits": 0, "compile_s": 0.0}

    @property
    def vocab(self) -> TokenVocab:
        with self._lock:
            if self._vocab is None:
                self._vocab = TokenVocab.from_tokenizer(
                    self.tokenizer, self.vocab_size, self.eos_ids
                )
            return self._vocab

    def key(self, spec: GrammarSpec) -> tuple:
        return (spec.kind, spec.value, self.whitespace_pattern, self.vocab.fingerprint)

    def validate(self, spec: GrammarSpec) -> None:
        check_spec(spec, self.whitespace_pattern)

    def cached(self, spec: GrammarSpec) -> OutlinesGrammar | None:
        """A fresh grammar if `spec` is in the memory cache (no compile), else None."""
        hit = self.memory.get(self.key(spec))
        if hit is None:
            return None
        self.stats["memory_hits"] += 1
        return OutlinesGrammar(hit)

    def compile(self, spec: GrammarSpec) -> OutlinesGrammar:
        return OutlinesGrammar(self.compile_shared(spec))

    def compile_shared(self, spec: GrammarSpec) -> CompiledGrammar:
        key = self.key(spec)
        hit = self.memory.get(key)
        if hit is not None:
            self.stats["memory_hits"] += 1
            return hit
        regex = spec_to_regex(spec, self.whitespace_pattern)
        index = self.disk.load(key) if self.disk else None
        if index is not None:
            self.stats["disk_hits"] += 1
        else:
            start = time.perf_counter()
            index = self._build_index(spec, regex)
            self.stats["compiled"] += 1
            self.stats["compile_s"] += time.perf_counter() - start
            if self.disk:
                self.disk.store(key, index)
        compiled = CompiledGrammar(index, self.vocab, regex)
        self.memory.put(key, compiled)
        return compiled

    def _build_index(self, spec: GrammarSpec, regex: str) -> Any:
        from outlines_core import Index

        try:
            return Index(regex, self.vocab.outlines_vocabulary())
        except Exception as exc:  # outlines-core raises ValueError (and pyo3 panics) on bad input
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GrammarError(f"cannot compile {spec.describe()}: {message}", spec.kind) from None
