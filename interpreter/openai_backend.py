"""`OpenAI`: run chat programs on an OpenAI-compatible chat completions API (SGLang's `sgl.OpenAI`).

The interpreter hands a backend the rendered text of the state, so this backend renders roles with
its own template of unambiguous ChatML markers (`CHAT_TEMPLATE`) and parses the text back into
OpenAI messages (`parse_messages`). A `gen` must come right at the start of an assistant message:
`s += rl.assistant(rl.gen(...))`, or `rl.assistant_begin()` then a `gen`; it becomes one
`chat.completions.create(messages=...)` call (streamed when the run streams).

Mapped: `max_tokens`, `stop`, `temperature`, `top_p`, `frequency_penalty`, `presence_penalty`,
`json_schema` (-> `response_format={"type": "json_schema", ...}`), `return_logprob` /
`top_logprobs_num` (output-token logprobs), and the backend's `seed`. What the chat API cannot do
raises `UnsupportedFeatureError` naming it (see `_unsupported`): `select` (it needs input-token
logprobs), `regex` and `dtype`, `min_tokens`, `stop_token_ids`, `ignore_eos`, `top_k`, `min_p`,
input-token logprobs, and generating anywhere but at the start of an assistant message.

Ownership: the backend owns its `openai.OpenAI` client (closed by `shutdown()`). Threading: the
client is thread-safe; every call builds its own request from its arguments.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from radixlm.interpreter.backend import Backend, MetaInfo
from radixlm.lang.chat_template import ROLES, ChatTemplate
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.lang.errors import UnsupportedFeatureError
from radixlm.lang.sampling import SamplingParams

_BEGIN, _END = "<|im_start|>", "<|im_end|>\n"
# NOTE: no default system prompt and no stop strings: the API applies the model's own template
# and ends the turn itself; these markers never reach the model.
CHAT_TEMPLATE = ChatTemplate(
    name="openai-chat",
    role_prefix_and_suffix={role: (f"{_BEGIN}{role}\n", _END) for role in ROLES},
)
_MESSAGE = re.compile(re.escape(_BEGIN) + r"(system|user|assistant)\n(.*?)" + re.escape(_END), re.S)
_OPEN = re.compile(re.escape(_BEGIN) + r"(system|user|assistant)\n")
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_messages(text: str) -> list[dict[str, str]]:
    """The messages rendered in `text` (by `CHAT_TEMPLATE`), which must end with an open,
    still empty assistant message (where the generation goes).

    Raises `UnsupportedFeatureError` for text outside messages and for a generation anywhere
    but at the start of an assistant message.
    """
    messages: list[dict[str, str]] = []
    pos = 0
    while True:
        gap_end = text.find(_BEGIN, pos)
        gap = text[pos:] if gap_end < 0 else text[pos:gap_end]
        if gap.strip():
            raise UnsupportedFeatureError(
                f"the OpenAI chat backend sends only system/user/assistant messages; the program "
                f"has text outside any message ({gap.strip()[:40]!r}): put it inside rl.user(...)"
            )
        if gap_end < 0:
            break
        pos = gap_end
        m = _MESSAGE.match(text, pos)
        if m is None:
            break
        messages.append({"role": m.group(1), "content": m.group(2)})
        pos = m.end()
    tail = text[pos:]
    opened = _OPEN.match(tail)
    if opened is None or opened.group(1) != "assistant":
        where = f"inside a {opened.group(1)} message" if opened else "outside any message"
        raise UnsupportedFeatureError(
            f"the OpenAI chat backend can generate only as the assistant's reply, and this gen() "
            f"is {where}: write s += rl.assistant(rl.gen(...))"
        )
    if tail[opened.end() :]:
        raise UnsupportedFeatureError(
            "the OpenAI chat backend cannot generate in the middle of a turn (the assistant "
            f"message already holds {tail[opened.end() :][:40]!r}): the chat API only starts a "
            "new assistant message; put the gen() first in rl.assistant(...)"
        )
    return messages


def _unsupported(params: SamplingParams) -> str | None:
    """The first sampling feature the chat API lacks, described; None if all is supported."""
    p = params
    checks = [
        (p.regex is not None, "regex= (regex-constrained decoding)"),
        (p.ebnf is not None, "ebnf= (grammar-constrained decoding)"),
        (p.dtype is not None, f"dtype={p.dtype} / gen_{p.dtype} (a regex-constrained decode)"),
        (bool(p.min_new_tokens), "min_tokens="),
        (bool(p.stop_token_ids), "stop_token_ids="),
        (bool(p.ignore_eos), "ignore_eos=True"),
        (p.top_k not in (None, -1, 0), "top_k="),
        (p.min_p not in (None, 0.0), "min_p="),
        (p.logprob_start_len is not None, "logprob_start_len= (input-token logprobs)"),
    ]
    return next((what for bad, what in checks if bad), None)


def _response_format(schema: str) -> dict[str, Any]:
    parsed = json.loads(schema)
    title = parsed.get("title") if isinstance(parsed, dict) else None
    name = title if isinstance(title, str) and _SCHEMA_NAME.fullmatch(title) else "response"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": parsed}}


def _finish_reason(reason: str | None, matched: Any, completion_tokens: int) -> dict[str, Any]:
    """OpenAI's finish_reason as SGLang's meta_info shape."""
    if reason == "length":
        return {"type": "length", "length": completion_tokens}
    out: dict[str, Any] = {"type": reason or "stop"}
    if reason == "stop":
        out["matched"] = matched
    return out


def _logprob_meta(logprobs: Any, top_n: int | None) -> dict[str, Any]:
    """Output-token logprobs in SGLang's `[logprob, token_id, text]` entries (ids unknown: None)."""
    content = getattr(logprobs, "content", None) or []
    meta: dict[str, Any] = {
        "output_token_logprobs": [[t.logprob, None, t.token] for t in content],
    }
    if top_n:
        meta["output_top_logprobs"] = [
            [[a.logprob, None, a.token] for a in (t.top_logprobs or [])] for t in content
        ]
    return meta


