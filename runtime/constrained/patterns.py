"""From a `GrammarSpec` to the regex its token FSM is built from, with cheap up-front checks.

`check_spec` is what the tokenizer manager calls before a request is sent (so a bad pattern is
a 400 at once) and what the compile workers call again; `spec_to_regex` is the same work returning
the regex. Both are pure, cached (LRU) and thread-safe.

A regex means what Python's `re` reads (`re.fullmatch` semantics): `regex_python.translate`
parses it with Python's parser, refuses by name what an automaton cannot express or what other
dialects read differently, and re-writes the rest in the plain syntax outlines-core compiles.
"""

from __future__ import annotations

import functools

from radixlm.runtime.constrained.base import GrammarSpec
from radixlm.runtime.constrained.json_schema import schema_to_regex
from radixlm.runtime.constrained.regex_python import translate
from radixlm.runtime.errors import GrammarError

MAX_PATTERN_CHARS = 100_000
MAX_CHOICES = 4096
# Characters with a meaning in regex syntax (the rest are literal in Rust regex and interegular).
_META = set("\\.+*?()|[]{}^$")


def escape_literal(text: str) -> str:
    """Regex matching exactly `text` (escapes only regex metacharacters, which both Rust's regex
    and interegular accept escaped)."""
    return "".join("\\" + c if c in _META else c for c in text)


def choices_regex(choices: tuple[str, ...]) -> str:
    return "(" + "|".join(escape_literal(c) for c in choices) + ")"


def check_regex(pattern: str, field: str = "regex") -> str:
    """The regex outlines-core compiles for a user `pattern`; GrammarError when it cannot be
    honoured."""
    if not isinstance(pattern, str) or not pattern:
        raise GrammarError(f"{field} must be a non-empty string", field)
    if len(pattern) > MAX_PATTERN_CHARS:
        raise GrammarError(f"{field} is longer than {MAX_PATTERN_CHARS} characters", field)
    return translate(pattern, field)


@functools.lru_cache(maxsize=1024)
def spec_to_regex(spec: GrammarSpec, whitespace_pattern: str | None = None) -> str:
    """The regex of the spec's language (raises GrammarError)."""
    if spec.kind == "regex":
        assert isinstance(spec.value, str)
        return check_regex(spec.value)
    if spec.kind == "json_schema":
        assert isinstance(spec.value, str)
        if whitespace_pattern:  # NOTE: "" is valid: compact JSON, no whitespace at all
            whitespace_pattern = check_regex(
                whitespace_pattern, "constrained_json_whitespace_pattern"
            )
        return schema_to_regex(spec.value, whitespace_pattern)
    if spec.kind == "choices":
        choices = spec.value
        if (
            not isinstance(choices, tuple)
            or not choices
            or not all(isinstance(c, str) and c for c in choices)
        ):
            # NOTE: the same rule as `rl.select`: the empty string is never a choice.
            raise GrammarError("choices must be a non-empty list of non-empty strings", "choices")
        if len(choices) > MAX_CHOICES:
            raise GrammarError(f"at most {MAX_CHOICES} choices are supported", "choices")
        return choices_regex(choices)
    if spec.kind == "ebnf":
        raise GrammarError(
            "ebnf grammars are not supported by the outlines grammar backend (use regex, "
            "json_schema or choices)",
            "ebnf",
        )
    raise GrammarError(f"unknown constraint kind {spec.kind!r}", spec.kind)


def check_spec(spec: GrammarSpec, whitespace_pattern: str | None = None) -> None:
    """Cheap validation (no token FSM is built): raise GrammarError naming the problem."""
    spec_to_regex(spec, whitespace_pattern)


def check_sampling_params(sp: object, whitespace_pattern: str | None = None) -> None:
    """`check_spec` for a `SamplingParams` (no-op without a constraint): the tokenizer manager's
    validation hook."""
    constraint = getattr(sp, "constraint", None)
    if constraint is not None:
        check_spec(GrammarSpec.from_constraint(*constraint), whitespace_pattern)
