"""Tokens as the OpenAI logprob formats show them: raw bytes, unique strings, character offsets.

A byte-level token can hold part of a UTF-8 character: decoded alone it is U+FFFD, which loses its
bytes and makes different tokens look equal. So each token id maps to its exact bytes
(`constrained/vocab.py`'s table); its string is those bytes as text when they are valid UTF-8, else
OpenAI's escape `bytes:\\xNN...`, so no two tokens share a `top_logprobs` key. `text_offset` is the
number of complete characters before a token, counted on the bytes of the tokens before it, so it
is the same however the tokens are split into stream chunks.

Owned by the HTTP process; one `TokenBytes` per tokenizer (built on first use, ~0.1 s).
"""

from __future__ import annotations

import codecs
import threading
from typing import Any

from radixlm.runtime.constrained.vocab import token_bytes_table

_LOCK = threading.Lock()
_CACHE: dict[int, tuple[Any, TokenBytes]] = {}


class TokenBytes:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.table = token_bytes_table(tokenizer, len(tokenizer))

    @staticmethod
    def of(tokenizer: Any) -> TokenBytes | None:
        """The shared instance for `tokenizer` (None without one)."""
        if tokenizer is None:
            return None
        with _LOCK:
            hit = _CACHE.get(id(tokenizer))
            if hit is None or hit[0] is not tokenizer:
                hit = _CACHE[id(tokenizer)] = (tokenizer, TokenBytes(tokenizer))
            return hit[1]

    def is_special(self, tid: int) -> bool:
        return not 0 <= tid < len(self.table) or self.table[tid] is None

    def bytes_of(self, tid: int) -> bytes:
        raw = self.table[tid] if 0 <= tid < len(self.table) else None
        if raw is None:  # special or added token: its text
            raw = self.tokenizer.decode([tid], skip_special_tokens=False).encode("utf-8")
        return raw

    def token_str(self, tid: int) -> str:
        return token_str(self.bytes_of(tid))


def token_str(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class CharOffsets:
    """Character offsets of successive tokens: `next(raw)` is the number of complete characters
    decoded before `raw` (plus `base`); an incomplete character is not counted until complete."""

    def __init__(self, base: int = 0) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.chars = base

    def next(self, raw: bytes) -> int:
        before = self.chars
        self.chars += len(self.decoder.decode(raw))
        return before