class OpenAI(Backend):
    """`OpenAI(model, base_url=None, api_key=None, *, seed=None, extra_body=None, **client_kwargs)`.

    `client_kwargs` go to `openai.OpenAI` (`timeout`, `max_retries`, `default_headers`, ...);
    `extra_body` is merged into every request (server-specific fields). With a `base_url` and no
    key anywhere (argument or `OPENAI_API_KEY`), the key is "EMPTY", as local servers expect.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        seed: int | None = None,
        extra_body: dict[str, Any] | None = None,
        **client_kwargs: Any,
    ) -> None:
        import openai

        if api_key is None and base_url is not None and not os.environ.get("OPENAI_API_KEY"):
            api_key = "EMPTY"
        self.model = model
        self.seed = seed
        self.extra_body = dict(extra_body or {})
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, **client_kwargs)

    def __repr__(self) -> str:
        return f"OpenAI(model={self.model!r}, base_url={str(self.client.base_url)!r})"

    @property
    def chat_template(self) -> ChatTemplate:
        return CHAT_TEMPLATE

    def _create_kwargs(self, text: str, params: SamplingParams) -> dict[str, Any]:
        feature = _unsupported(params)
        if feature is not None:
            raise UnsupportedFeatureError(
                f"the OpenAI chat backend cannot run gen(..., {feature}): the chat completions "
                "API has no such option; use rl.RuntimeEndpoint or rl.Engine for it"
            )
        kwargs: dict[str, Any] = {"model": self.model, "messages": parse_messages(text)}
        for name, value in (
            ("max_tokens", params.max_new_tokens),
            ("temperature", params.temperature),
            ("top_p", params.top_p),
            ("frequency_penalty", params.frequency_penalty),
            ("presence_penalty", params.presence_penalty),
            ("seed", self.seed),
        ):
            if value is not None:
                kwargs[name] = value
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.json_schema is not None:
            kwargs["response_format"] = _response_format(params.json_schema)
        if params.return_logprob:
            kwargs["logprobs"] = True
            if params.top_logprobs_num:
                kwargs["top_logprobs"] = params.top_logprobs_num
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    def generate(self, text: str, params: SamplingParams) -> tuple[str, MetaInfo]:
        resp = self.client.chat.completions.create(**self._create_kwargs(text, params))
        choice = resp.choices[0]
        usage = resp.usage
        completion = usage.completion_tokens if usage else 0
        meta: MetaInfo = {
            "id": resp.id,
            **_usage_meta(usage),
            "finish_reason": _finish_reason(
                choice.finish_reason, (choice.model_extra or {}).get("matched_stop"), completion
            ),
        }
        if params.return_logprob:
            meta.update(_logprob_meta(choice.logprobs, params.top_logprobs_num))
        return choice.message.content or "", meta

    def generate_stream(self, text: str, params: SamplingParams) -> Iterator[tuple[str, MetaInfo]]:
        kwargs = self._create_kwargs(text, params)
        # NOTE: `with`: a reader that stops early closes the HTTP stream (the server aborts).
        with self.client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        ) as stream:
            meta: MetaInfo = {"completion_tokens": 0}
            reason, matched, pieces = None, None, 0
            for chunk in stream:
                meta["id"] = chunk.id
                if chunk.usage is not None:
                    meta.update(_usage_meta(chunk.usage))
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                if choice.finish_reason is not None:
                    reason = choice.finish_reason
                    matched = (choice.model_extra or {}).get("matched_stop")
                delta = choice.delta.content or ""
                if delta:
                    pieces += 1
                    yield delta, {**meta, "completion_tokens": pieces}
        meta["completion_tokens"] = completion = int(meta.get("completion_tokens") or pieces)
        meta["finish_reason"] = _finish_reason(reason, matched, completion)
        yield "", meta

    def select(
        self,
        text: str,
        choices: Sequence[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        raise UnsupportedFeatureError(
            "the OpenAI chat backend cannot run select() (or gen(choices=...)): choices are "
            "scored with input-token log-probabilities, which the chat completions API does not "
            "return; use rl.RuntimeEndpoint or rl.Engine, or gen() with a json_schema enum"
        )

    def get_server_info(self) -> dict[str, Any]:
        return {"model": self.model, "base_url": str(self.client.base_url)}

    def shutdown(self) -> None:
        self.client.close()


def _usage_meta(usage: Any) -> dict[str, Any]:
    if usage is None:
        return {}
    details = getattr(usage, "prompt_tokens_details", None)
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": (getattr(details, "cached_tokens", None) or 0) if details else 0,
    }
