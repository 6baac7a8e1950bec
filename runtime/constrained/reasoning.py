"""`ReasoningGrammar`: a reasoning-aware wrapper around any backend's `Grammar` (SGLang's
reasoner grammar). The `<think>` section of a reasoning model's output is left free; the inner
grammar constrains only the tokens after the end-of-reasoning marker.

Carried in sampling params (set by the chat endpoint when `--reasoning-parser` separates the
reasoning, or by a native request itself):
    think_end_ids    the marker's token ids (`</think>`);
    think_start_ids  None: the output starts inside the reasoning (deepseek-r1, the template opened
                     `<think>`); else the opening marker's ids (qwen3): the output is free only if
                     it opens with the opening, and an output that starts otherwise is constrained
                     from its first token.

How a marker is recognised (`_Marker`):
- text: every id of the marker is an ordinary token (the default SmolLM2 vocabulary spells
  `</think>` as `</` `think` `>`): the marker is its bytes, found as a suffix of the output's bytes
  however the model spells it (`</` `th` `ink>`, `.</` `think` `>`, ...). A token that would
  complete the marker and run past it (`>\n` after `</think`) is masked out while reasoning: the
  answer must start on a token boundary, so the inner grammar sees exactly the answer's tokens.
- ids: the marker holds a special token (`</think>` on reasoning models): matched as that id
  sequence (a special token has one spelling), nothing masked.

States: OPENING (qwen3, until the output's text either completes the opening or leaves it:
offered are the inner grammar's tokens, while it still accepts the output, and the tokens that
continue the opening; the opening wins when both complete), THINKING (free: the inner grammar sees
nothing: no mask, no advance, no jump-forward), ANSWER (the inner grammar owns mask, accept,
termination and jump-forward).

Owned like every `Grammar`: one per request, scheduler loop thread only (`manager.py` wraps).
The precomputed masks of a marker are shared through a cache keyed by vocabulary fingerprint.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from radixlm.runtime.constrained.base import Grammar

if TYPE_CHECKING:  # NOTE: torch only where a mask is built (the tokenizer manager needs none)
    import torch

    from radixlm.runtime.constrained.vocab import TokenVocab

OPENING, THINKING, ANSWER = "opening", "thinking", "answer"

Units = bytes | tuple[int, ...]  # text markers: bytes; id markers: token ids


def _find(seq: Units, pat: Units) -> int:
    if isinstance(seq, bytes):
        return seq.find(pat)  # type: ignore[arg-type]
    for i in range(len(seq) - len(pat) + 1):
        if seq[i : i + len(pat)] == pat:
            return i
    return -1


def _partial(tail: Units, pat: Units) -> int:
    """Length of the longest proper prefix of `pat` that ends `tail`."""
    for k in range(min(len(pat) - 1, len(tail)), 0, -1):
        if tail[len(tail) - k :] == pat[:k]:
            return k
    return 0


def _straddles(before: Units, piece: Units, pat: Units) -> bool:
    """`pat` completes inside `piece` (appended to `before`) and text follows it."""
    s = before + piece  # type: ignore[operator]
    i = _find(s, pat)
    return i >= 0 and i + len(pat) < len(s)


class _Marker:
    """One marker (`<think>` or `</think>`) over one vocabulary: its units, each token's units,
    and the precomputed mask rows (built on first use, shared by every request)."""

    def __init__(self, ids: tuple[int, ...], vocab: TokenVocab | None) -> None:
        table = vocab.token_bytes if vocab is not None else None
        self.text = table is not None and all(0 <= t < len(table) and table[t] for t in ids)
        self.table = table if self.text else None
        self.ids = ids
        self.seq: Units = b"".join(table[t] for t in ids) if self.text else ids  # type: ignore[misc]
        self.empty: Units = b"" if self.text else ()
        self.key = (vocab.fingerprint if self.text else "", self.seq)  # type: ignore[union-attr]

    def units(self, token: int) -> Units | None:
        """The token's units; None for a special token in a text marker (breaks any match)."""
        if self.table is None:
            return (token,)
        return self.table[token] if 0 <= token < len(self.table) else None

    def free_row(self, k: int, words: int) -> torch.Tensor | None:
        """THINKING with `k` units of the marker pending: every token but those that would run
        past the marker (None: nothing to mask)."""
        if not self.text:
            return None
        return _rows(self, "free", words)[k]

    def opening_row(self, k: int, words: int) -> torch.Tensor:
        """OPENING with `k` units emitted: the tokens that continue the opening."""
        return _rows(self, "open", words)[k]


