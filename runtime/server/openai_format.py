"""Engine results -> OpenAI response objects and stream chunks.

Choices are indexed by flat position (prompt-major, n samples each: OpenAI's order). `usage`
counts each prompt once (its first sample), completions of every choice, and reports the prompt
tokens served from the prefix cache as `prompt_tokens_details.cached_tokens`. finish_reason is
"stop" (EOS or a stop string / token), "length", or "abort" (SGLang's, for aborted requests);
`matched_stop` (SGLang's extension) is the stop string or token id that ended the choice.
Logprob tokens are shown by `logprob_tokens.py` (exact bytes, unique strings, stable offsets).
Threading: pure functions plus `StreamConverter`, which one streaming response owns.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from radixlm.runtime.server.logprob_tokens import CharOffsets, TokenBytes, token_str

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def make_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def finish_reason(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    return None if reason is None else _FINISH.get(reason.get("type"), "stop")


def matched_stop(meta: dict[str, Any]) -> Any:
    reason = meta.get("finish_reason") or {}
    return reason.get("matched")


def usage(metas: list[dict[str, Any]], n: int) -> dict[str, Any]:
    firsts = metas[::n]
    prompt = sum(m["prompt_tokens"] for m in firsts)
    completion = sum(m["completion_tokens"] for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(m["cached_tokens"] for m in firsts)},
    }


def _raw(tid: int, text: str | None, tb: TokenBytes | None) -> bytes:
    """The token's exact bytes (its decoded text's without a tokenizer table)."""
    return tb.bytes_of(tid) if tb is not None else (text or "").encode("utf-8")


def _entry(lp: float | None, tid: int, text: str | None, tb: TokenBytes | None) -> dict[str, Any]:
    raw = _raw(tid, text, tb)
    return {"token": token_str(raw), "logprob": lp, "bytes": list(raw)}


def chat_logprobs(
    meta: dict[str, Any], start: int = 0, tb: TokenBytes | None = None
) -> dict[str, Any]:
    """`choice.logprobs` of chat: per output token from `start`, with its top alternatives."""
    tops = meta.get("output_top_logprobs") or []
    content = []
    for k, (lp, tid, text) in enumerate(meta.get("output_token_logprobs", [])[start:], start):
        row = tops[k] if k < len(tops) and tops[k] else []
        alts = [_entry(v, t, txt, tb) for v, t, txt in row]
        content.append({**_entry(lp, tid, text, tb), "top_logprobs": alts})
    return {"content": content}


def completion_logprobs(
    meta: dict[str, Any],
    start: int,
    offsets: CharOffsets,
    tb: TokenBytes | None = None,
    with_input: bool = False,
) -> dict[str, Any]:
    """Legacy `choice.logprobs` (tokens, token_logprobs, top_logprobs, text_offset) of the output
    tokens from `start` (and, `with_input`, of the echoed prompt first, its offsets from 0).
    NOTE: `offsets` has consumed the output tokens before `start` (a stream keeps one per choice;
    its base is the echoed prompt's length), so offsets do not depend on the chunking."""
    rows: list[tuple[Any, Any, CharOffsets, bool]] = []
    if with_input:
        in_tops, prompt = meta.get("input_top_logprobs") or [], CharOffsets()
        for k, triple in enumerate(meta.get("input_token_logprobs", [])):
            rows.append((triple, in_tops[k] if k < len(in_tops) else None, prompt, True))
    out_tops = meta.get("output_top_logprobs") or []
    for k, triple in enumerate(meta.get("output_token_logprobs", [])[start:], start):
        rows.append((triple, out_tops[k] if k < len(out_tops) else None, offsets, False))
    tokens, values, tops, text_offset = [], [], [], []
    for (lp, tid, text), top, chars, shown in rows:
        raw = _raw(tid, text, tb)
        tokens.append(token_str(raw))
        values.append(lp)
        tops.append({token_str(_raw(t, txt, tb)): v for v, t, txt in top} if top else None)
        # NOTE: the output's special tokens are not in its text (skip_special_tokens).
        visible = shown or tb is None or not tb.is_special(tid)
        text_offset.append(chars.next(raw if visible else b""))
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": text_offset,
    }


