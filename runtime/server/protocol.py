"""Request bodies of SGLang's native endpoints (`/generate`, `/abort_request`, `/flush_cache`).

Field names, types and defaults are SGLang's (`GenerateReqInput`), so SGLang clients and its
`RuntimeEndpoint` work unchanged. Unknown fields are rejected (400 naming the field); SGLang fields
radixlm does not implement (images, LoRA, sessions, ...) are accepted only when unset, so a client
that sends them as `null` still works. `sampling_params` stays a plain dict here: its keys are
validated by `SamplingParams.from_dict`, which names the offending key.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.server.sglang_fields import split_sglang_fields

# SGLang request fields that radixlm does not implement: accepted only when null / false.
UNSUPPORTED_GENERATE_FIELDS = (
    "image_data",
    "video_data",
    "audio_data",
    "input_embeds",
    "lora_path",
    "lora_id",
    "custom_logit_processor",
    "session_params",
    "token_ids_logprob",
    "return_hidden_states",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "data_parallel_rank",
)


class StrictModel(BaseModel):
    """Unknown fields are errors; no silent coercion of strings into numbers or booleans."""

    model_config = ConfigDict(extra="forbid", strict=True)


class GenerateRequest(StrictModel):
    """`POST /generate`: one prompt or a batch (lists); per-prompt fields may be lists too."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    # Accepted and ignored (scheduling / logging hints).
    log_metrics: bool = True
    priority: int | None = None
    modalities: list[str] | None = None
    # Unsupported: must stay unset.
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    input_embeds: Any = None
    lora_path: Any = None
    lora_id: Any = None
    custom_logit_processor: Any = None
    session_params: Any = None
    token_ids_logprob: Any = None
    return_hidden_states: bool = False
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    data_parallel_rank: Any = None
    # SGLang's other fields (sglang_fields.py): hints dropped, features rejected when set.
    _sglang_rejected: tuple[str, str] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _sglang_fields(cls, data: Any, handler: Any) -> Any:
        data, rejected = split_sglang_fields(data)
        model = handler(data)
        model._sglang_rejected = rejected
        return model

    def check(self) -> None:
        """Cross-field rules. NOTE: outside pydantic validators on purpose: pydantic would wrap
        InvalidRequestError (a ValueError) into a ValidationError and lose the field name."""
        if self._sglang_rejected is not None:
            name, message = self._sglang_rejected
            raise InvalidRequestError(message, name)
        for name in UNSUPPORTED_GENERATE_FIELDS:
            if getattr(self, name) not in (None, False):
                raise InvalidRequestError(f"{name} is not supported by radixlm", name)
        if self.text is None and self.input_ids is None:
            raise InvalidRequestError("one of text or input_ids is required", "text")
        if self.text is not None and self.input_ids is not None:
            raise InvalidRequestError("pass either text or input_ids, not both", "input_ids")


class AbortRequest(StrictModel):
    """`POST /abort_request`: abort one request by id, or all of them."""

    rid: str = ""
    abort_all: bool = False


class FlushCacheRequest(StrictModel):
    """`POST /flush_cache` (the body is optional; SGLang's client sends `empty_cache`)."""

    empty_cache: bool = True
