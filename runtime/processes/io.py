"""Messages between the processes (tokenizer manager <-> scheduler <-> detokenizer).

Every message is a small typed msgspec Struct sent as msgpack over ZMQ; nothing is pickled.
Data flow:
    TokenizerManager --GenerateReq/AbortReq/control--> Scheduler
    Scheduler --BatchTokenOut--> Detokenizer --BatchTextOut--> TokenizerManager
    Scheduler --ControlResp--> TokenizerManager (replies to control requests)
"""

from __future__ import annotations

from typing import Any

import msgspec

from radixlm.runtime.sampling.sampling_params import SamplingParams


class GenerateReq(msgspec.Struct, tag=True):
    """A request validated and tokenized once, by the tokenizer manager (`prepare`); decoding
    checks its types, and the scheduler trusts its values (it does not validate again)."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams  # validated (SamplingParams.from_dict)
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no input logprobs
    top_logprobs_num: int = 0
    stream: bool = False
    arrival_time: float = 0.0


class AbortReq(msgspec.Struct, tag=True):
    rid: str  # "" aborts every request


class ControlReq(msgspec.Struct, tag=True):
    """A request answered by one ControlResp: `flush_cache`, `get_info`, `check_invariants`."""

    kind: str
    token: int  # echoed in the response


class ControlResp(msgspec.Struct, tag=True):
    token: int
    ok: bool
    data: dict[str, Any] = {}
    error: str = ""


class ReqOut(msgspec.Struct, array_like=True):
    """One request's progress in one scheduler step (token deltas since its last message)."""

    rid: str
    new_ids: list[int]
    finished: bool
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # Per new token; present only with return_logprob. Input logprobs come once, on the first
    # message of a request (possibly spread over several with chunked prefill).
    output_logprobs: list[float] | None = None
    output_top: list[list[Any]] | None = None  # per token: [[logprob, token_id], ...]
    input_logprobs: list[Any] | None = None  # [logprob|None, ...] aligned with input_ids
    input_ids: list[int] | None = None
    input_top: list[Any] | None = None
    # Detokenizer settings, sent on the first message of the request only.
    stop: list[str] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    # Speculative decoding (None: off): decode steps so far and the tokens they committed.
    spec_verify_ct: int | None = None
    spec_committed: int | None = None


class BatchTokenOut(msgspec.Struct, tag=True):
    outs: list[ReqOut]


class TextOut(msgspec.Struct, array_like=True):
    rid: str
    text_delta: str
    new_ids: list[int]
    out: ReqOut  # the scheduler's record (token ids, logprobs, counts, finish reason)


class BatchTextOut(msgspec.Struct, tag=True):
    outs: list[TextOut]


class SchedulerDied(msgspec.Struct, tag=True):
    """Sent by the scheduler's crash handler before it exits."""

    error: str


ToScheduler = GenerateReq | AbortReq | ControlReq
FromScheduler = BatchTokenOut | ControlResp | SchedulerDied
ToTokenizer = BatchTextOut | ControlResp | SchedulerDied

_encoder = msgspec.msgpack.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decoder(kind: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(kind)
