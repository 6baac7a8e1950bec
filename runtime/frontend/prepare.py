"""The front door's one validation: a `GenerateInput` (user values, from `Engine.generate` or an
HTTP body, expanded by request_batch.py) becomes a `PreparedReq`, once.

    prepare_request(req, limits, tokenizer):
        sampling params (`SamplingParams.from_dict`, typed for the wire) and their constraint's
        syntax -> the prompt's ids (tokenized here, once) -> lengths against the scheduler's
        context and KV pool -> logprob options -> `io.GenerateReq`, the typed message that
        crosses to the scheduler, which does not validate again.

Errors are typed (`InvalidRequestError` naming the field; `RequestTooLongError` for the length
guard): the Engine raises them, the server answers 4xx JSON. Pure functions: the
`TokenizerManager` calls them on its loop with its `RequestLimits`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

from radixlm.runtime.constrained.llguidance_specs import check_sampling_params_llguidance
from radixlm.runtime.constrained.patterns import check_sampling_params
from radixlm.runtime.constrained.regex_guard import check_regex_size, check_schema_patterns
from radixlm.runtime.errors import InvalidRequestError, RequestTooLongError
from radixlm.runtime.processes import io
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.server_args import ServerArgs


@dataclass(frozen=True)
class GenerateInput:
    """One normalised single request (batches and n > 1 are expanded before this)."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    rid: str | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False


class PreparedReq(NamedTuple):
    """A request validated and tokenized once: the message for the scheduler (its rid set) and
    the front end's own option. Built by `prepare_request`, run by `TokenizerManager.submit`."""

    msg: io.GenerateReq
    return_text_in_logprobs: bool = False


@dataclass(frozen=True)
class RequestLimits:
    """What a request is checked against: the scheduler's figures (from its start-up info) and
    the server's constraint settings."""

    vocab_size: int
    context_len: int
    max_total_tokens: int  # the KV pool's size
    grammar_backend: str
    whitespace_pattern: str | None

    @classmethod
    def of(
        cls, args: ServerArgs, vocab_size: int, context_len: int, max_total_tokens: int
    ) -> RequestLimits:
        return cls(vocab_size, context_len, max_total_tokens, args.grammar_backend,
                   args.constrained_json_whitespace_pattern)  # fmt: skip


def prepare_request(req: GenerateInput, limits: RequestLimits, tokenizer: Any) -> PreparedReq:
    """Validate and tokenize `req` (the only place a request is validated); raises a typed
    `InvalidRequestError` naming the problem (RequestTooLongError for the length guard).
    `tokenizer`: None without one (`skip_tokenizer_init`)."""
    sp = SamplingParams.from_dict(req.sampling_params, limits.vocab_size)
    # Constraints (regex / JSON schema / choices) fail here, before anything is sent.
    if limits.grammar_backend == "llguidance":
        check_sampling_params_llguidance(sp, limits.whitespace_pattern)
    else:
        check_sampling_params(sp, limits.whitespace_pattern)
        # NOTE: after the syntax checks; bounds the automaton (regex_guard)
        if sp.regex:
            check_regex_size(sp.regex)
        if sp.json_schema:
            check_schema_patterns(sp.json_schema)
    if req.input_ids is not None:
        ids = req.input_ids
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise InvalidRequestError("input_ids must be a list of integers", "input_ids")
        if any(not 0 <= t < limits.vocab_size for t in ids):
            raise InvalidRequestError(
                f"input_ids must be within [0, {limits.vocab_size})", "input_ids"
            )
    elif req.text is not None:
        if not isinstance(req.text, str):
            raise InvalidRequestError("text must be a string", "text")
        if tokenizer is None:
            raise InvalidRequestError("text prompts need a tokenizer (skip_tokenizer_init)", "text")
        ids = tokenizer.encode(req.text)
    else:
        raise InvalidRequestError("one of text or input_ids is required", "text")
    if not ids:
        raise InvalidRequestError(
            "the prompt is empty", "text" if req.input_ids is None else "input_ids"
        )
    check_length(
        len(ids), sp.max_new_tokens, "text" if req.input_ids is None else "input_ids", limits
    )
    if sp.stop and tokenizer is None:
        raise InvalidRequestError("stop strings need a tokenizer (skip_tokenizer_init)", "stop")
    if sp.stop_regex and tokenizer is None:
        raise InvalidRequestError(
            "stop_regex needs a tokenizer (skip_tokenizer_init)", "stop_regex"
        )
    lsl = req.logprob_start_len
    if lsl is not None and (not isinstance(lsl, int) or lsl < -1 or lsl >= len(ids)):
        raise InvalidRequestError(
            f"logprob_start_len must be in [-1, {len(ids) - 1}] for this prompt",
            "logprob_start_len",
        )
    top = req.top_logprobs_num
    if not isinstance(top, int) or not 0 <= top <= 64:
        raise InvalidRequestError("top_logprobs_num must be in [0, 64]", "top_logprobs_num")
    if req.return_logprob and lsl is None:
        lsl = len(ids) - 1  # SGLang's default: no input logprobs beyond the last position
    msg = io.GenerateReq(
        rid=req.rid or uuid.uuid4().hex,
        input_ids=ids,
        sampling_params=sp,
        return_logprob=bool(req.return_logprob),
        # NOTE: int()/bool(): the wire types are strict (a True passes the checks above)
        logprob_start_len=int(lsl) if req.return_logprob else -1,  # type: ignore[arg-type]
        top_logprobs_num=int(top) if req.return_logprob else 0,
        stream=bool(req.stream),
    )
    return PreparedReq(msg, req.return_text_in_logprobs)


def check_length(
    prompt_len: int, max_new_tokens: int, prompt_field: str, limits: RequestLimits
) -> None:
    """The length guard: prompt + max_new_tokens must fit the context length and the KV pool
    (`max_total_tokens` is the pool size, as in SGLang). Raises RequestTooLongError naming
    the limit that is exceeded (HTTP 400, code context_length_exceeded)."""
    total = prompt_len + max_new_tokens
    bounds = (
        (limits.context_len, "the context length limit", "context_length"),
        (limits.max_total_tokens, "the KV pool limit", "max_total_tokens"),
    )
    for limit, what, flag in bounds:
        if total > limit:
            raise RequestTooLongError(
                f"the prompt has {prompt_len} tokens and max_new_tokens is {max_new_tokens}: "
                f"together ({total}) they exceed {what} of {limit} tokens ({flag})",
                "max_new_tokens" if prompt_len < limit else prompt_field,
            )