def completion_response(
    results: list[dict[str, Any]], n: int, model: str, echo: list[str] | None, logprobs: bool,
    tb: TokenBytes | None = None,
) -> dict[str, Any]:  # fmt: skip
    choices = []
    for i, r in enumerate(results):
        meta = r["meta_info"]
        prefix = echo[i // n] if echo is not None else ""
        lp = None
        if logprobs:
            lp = completion_logprobs(meta, 0, CharOffsets(len(prefix)), tb, echo is not None)
        choices.append({"index": i, "text": prefix + r["text"], "logprobs": lp,
                        "finish_reason": finish_reason(meta), "matched_stop": matched_stop(meta)})  # fmt: skip
    return {
        "id": make_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage([r["meta_info"] for r in results], n),
    }


def chat_response(
    results: list[dict[str, Any]], model: str, logprobs: bool, tb: TokenBytes | None = None
) -> dict[str, Any]:
    choices = []
    for i, r in enumerate(results):
        meta = r["meta_info"]
        choices.append({
            "index": i,
            "message": {"role": "assistant", "content": r["text"], "tool_calls": None},
            "logprobs": chat_logprobs(meta, 0, tb) if logprobs else None,
            "finish_reason": finish_reason(meta),
            "matched_stop": matched_stop(meta),
        })  # fmt: skip
    return {
        "id": make_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage([r["meta_info"] for r in results], len(results)),
    }


class StreamConverter:
    """Engine stream chunks (cumulative text, `index` for n > 1 / batches) -> OpenAI chunks."""

    def __init__(self, chat: bool, model: str, n: int, total: int, include_usage: bool,
                 logprobs: bool, echo: list[str] | None = None,
                 tb: TokenBytes | None = None) -> None:  # fmt: skip
        self.chat, self.model, self.n, self.total = chat, model, n, total
        self.include_usage, self.logprobs, self.echo, self.tb = include_usage, logprobs, echo, tb
        self.offsets: dict[int, CharOffsets] = {}  # per choice: text_offset across chunks
        self.id = make_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.sent_chars: dict[int, int] = {}
        self.sent_tokens: dict[int, int] = {}
        self.finals: dict[int, dict[str, Any]] = {}

    def _chunk(self, choices: list[dict[str, Any]], usage_: Any = None) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            out["usage"] = usage_
        return out

    def convert(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        i = int(chunk.get("index", 0))
        meta = chunk["meta_info"]
        out: list[dict[str, Any]] = []
        first = i not in self.sent_chars
        if first and self.chat:
            out.append(self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}]))  # fmt: skip
        text = chunk["text"]
        prev = self.sent_chars.get(i, 0)
        delta = text[prev:] if len(text) > prev else ""
        self.sent_chars[i] = max(prev, len(text))
        lp_start = self.sent_tokens.get(i, 0)
        self.sent_tokens[i] = len(chunk.get("output_ids", []))
        lp = None
        if self.logprobs:
            if self.chat:
                lp = chat_logprobs(meta, lp_start, self.tb)
            else:
                with_input = first and self.echo is not None
                if i not in self.offsets:
                    base = len(self.echo[i // self.n]) if self.echo is not None else 0
                    self.offsets[i] = CharOffsets(base)
                lp = completion_logprobs(meta, lp_start, self.offsets[i], self.tb, with_input)
        if first and self.echo is not None:
            delta = self.echo[i // self.n] + delta
        has_lp = lp is not None and bool(lp.get("content") or lp.get("tokens"))
        if delta or has_lp:
            body = {"delta": {"content": delta}} if self.chat else {"text": delta}
            out.append(self._chunk([{"index": i, **body, "logprobs": lp, "finish_reason": None}]))
        reason = finish_reason(meta)
        if reason is not None:
            self.finals[i] = meta
            body = {"delta": {}} if self.chat else {"text": ""}
            out.append(self._chunk([{"index": i, **body, "logprobs": None, "finish_reason": reason,
                                     "matched_stop": matched_stop(meta)}]))  # fmt: skip
        return out

    def tail(self) -> list[dict[str, Any]]:
        """The usage chunk (`stream_options.include_usage`): empty choices, usage of all."""
        if not self.include_usage or len(self.finals) != self.total:
            return []
        metas = [self.finals[i] for i in range(self.total)]
        return [self._chunk([], usage(metas, self.n))]
