"""The constrained-decoding seams: `GrammarSpec` (what the user asked for), `Grammar` (one per
constrained request) and `GrammarCompiler` (shared, cached).

Ownership and threading:
- A `GrammarCompiler` lives in the scheduler process and is shared by all requests. `compile` is
  called from the scheduler's compile worker threads (never from the scheduler loop itself), so
  implementations must be thread-safe; they cache what they build.
- A `Grammar` belongs to exactly one request and is touched only by the scheduler loop thread:
  `fill_mask` while the batch's mask is built, `accept` after each sampled token, `rollback` and
  `accept` again when jump-forward re-tokenizes the tail of the output.

Token-level contract: the grammar has consumed exactly the request's `output_ids` (the prompt is
never seen). `fill_mask` allows a token iff appending it keeps the output a prefix of some string
of the language; EOS is allowed iff the output so far is a complete string of the language.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NOTE: the tokenizer manager imports this module and never needs torch
    import torch

CONSTRAINT_KINDS = ("regex", "json_schema", "choices", "ebnf")


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint as given in sampling params: `kind` is one of `CONSTRAINT_KINDS`; `value` is
    the regex / JSON-schema string / EBNF text, or a tuple of strings for `choices`."""

    kind: str
    value: str | tuple[str, ...]

    @classmethod
    def from_constraint(cls, kind: str, value: str | list[str]) -> GrammarSpec:
        return cls(kind, tuple(value) if isinstance(value, list) else value)

    def describe(self, limit: int = 80) -> str:
        """Short human-readable form for error messages."""
        text = repr(list(self.value)) if isinstance(self.value, tuple) else repr(self.value)
        return f"{self.kind} {text if len(text) <= limit else text[: limit - 3] + '...'}"


class Grammar(ABC):
    """The token-level automaton state of one request (see the module docstring)."""

    @abstractmethod
    def fill_mask(self, row: torch.Tensor) -> None:
        """Write the allowed-token bitmask into `row`: a contiguous CPU int32 tensor of
        ceil(model_vocab / 32) words; bit j of word w allows token 32 * w + j."""

    def allows(self, token_id: int) -> bool | None:
        """Whether `fill_mask` would allow `token_id`, where the backend can tell without
        computing the mask (a check of one token); None: it cannot, the caller reads the mask."""
        return None

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Consume one token; False (and no state change) if the grammar rejects it."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once nothing but EOS can follow (or EOS was accepted): the output is complete."""

    @abstractmethod
    def jump_forward(self) -> str | None:
        """The text every continuation of the current state starts with (the FSM admits exactly
        one continuation string), or None when the next character is not forced."""

    @abstractmethod
    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (n <= `max_rollback`)."""

    @property
    @abstractmethod
    def max_rollback(self) -> int:
        """How many tokens `rollback` can undo at most."""

    @property
    @abstractmethod
    def num_accepted(self) -> int:
        """Tokens consumed so far (== len(output_ids) of the owning request)."""

    @abstractmethod
    def copy(self) -> Grammar:
        """An independent grammar in the same state (sharing the compiled automaton)."""


class GrammarCompiler(ABC):
    """Turns a `GrammarSpec` into a fresh `Grammar` (see the module docstring for threading)."""

    @abstractmethod
    def validate(self, spec: GrammarSpec) -> None:
        """Cheap checks only; raise `GrammarError` naming the problem."""

    @abstractmethod
    def compile(self, spec: GrammarSpec) -> Grammar:
        """Blocking compile (cached); raise `GrammarError` when the spec cannot be compiled.
        Called from worker threads."""
