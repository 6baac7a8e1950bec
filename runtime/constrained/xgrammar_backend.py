"""The XGrammar backend: a pushdown automaton (Earley parser) whose compile step precomputes, per
automaton position, the tokens whose acceptance does not depend on the stack (the adaptive
token-mask cache): a mask is then mostly a copy, and only context-dependent tokens are checked.

- `XGrammarCompiler` (one per scheduler process) owns XGrammar's `TokenizerInfo` (built once,
  lazily, from our tokenizer's bytes: no hub access), an XGrammar `GrammarCompiler` and an LRU of
  `CompiledGrammar`s keyed by (spec, whitespace pattern). Each request gets a fresh
  `GrammarMatcher` over the shared compiled grammar.
- `XGrammarGrammar` (one per request, scheduler loop thread only) wraps one `GrammarMatcher`.

NOTE: our seam's `is_terminated` means "nothing but EOS can follow", XGrammar's means "EOS was
accepted". A complete output that may still grow (`[a-z]+`) is not terminated, so the check
computes the state's mask (`_eos_only`) and keeps it: the `fill_mask` of the same state copies it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
import torch

from radixlm.runtime.constrained.base import Grammar, GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.cache import CompileCache
from radixlm.runtime.constrained.vocab import TokenVocab
from radixlm.runtime.constrained.xgrammar_specs import check_spec_xgrammar, spec_to_xgrammar
from radixlm.runtime.errors import GrammarError


@functools.lru_cache(maxsize=16)
def _eos_words(eos_ids: tuple[int, ...]) -> dict[int, int]:
    """Mask word -> the bits of the stop tokens in it."""
    out: dict[int, int] = {}
    for eos in eos_ids:
        out[eos // 32] = out.get(eos // 32, 0) | (1 << (eos % 32))
    return out


class XGrammarGrammar(Grammar):
    def __init__(self, matcher: Any, vocab: TokenVocab, num_accepted: int = 0) -> None:
        self.matcher = matcher
        self.vocab = vocab
        self._num = num_accepted
        self._words = (vocab.vocab_size + 31) // 32
        self._memo: torch.Tensor | None = None  # the mask of the state `_memo_at` (see NOTE)
        self._memo_at = -1
        self._stop: bool | None = None  # nothing but EOS can follow (memo of this state)

    # ---- Grammar --------------------------------------------------------------------------------
    def fill_mask(self, row: torch.Tensor) -> None:
        if self._memo_at == self._num and self._memo is not None:
            row.copy_(self._memo)
            return
        self.matcher.fill_next_token_bitmask(row.view(1, -1), 0)

    def allows(self, token_id: int) -> bool:
        if token_id in self.vocab.eos_ids:
            return self.matcher.is_completed() and not self.matcher.is_terminated()
        # NOTE: try the token and undo it (XGrammar keeps every step: rollback is exact).
        if self.matcher.is_terminated() or not self.matcher.accept_token(token_id):
            return False
        self.matcher.rollback(1)
        return True

    def accept(self, token_id: int) -> bool:
        if not self.matcher.accept_token(token_id):
            return False  # NOTE: a rejected token leaves the matcher unchanged
        self._moved(self._num + 1)
        return True

    def is_terminated(self) -> bool:
        if self.matcher.is_terminated():
            return True  # EOS was accepted
        if self._stop is None:
            self._stop = self.matcher.is_completed() and self._eos_only()
        return self._stop

    def _eos_only(self) -> bool:
        """This state's mask allows stop tokens only (computed once; `fill_mask` reuses it)."""
        if self._memo is None:
            self._memo = torch.empty(self._words, dtype=torch.int32)
        self.matcher.fill_next_token_bitmask(self._memo.view(1, -1), 0)
        self._memo_at = self._num
        words = self._memo.numpy().view(np.uint32)
        eos_bits = _eos_words(self.vocab.eos_ids)
        # NOTE: stops at the first word holding a non-stop token (the common case: word 0)
        return not any(int(words[w]) & ~eos_bits.get(int(w), 0) for w in np.flatnonzero(words))

    def jump_forward(self) -> str | None:
        if self.is_terminated():
            return None
        # NOTE: XGrammar's forced string holds whole characters only, and is empty where the
        # output is complete (EOS may come next).
        return self.matcher.find_jump_forward_string() or None

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        if n > self._num:
            raise ValueError(f"cannot roll back {n} tokens ({self._num} accepted)")
        self.matcher.rollback(n)
        self._moved(self._num - n)

    def _moved(self, num: int) -> None:
        self._num = num
        self._memo_at = -1
        self._stop = None

    @property
    def max_rollback(self) -> int:
        # NOTE: XGrammar (>= 0.2) keeps every step of its Earley parser: any prefix can go.
        return self._num

    @property
    def num_accepted(self) -> int:
        return self._num

    def copy(self) -> XGrammarGrammar:
        return XGrammarGrammar(self.matcher.fork(), self.vocab, self._num)


