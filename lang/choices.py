"""How `select` picks a choice from per-token log-probabilities (SGLang's `choices_method`).

Ownership: the methods are stateless singletons; a backend computes the log-probabilities (one
batched call over `prefix + choice` for every choice) and calls the method with them.

Log-probability lists hold SGLang's tuples `(logprob | None, token_id, token_text | None)`, one
list per choice, covering exactly the tokens of that choice.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

LogprobList = Sequence[Sequence[Any]]


@dataclass(frozen=True)
class ChoicesDecision:
    """The chosen string and the scores behind it (what `s.get_meta_info(name)` returns)."""

    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


def _argmax_first(values: Sequence[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def _values(logprobs: Sequence[Sequence[Any]]) -> list[float]:
    return [float(t[0]) for t in logprobs if t[0] is not None]


def normalized_logprob(logprobs: Sequence[Sequence[Any]]) -> float:
    """Mean log-probability of a choice's tokens (`None` entries skipped); -inf if none."""
    values = _values(logprobs)
    return sum(values) / len(values) if values else -math.inf


class ChoicesSamplingMethod(ABC):
    """A rule that maps per-choice token log-probabilities to a decision."""

    name: str = ""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        """True if the backend must also score each choice alone (without the prompt)."""
        return False

    @abstractmethod
    def __call__(
        self,
        *,
        choices: Sequence[str],
        normalized_prompt_logprobs: Sequence[float],
        input_token_logprobs: Sequence[LogprobList],
        output_token_logprobs: Sequence[LogprobList],
        unconditional_token_logprobs: Sequence[LogprobList] | None = None,
    ) -> ChoicesDecision: ...

    def __repr__(self) -> str:
        return self.name


class TokenLengthNormalized(ChoicesSamplingMethod):
    """Pick the choice with the highest mean token log-probability (SGLang's default)."""

    name = "token_length_normalized"

    def __call__(
        self,
        *,
        choices,
        normalized_prompt_logprobs,
        input_token_logprobs,
        output_token_logprobs,
        unconditional_token_logprobs=None,
    ) -> ChoicesDecision:
        best = _argmax_first(normalized_prompt_logprobs)
        return ChoicesDecision(
            choices[best],
            {
                "normalized_prompt_logprobs": list(normalized_prompt_logprobs),
                "input_token_logprobs": list(input_token_logprobs),
                "output_token_logprobs": list(output_token_logprobs),
            },
        )


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare choices token by token, keeping those with the best log-probability at each step.

    A shorter choice is padded with its own mean log-probability, as SGLang does.
    """

    name = "greedy_token_selection"

    def __call__(
        self,
        *,
        choices,
        normalized_prompt_logprobs,
        input_token_logprobs,
        output_token_logprobs,
        unconditional_token_logprobs=None,
    ) -> ChoicesDecision:
        width = max(len(lp) for lp in input_token_logprobs)
        matrix = []
        for lp in input_token_logprobs:
            row = [float(t[0]) if t[0] is not None else 0.0 for t in lp]
            pad = sum(row) / len(row) if row else -math.inf
            matrix.append(row + [pad] * (width - len(row)))
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        return ChoicesDecision(
            choices[remaining[0]],
            {
                "normalized_prompt_logprobs": list(normalized_prompt_logprobs),
                "input_token_logprobs": list(input_token_logprobs),
                "output_token_logprobs": list(output_token_logprobs),
                "greedy_logprob_matrix": matrix,
            },
        )


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Pick the choice whose tokens gain most log-probability from the prompt.

    Score = mean over the choice's tokens of `logp(token | prompt) - logp(token | choice alone)`;
    the first unconditional log-probability (no context) counts as 0.
    """

    name = "unconditional_likelihood_normalized"

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(
        self,
        *,
        choices,
        normalized_prompt_logprobs,
        input_token_logprobs,
        output_token_logprobs,
        unconditional_token_logprobs=None,
    ) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError(
                "unconditional_likelihood_normalized needs unconditional token logprobs"
            )
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs, strict=True):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional logprobs differ in length")
            diffs = [(c[0] or 0.0) - (u[0] or 0.0) for c, u in zip(cond, uncond, strict=True)]
            scores.append(sum(diffs) / len(diffs) if diffs else -math.inf)
        best = _argmax_first(scores)
        return ChoicesDecision(
            choices[best],
            {
                "normalized_prompt_logprobs": list(normalized_prompt_logprobs),
                "input_token_logprobs": list(input_token_logprobs),
                "output_token_logprobs": list(output_token_logprobs),
                "unconditional_token_logprobs": list(unconditional_token_logprobs),
                "normalized_unconditional_prompt_logprobs": scores,
            },
        )


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()

_BY_NAME = {
    m.name: m
    for m in (token_length_normalized, greedy_token_selection, unconditional_likelihood_normalized)
}


def resolve_choices_method(method: ChoicesSamplingMethod | str | None) -> ChoicesSamplingMethod:
    """Accept a method object or its name; `None` means the default (token_length_normalized)."""
    if method is None:
        return token_length_normalized
    if isinstance(method, ChoicesSamplingMethod):
        return method
    try:
        return _BY_NAME[method]
    except KeyError:
        raise ValueError(
            f"unknown choices_method {method!r}; expected one of {sorted(_BY_NAME)}"
        ) from None
