"""SGLang 0.5.x sampling parameters beyond the core set: `stop_regex` (validated here, matched by
`Req.check_finished`), and the ones radixlm accepts only at their defaults, rejected by name
otherwise (a 400 / `InvalidRequestError` whose message says why).

Ownership: pure validation helpers called by `SamplingParams.from_dict` / `_validate`.
"""

from __future__ import annotations

import re
from typing import Any

from radixlm.runtime.errors import InvalidRequestError

# A stop regex is searched in the text of the last this-many output tokens, after every token:
# a match longer than the window's text is not seen.
STOP_REGEX_WINDOW = 64
_MAX_STOP_REGEX = 16
_MAX_STOP_REGEX_LEN = 512

# name -> (the default it must keep, why radixlm cannot honour another value)
UNSUPPORTED_AT_NON_DEFAULT: dict[str, tuple[Any, str]] = {
    "structural_tag": (None, "structural tags (xgrammar's triggered sub-grammars) are not "
                       "implemented: use json_schema, regex or ebnf"),
    "custom_params": (None, "custom_params feed custom logit processors, which radixlm does not "
                      "run (custom_logit_processor is rejected too)"),
    "stream_interval": (1, "radixlm streams every token: only stream_interval 1 (or null)"),
}  # fmt: skip


def check_unsupported(params: dict[str, Any]) -> None:
    """Reject SGLang parameters that radixlm accepts only at their defaults (None = default)."""
    for name, (default, why) in UNSUPPORTED_AT_NON_DEFAULT.items():
        value = params.get(name)
        if value is not None and value != default:
            raise InvalidRequestError(f"{name} is not supported by radixlm: {why}", name)


def check_stop_regex(value: Any) -> list[str]:
    """A string or a list of Python regexes; each must compile. Returns the list."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise InvalidRequestError(
            "stop_regex must be a regex string or a list of non-empty regex strings", "stop_regex"
        )
    if len(value) > _MAX_STOP_REGEX or any(len(p) > _MAX_STOP_REGEX_LEN for p in value):
        raise InvalidRequestError(
            f"stop_regex: at most {_MAX_STOP_REGEX} patterns of at most {_MAX_STOP_REGEX_LEN} "
            "characters",
            "stop_regex",
        )
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as e:
            raise InvalidRequestError(
                f"stop_regex: invalid regex {pattern!r}: {e}", "stop_regex"
            ) from None
    return value


def first_stop_regex_match(patterns: list[str], text: str) -> str | None:
    """The text of the earliest match of any pattern in `text` (None if none matches)."""
    best: re.Match[str] | None = None
    for pattern in patterns:
        m = next((m for m in re.finditer(pattern, text) if m.group(0)), None)
        if m is not None and (best is None or m.start() < best.start()):
            best = m
    return best.group(0) if best is not None else None