class XGrammarCompiler(GrammarCompiler):
    """Compiles specs to shared `CompiledGrammar`s over one tokenizer (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_ids: tuple[int, ...],
        whitespace_pattern: str | None = None,
        capacity: int = 256,
        threads: int = 1,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.whitespace_pattern = whitespace_pattern
        self.threads = threads
        self.cache: CompileCache[Any] = CompileCache(capacity)
        self.stats = self.cache.stats
        self._vocab: TokenVocab | None = None
        self._xgr: Any = None
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
    def xgrammar_compiler(self) -> Any:
        """XGrammar's compiler over `TokenizerInfo` built from our token bytes (RAW vocabulary:
        special and added tokens are empty, so XGrammar never allows them; EOS ids stop)."""
        vocab = self.vocab
        with self._lock:
            if self._xgr is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo(
                    [b or b"" for b in vocab.token_bytes],
                    xgr.VocabType.RAW,
                    vocab_size=self.vocab_size,
                    stop_token_ids=list(self.eos_ids),
                )
                # NOTE: no XGrammar-side cache: ours (LRU) keys by spec, and bounds memory.
                self._xgr = xgr.GrammarCompiler(info, max_threads=self.threads, cache_enabled=False)
            return self._xgr

    def key(self, spec: GrammarSpec) -> tuple:
        return (spec.kind, spec.value, self.whitespace_pattern)

    def validate(self, spec: GrammarSpec) -> None:
        check_spec_xgrammar(spec, self.whitespace_pattern)

    def _grammar(self, compiled: Any) -> XGrammarGrammar:
        import xgrammar as xgr

        return XGrammarGrammar(xgr.GrammarMatcher(compiled), self.vocab)

    def cached(self, spec: GrammarSpec) -> XGrammarGrammar | None:
        hit = self.cache.get(self.key(spec))
        return None if hit is None else self._grammar(hit)

    def compile(self, spec: GrammarSpec) -> XGrammarGrammar:
        return self._grammar(self.compile_shared(spec))

    def compile_shared(self, spec: GrammarSpec) -> Any:
        """The `CompiledGrammar` of `spec` (immutable, shared by every request)."""
        return self.cache.get_or_build(self.key(spec), lambda: self._build(spec))

    def _build(self, spec: GrammarSpec) -> Any:
        grammar = spec_to_xgrammar(spec, self.whitespace_pattern)
        compiler = self.xgrammar_compiler
        try:
            compiled = compiler.compile_grammar(grammar)
        except RuntimeError as exc:
            raise GrammarError(f"cannot compile {spec.describe()}: {exc}", spec.kind) from None
        self._check_startable(compiled, spec)
        return compiled

    def _check_startable(self, compiled: Any, spec: GrammarSpec) -> None:
        """A grammar that no token of the vocabulary can start fails here, as a compile error
        of that request (never an empty mask in the decode loop)."""
        grammar = self._grammar(compiled)
        row = torch.zeros((self.vocab_size + 31) // 32, dtype=torch.int32)
        grammar.fill_mask(row)
        if not bool(row.any()):
            raise GrammarError(
                f"cannot compile {spec.describe()}: no token of the model's vocabulary can "
                "start an output of it",
                spec.kind,
            )
