"""Jump-forward decoding (SGLang's compressed FSM): when the grammar forces a string, append it
in one extend step instead of decoding it token by token.

Plan (`plan_jump`, pure): text = bytes(output) + forced; re-tokenize it canonically (as the
tokenizer would have split that text), keep the longest common prefix with the current output
ids, and replace the rest by the new tail. Then `apply_jump` moves the grammar to the new tail
(rollback + accept, restored on any rejection). The scheduler owns the KV side: it hands the
request's KV for the *old* ids to the prefix cache and re-queues the request, whose extend round
then re-matches the common prefix from the radix cache and computes only the new tail.

Invariants:
- ids already streamed (`min_keep`) are never replaced, so the detokenizer's sequence only grows;
- the bytes of the new output are exactly the old bytes + a prefix of the forced string;
- at least one token of `max_new_tokens` is left for the sample after the jump.
Runs on the scheduler loop thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.runtime.constrained.base import Grammar
from radixlm.runtime.constrained.vocab import TokenVocab

MIN_NEW_TOKENS = 2  # a jump costs one forward: below this, decoding is as fast


@dataclass(frozen=True)
class JumpPlan:
    keep: int  # leading output ids kept
    tail: list[int]  # ids that replace output_ids[keep:]

    def added(self, num_output: int) -> int:
        return self.keep + len(self.tail) - num_output


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def plan_jump(
    grammar: Grammar,
    output_ids: list[int],
    vocab: TokenVocab,
    tokenizer: Any,
    min_keep: int,
    max_output: int,
) -> JumpPlan | None:
    """The re-tokenized output after appending the grammar's forced string, or None when there
    is nothing (worth) jumping over. `max_output` caps len(output) after the jump."""
    forced = grammar.jump_forward()
    if not forced:
        return None
    n = len(output_ids)
    min_keep = max(min_keep, n - grammar.max_rollback, 0)
    start = min_keep  # re-tokenize from here (the whole output unless some of it was streamed)
    try:
        base = vocab.decode_bytes(output_ids[start:]).decode("utf-8")
    except (TypeError, UnicodeDecodeError):  # a special id, or min_keep splits a character
        return None
    new = tokenizer.encode(base + forced, add_special_tokens=False)
    k = start + _common_prefix(output_ids[start:], new)
    tail = new[k - start :]
    tail = tail[: max(max_output - k, 0)]
    plan = JumpPlan(k, tail)
    if plan.added(n) < MIN_NEW_TOKENS:
        return None
    expected = vocab.decode_bytes(output_ids) + forced.encode("utf-8")
    try:
        got = vocab.decode_bytes(output_ids[:k] + tail)
    except TypeError:
        return None
    if not expected.startswith(got) or len(got) <= len(expected) - len(forced.encode("utf-8")):
        return None  # the tokenizer did not round-trip the text (or added nothing)
    return plan


def apply_jump(grammar: Grammar, output_ids: list[int], plan: JumpPlan) -> bool:
    """Move `grammar` from `output_ids` to `output_ids[:keep] + tail`; False (grammar unchanged)
    if it rejects a tail token. The caller updates the request's ids and KV."""
    dropped = output_ids[plan.keep :]
    grammar.rollback(len(dropped))
    for i, token in enumerate(plan.tail):
        if not grammar.accept(token):
            grammar.rollback(i)
            for old in dropped:
                grammar.accept(old)
            return False
    return True
