"""`ReasoningGrammar`: a reasoning-aware wrapper around any backend's `Grammar` (SGLang's
reasoner grammar). The `<think>` section of a reasoning model's output is left free; the inner
grammar constrains only the tokens after the end-of-reasoning marker.

Carried in sampling params (set by the chat endpoint when `--reasoning-parser` separates the
reasoning, or by a native request itself):
    think_end_ids    the marker's token ids (`</think>`: one special token on reasoning models);
    think_start_ids  None: the output starts inside the reasoning (deepseek-r1, the template opened
                     `<think>`); else the opening marker's ids (qwen3): the output is free only if
                     it opens with them, and an output that starts otherwise is constrained from
                     its first token.

States: OPENING (qwen3, before the first token, or while the opening ids are being emitted),
THINKING (free: every token allowed, the inner grammar sees nothing: no mask, no advance, no
jump-forward), ANSWER (the inner grammar owns mask, accept, termination and jump-forward).
The marker is matched on token ids, so a marker spelt by other tokens is not recognised.

Owned like every `Grammar`: one per request, scheduler loop thread only (`manager.py` wraps).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.runtime.constrained.base import Grammar

if TYPE_CHECKING:
    import torch


class ReasoningGrammar(Grammar):
    def __init__(
        self, inner: Grammar, end_ids: tuple[int, ...], start_ids: tuple[int, ...] | None
    ) -> None:
        assert end_ids and (start_ids is None or start_ids)
        self.inner = inner
        self.end_ids = end_ids
        self.start_ids = start_ids
        # NOTE: the tokens before the inner grammar's first one (opening + reasoning + marker);
        # `num_accepted == len(prefix) + inner.num_accepted` always.
        self.prefix: list[int] = []
        self.answering = False  # the inner grammar is live

    # ---- state ----------------------------------------------------------------------------------
    def _opening(self) -> int | None:
        """How many opening ids were emitted while still opening (qwen3), else None."""
        if self.answering or self.start_ids is None:
            return None
        k = len(self.prefix)
        return k if k < len(self.start_ids) else None

    def _recompute(self) -> None:
        """`answering` from `prefix` (after a rollback): the prefix ends with the marker."""
        n = len(self.end_ids)
        self.answering = len(self.prefix) >= n and tuple(self.prefix[-n:]) == self.end_ids

    # ---- Grammar --------------------------------------------------------------------------------
    def fill_mask(self, row: torch.Tensor) -> None:
        if self.answering:
            self.inner.fill_mask(row)
            return
        k = self._opening()
        if k is None:
            row.fill_(-1)  # reasoning: free
            return
        if k == 0:
            self.inner.fill_mask(row)  # an answer right away, or the opening marker
        else:
            row.zero_()
        token = self.start_ids[k]  # type: ignore[index]
        row[token // 32] |= _bit(token % 32)

    def accept(self, token_id: int) -> bool:
        if self.answering:
            return self.inner.accept(token_id)
        k = self._opening()
        if k is not None:
            assert self.start_ids is not None
            if token_id == self.start_ids[k]:  # NOTE: the opening wins over the inner grammar
                self.prefix.append(token_id)
                return True
            if k > 0:
                return False
            # qwen3 without thinking: constrained from the first token.
            if not self.inner.accept(token_id):
                return False
            self.answering = True
            return True
        self.prefix.append(token_id)
        self._recompute()
        return True

    def is_terminated(self) -> bool:
        return self.answering and self.inner.is_terminated()

    def jump_forward(self) -> str | None:
        return self.inner.jump_forward() if self.answering else None

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        inner_n = min(n, self.inner.num_accepted)
        if inner_n:
            self.inner.rollback(inner_n)
        rest = n - inner_n
        if self.inner.num_accepted == 0:
            if rest:
                del self.prefix[len(self.prefix) - rest :]
            self._recompute()

    @property
    def max_rollback(self) -> int:
        # NOTE: jump-forward re-tokenizes the tail of the output; it must never re-tokenize the
        # marker (its ids could change), so only the answer part is offered. `rollback` itself
        # may cross the marker.
        if not self.answering:
            return 0
        return min(self.inner.max_rollback, self.inner.num_accepted)

    @property
    def num_accepted(self) -> int:
        return len(self.prefix) + self.inner.num_accepted

    def copy(self) -> ReasoningGrammar:
        other = ReasoningGrammar(self.inner.copy(), self.end_ids, self.start_ids)
        other.prefix = list(self.prefix)
        other.answering = self.answering
        return other


def _bit(j: int) -> int:
    """Bit j of an int32 word as a Python int (bit 31 is the sign bit)."""
    return (1 << j) - (1 << 32) if j == 31 else 1 << j


def wrap_for_reasoning(grammar: Grammar, sampling_params: object) -> Grammar:
    """The request's grammar, reasoning-aware when its sampling params carry `think_end_ids`."""
    end = getattr(sampling_params, "think_end_ids", None)
    if not end:
        return grammar
    start = getattr(sampling_params, "think_start_ids", None)
    return ReasoningGrammar(grammar, tuple(end), tuple(start) if start else None)
