"""Shared pieces of the constrained-decoding tests: the default tokenizer, an in-process compiler,
mask unpacking, and a brute-force oracle built from interegular's character FSM."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch

VOCAB = 49152  # the default model's vocab size
WORDS = (VOCAB + 31) // 32
EOS = 2


@functools.lru_cache(maxsize=1)
def tokenizer() -> Any:
    from radixlm.runtime.frontend.tokenizer import load_server_tokenizer
    from radixlm.runtime.server_args import ServerArgs

    return load_server_tokenizer(ServerArgs())


BACKENDS = ("outlines", "llguidance", "xgrammar")


def make_compiler(
    cache_dir: str | None = None, whitespace: str | None = None, backend: str = "outlines"
) -> Any:
    if backend == "llguidance":
        from radixlm.runtime.constrained.llguidance_backend import LLGuidanceCompiler

        return LLGuidanceCompiler(tokenizer(), VOCAB, (EOS,), whitespace)
    if backend == "xgrammar":
        from radixlm.runtime.constrained.xgrammar_backend import XGrammarCompiler

        return XGrammarCompiler(tokenizer(), VOCAB, (EOS,), whitespace)
    from radixlm.runtime.constrained.outlines_backend import OutlinesCompiler

    return OutlinesCompiler(tokenizer(), VOCAB, (EOS,), whitespace, cache_dir)


def allowed_ids(grammar: Any) -> torch.Tensor:
    from radixlm.kernels.token_bitmask import unpack_bitmask

    row = torch.zeros(WORDS, dtype=torch.int32)
    grammar.fill_mask(row)
    return unpack_bitmask(row.view(1, -1), VOCAB)[0]


class CharOracle:
    """Decides, from the regex's character-level FSM (interegular), whether appending a token's
    bytes keeps the text a prefix of some string of the language."""

    def __init__(self, regex: str) -> None:
        import interegular
        from interegular.fsm import anything_else

        self.fsm = interegular.parse_pattern(regex).to_fsm()
        self.other = anything_else
        self.explicit = [s for s in self.fsm.alphabet._symbol_mapping if s is not anything_else]
        back: dict[int, set[int]] = {}
        for s, edges in self.fsm.map.items():
            for t in edges.values():
                back.setdefault(t, set()).add(s)
        live, todo = set(self.fsm.finals), list(self.fsm.finals)
        while todo:
            for s in back.get(todo.pop(), ()):
                if s not in live:
                    live.add(s)
                    todo.append(s)
        self.live = live

    def step(self, state: int | None, ch: str) -> int | None:
        if state is None:
            return None
        try:
            key = self.fsm.alphabet[ch]
        except KeyError:
            return None
        nxt = self.fsm.map.get(state, {}).get(key)
        return nxt if nxt in self.live else None

    def feed(self, state: int, pending: bytes, data: bytes) -> tuple[int, bytes] | None:
        """Walk bytes; returns (state, incomplete UTF-8 tail) or None (dead / invalid UTF-8)."""
        buf = pending + data
        cut = len(buf)
        for back in range(1, min(4, len(buf)) + 1):  # find an incomplete trailing sequence
            b = buf[-back]
            if b & 0xC0 != 0x80:
                need = 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4 if b >> 3 == 30 else 1
                if need > back:
                    cut = len(buf) - back
                break
        try:
            text = buf[:cut].decode("utf-8")
        except UnicodeDecodeError:
            return None
        cur: int | None = state
        for ch in text:
            cur = self.step(cur, ch)
            if cur is None:
                return None
        return cur, buf[cut:]

    def can_complete(self, state: int, tail: bytes) -> bool:
        """Is there a character whose UTF-8 encoding starts with `tail` and keeps `state` live?"""
        if not tail:
            return True
        for sym in self.explicit:
            if (
                len(sym) == 1
                and sym.encode("utf-8").startswith(tail)
                and self.step(state, sym) is not None
            ):
                return True
        other_key = self.fsm.alphabet._symbol_mapping.get(self.other)
        if other_key is None or self.fsm.map.get(state, {}).get(other_key) not in self.live:
            return False
        lead = tail[0]
        total = 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 0
        missing = total - len(tail)
        if missing < 0:
            return False
        # NOTE: these continuation bytes reach every valid range (E0/F0 need >= A0/90, ED/F4
        # need <= 9F/8F), so some candidate decodes whenever the prefix is valid UTF-8.
        for rest in itertools.product((0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF), repeat=missing):
            try:
                ch = (tail + bytes(rest)).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if ch not in self.explicit:
                return True
        return False

    def allowed(self, state: int, pending: bytes, token: bytes | None, is_eos: bool) -> bool:
        if is_eos:
            return not pending and state in self.fsm.finals
        if not token:
            return False
        walked = self.feed(state, pending, token)
        return walked is not None and self.can_complete(*walked)
