"""`TokenVocab`: our tokenizer's vocabulary as bytes, the input of outlines-core's `Vocabulary`.

Each token id maps to the exact bytes it decodes to (byte-level BPE: through the GPT-2 byte <->
unicode table; SentencePiece: `▁` is a space and `<0xHH>` is one byte). Special and added tokens
(`<|im_start|>`, ...) get None: a constraint never allows them, except EOS when the FSM accepts.
Ids at or beyond the model's vocab size are dropped (the model cannot produce them).

Built once per scheduler process (lazily, by the first compile, under a lock); immutable after.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _byte_to_unicode() -> dict[int, str]:
    """The GPT-2 byte-level alphabet: printable bytes stand for themselves, the others are
    shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


_UNICODE_TO_BYTE = {u: b for b, u in _byte_to_unicode().items()}


def _is_byte_level(tokenizer: Any, vocab: dict[str, int]) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is not None and "ByteLevel" in repr(decoder):
        return True
    # No decoder to ask: GPT-2 style vocabularies spell a leading space as "Ġ".
    return sum("\u0120" in t for t in vocab) > 100 and not any("\u2581" in t for t in vocab)


def token_bytes_table(tokenizer: Any, vocab_size: int) -> list[bytes | None]:
    """Per token id < vocab_size: its bytes, or None (special/added/unknown ids)."""
    vocab: dict[str, int] = tokenizer.get_vocab()
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    table: list[bytes | None] = [None] * vocab_size
    byte_level = _is_byte_level(tokenizer, vocab)
    for text, tid in vocab.items():
        if not 0 <= tid < vocab_size or tid in special:
            continue
        if byte_level:
            try:
                table[tid] = bytes(_UNICODE_TO_BYTE[c] for c in text)
            except KeyError:  # not a byte-level token after all: decode it
                table[tid] = tokenizer.convert_tokens_to_string([text]).encode("utf-8")
        elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            table[tid] = bytes([int(text[3:5], 16)])
        else:
            table[tid] = text.replace("\u2581", " ").encode("utf-8")
    return table


@dataclass
class TokenVocab:
    token_bytes: list[bytes | None]
    eos_ids: tuple[int, ...]  # every id that ends a sequence (allowed when the FSM accepts)
    vocab_size: int  # the model's (mask width = ceil(vocab_size / 32) words)
    fingerprint: str = ""  # identifies the tokenizer in cache keys
    byte_token: dict[int, int] = field(default_factory=dict)  # byte value -> a 1-byte token id
    first_byte: np.ndarray = field(default_factory=lambda: np.empty(0, np.int16))  # -1: none
    _outlines: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]
    ) -> TokenVocab:
        table = token_bytes_table(tokenizer, vocab_size)
        for eos in eos_ids:
            if 0 <= eos < vocab_size:
                table[eos] = None
        h = hashlib.sha256()
        h.update(repr((vocab_size, eos_ids)).encode())
        for tid, tb in enumerate(table):
            if tb is not None:
                h.update(tid.to_bytes(4, "little") + len(tb).to_bytes(2, "little") + tb)
        byte_token: dict[int, int] = {}
        for tid, tb in enumerate(table):
            if tb is not None and len(tb) == 1:
                byte_token.setdefault(tb[0], tid)
        first = np.array([tb[0] if tb else -1 for tb in table], dtype=np.int16)
        return cls(table, tuple(eos_ids), vocab_size, h.hexdigest()[:16], byte_token, first)

    @property
    def eos_id(self) -> int:
        return self.eos_ids[0]

    def outlines_vocabulary(self) -> Any:
        """outlines-core's `Vocabulary` (built once, thread-safe)."""
        with self._lock:
            if self._outlines is None:
                from outlines_core import Vocabulary

                mapping: dict[bytes, list[int]] = {}
                for tid, tb in enumerate(self.token_bytes):
                    if tb:
                        mapping.setdefault(tb, []).append(tid)
                self._outlines = Vocabulary(self.eos_id, mapping)
            return self._outlines

    def decode_bytes(self, ids: list[int]) -> bytes:
        """The exact bytes of `ids` (a TypeError if one of them is special)."""
        return b"".join(self.token_bytes[t] for t in ids)  # type: ignore[misc]