_ROWS: dict[tuple[Any, ...], list[torch.Tensor]] = {}
_ROWS_LOCK = threading.Lock()


def _rows(marker: _Marker, kind: str, words: int) -> list[torch.Tensor]:
    key = (kind, words, marker.key, marker.ids if not marker.text else ())
    with _ROWS_LOCK:
        rows = _ROWS.get(key)
        if rows is None:
            rows = _ROWS[key] = _build_rows(marker, kind, words)
        return rows


def _build_rows(marker: _Marker, kind: str, words: int) -> list[torch.Tensor]:
    import torch

    pat, m = marker.seq, len(marker.seq)
    bits: list[list[int]] = [[] for _ in range(m)]
    if not marker.text:
        for k in range(m):
            bits[k].append(pat[k])  # type: ignore[arg-type]
    else:
        assert isinstance(pat, bytes) and marker.table is not None
        last = pat[-1:]
        for tid, tb in enumerate(marker.table):
            if not tb:
                continue
            for k in range(m):
                rest = pat[k:]
                if kind == "free":
                    if last in tb and _straddles(pat[:k], tb, pat):
                        bits[k].append(tid)
                elif rest.startswith(tb) or tb.startswith(rest):
                    bits[k].append(tid)
    rows = []
    for k in range(m):
        flat = torch.zeros(words * 32, dtype=torch.bool)
        flat[[t for t in bits[k] if t < words * 32]] = True
        if kind == "free":
            flat = ~flat
        packed = (flat.view(words, 32).to(torch.int64) << torch.arange(32)).sum(1)
        rows.append(packed.to(torch.int64).sub_((packed >= 2**31) * 2**32).to(torch.int32))
    return rows


