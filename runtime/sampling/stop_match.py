"""Stop strings: where a stop string ends, decided the same way in the scheduler and the detokenizer.

The rule (one definition for both processes): after token `n` is appended, a stop string matches
when an occurrence of it *ends inside the text that token `n` completed*. Occurrences that ended
earlier (e.g. before `min_new_tokens`) never match later, and the detokenizer trims at the earliest
occurrence that ends in the last token's text, so streamed and non-streamed outputs agree.

Text is decoded as the user sees it (the request's `skip_special_tokens`), over a tail window
counted in *bytes*, not characters: one CJK character or emoji is several byte-level tokens.

Owned by nobody: pure functions plus `StopChecker`, which the scheduler builds once per tokenizer.
"""

from __future__ import annotations

from typing import Any

_PARTIAL = "\ufffd"  # what a decoder yields for an incomplete UTF-8 sequence


def max_stop_bytes(stops: list[str]) -> int:
    return max((len(s.encode("utf-8")) for s in stops), default=0)


def earliest_stop_ending_after(
    text: str, before_len: int, stops: list[str]
) -> tuple[int, str] | None:
    """The earliest (start, stop) whose occurrence in `text` ends after `before_len` characters."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, max(before_len - len(stop) + 1, 0))
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best


def complete_len(text: str) -> int:
    """Characters of `text` without a trailing incomplete UTF-8 sequence (decoded as U+FFFD)."""
    return len(text.rstrip(_PARTIAL))


class StopChecker:
    """Checks a request's stop strings after each appended token (scheduler side)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        special.update(i for i, tok in added.items() if getattr(tok, "special", False))
        self.special_ids = frozenset(special)  # what skip_special_tokens drops
        texts = tokenizer.convert_ids_to_tokens(sorted(special)) if special else []
        self.special_texts = tuple(t for t in texts if t)

    def window_start(self, ids: list[int], nbytes: int) -> int:
        """Start of the tail window: the last token plus `nbytes` non-special tokens before it.

        NOTE: every non-special byte-level token decodes to >= 1 byte, so `nbytes` of them cover
        any occurrence of a stop of `nbytes` bytes that ends in the last token; a window that
        starts inside a character only adds U+FFFD before that occurrence. Special tokens are
        not counted: skipped, they decode to nothing."""
        i, need = len(ids) - 1, nbytes
        while i > 0 and need > 0:
            i -= 1
            if ids[i] not in self.special_ids:
                need -= 1
        return max(i, 0)

    def match(
        self, ids: list[int], stops: list[str], nbytes: int, skip_special: bool, spaces: bool
    ) -> str | None:
        """The stop string that the last token of `ids` completes, or None.

        NOTE: a stop string that spells a special token (e.g. the chat template's `<|im_end|>`)
        cannot be in the visible text: it is matched on the text with special tokens."""
        found = self._match(ids, stops, nbytes, skip_special, spaces)
        if found is None and skip_special:
            raw = [s for s in stops if any(t in s for t in self.special_texts)]
            if raw:
                found = self._match(ids, raw, max_stop_bytes(raw), False, spaces)
        return found

    def _match(
        self, ids: list[int], stops: list[str], nbytes: int, skip_special: bool, spaces: bool
    ) -> str | None:
        if not stops or not ids:
            return None
        start = self.window_start(ids, nbytes)
        kw = {"skip_special_tokens": skip_special, "spaces_between_special_tokens": spaces}
        tail = self.tokenizer.decode(ids[start:], **kw)
        if not any(s in tail for s in stops):
            return None
        before = complete_len(self.tokenizer.decode(ids[start:-1], **kw))
        found = earliest_stop_ending_after(tail, before, stops)
        return None if found is None else found[1]