class ReasoningGrammar(Grammar):
    def __init__(
        self,
        inner: Grammar,
        end_ids: tuple[int, ...],
        start_ids: tuple[int, ...] | None,
        vocab: TokenVocab | None = None,
    ) -> None:
        assert end_ids and (start_ids is None or start_ids)
        self.fresh = inner  # NOTE: never advanced: the inner grammar's start state, for rebuilds
        self.end = _Marker(end_ids, vocab)
        self.start = _Marker(start_ids, vocab) if start_ids else None
        self._reset()

    def _reset(self) -> None:
        self.inner = self.fresh.copy()
        self.history: list[int] = []  # every accepted token (== the request's output_ids)
        self.phase = OPENING if self.start is not None else THINKING
        self.opened: Units = self.start.empty if self.start is not None else b""
        self.inner_alive = True  # OPENING: the inner grammar has consumed the same tokens
        self.tail: Units = self.end.empty  # THINKING: the reasoning's last len(marker) - 1 units
        self.answer_from = 0  # len(history) when ANSWER began

    @property
    def end_ids(self) -> tuple[int, ...]:
        return self.end.ids

    @property
    def start_ids(self) -> tuple[int, ...] | None:
        return self.start.ids if self.start is not None else None

    # ---- transitions ----------------------------------------------------------------------------
    def _think(self, piece: Units | None) -> bool:
        """Reasoning text `piece` (None: a special token); False if it runs past the marker."""
        pat = self.end.seq
        if piece is None:
            self.tail = self.end.empty
            return True
        s = self.tail + piece  # type: ignore[operator]
        i = _find(s, pat)
        if i >= 0:
            if i + len(pat) != len(s):
                return False  # NOTE: the mask never offers it (`free_row`)
            self.phase, self.answer_from = ANSWER, len(self.history) + 1
            return True
        self.tail = s[max(0, len(s) - len(pat) + 1) :]
        return True

    def _accept_opening(self, token_id: int) -> bool:
        assert self.start is not None
        piece = self.start.units(token_id)
        rest = self.start.seq[len(self.opened) :]
        over: Units | None = None
        if piece and (rest[: len(piece)] == piece or piece[: len(rest)] == rest):
            over = piece[len(rest) :]  # reasoning text in the same token
            if self.end.text == self.start.text and _straddles(self.end.empty, over, self.end.seq):
                over = None
        inner_ok = self.inner_alive and self.inner.accept(token_id)
        if over is None and not inner_ok:
            return False
        if over is None:  # the output left the opening: it is the answer, constrained throughout
            self.phase, self.answer_from = ANSWER, len(self.history) + 1
            return True
        self.inner_alive = inner_ok
        if len(piece) < len(rest):  # type: ignore[arg-type]
            self.opened = self.opened + piece  # type: ignore[operator]
            return True
        # NOTE: the opening is complete and wins over the inner grammar, which restarts.
        self.inner, self.phase = self.fresh.copy(), THINKING
        if over:
            self._think(over if self.end.text == self.start.text else None)
        return True

    # ---- Grammar --------------------------------------------------------------------------------
    def fill_mask(self, row: torch.Tensor) -> None:
        if self.phase == ANSWER:
            self.inner.fill_mask(row)
        elif self.phase == THINKING:
            free = self.end.free_row(_partial(self.tail, self.end.seq), row.numel())
            if free is None:
                row.fill_(-1)
            else:
                row.copy_(free)
        else:
            assert self.start is not None
            if self.inner_alive:
                self.inner.fill_mask(row)
            else:
                row.zero_()
            row.bitwise_or_(self.start.opening_row(len(self.opened), row.numel()))

    def accept(self, token_id: int) -> bool:
        if self.phase == ANSWER:
            ok = self.inner.accept(token_id)
        elif self.phase == OPENING:
            ok = self._accept_opening(token_id)
        else:
            ok = self._think(self.end.units(token_id))
        if ok:
            self.history.append(token_id)
        return ok

    def is_terminated(self) -> bool:
        return self.phase == ANSWER and self.inner.is_terminated()

    def jump_forward(self) -> str | None:
        return self.inner.jump_forward() if self.phase == ANSWER else None

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        keep = len(self.history) - n
        if self.phase == ANSWER and keep >= self.answer_from and n <= self.inner.max_rollback:
            self.inner.rollback(n)
            del self.history[keep:]
            return
        # NOTE: back across a state change (or past the inner grammar's own limit): replay the
        # kept tokens from the start (a reasoning token costs a few byte comparisons; jump-forward
        # never gets here).
        tokens = self.history[:keep]
        self._reset()
        for token in tokens:
            ok = self.accept(token)
            assert ok, "replay of accepted tokens failed"

    @property
    def max_rollback(self) -> int:
        # NOTE: jump-forward re-tokenizes the tail of the output; it must never re-tokenize the
        # marker (its ids could change), so only the answer part is offered. `rollback` itself
        # may cross the marker.
        if self.phase != ANSWER:
            return 0
        return min(self.inner.max_rollback, self.inner.num_accepted)

    @property
    def num_accepted(self) -> int:
        return len(self.history)

    def copy(self) -> ReasoningGrammar:
        other = object.__new__(ReasoningGrammar)
        other.__dict__.update(self.__dict__)
        other.inner = self.inner.copy()
        other.history = list(self.history)
        return other


def wrap_for_reasoning(
    grammar: Grammar, sampling_params: object, vocab: TokenVocab | None = None
) -> Grammar:
    """The request's grammar, reasoning-aware when its sampling params carry `think_end_ids`;
    `vocab` (the compiler's) lets a marker of ordinary tokens be matched on its text."""
    end = getattr(sampling_params, "think_end_ids", None)
    if not end:
        return grammar
    start = getattr(sampling_params, "think_start_ids", None)
    return ReasoningGrammar(grammar, tuple(end), tuple(start) if start else None, vocab)
