"""HTTP errors: runtime exceptions and validation failures -> status code + one JSON shape.

Every error body, on every endpoint, is OpenAI's shape (SGLang's native endpoints use the same
`{"error": {"message": ...}}` envelope):

    {"error": {"message": "temperature must be in [0.0, 100.0], got -1.0",
               "type": "invalid_request_error", "param": "temperature", "code": null}}

Status codes: 400 invalid request, 401 missing/wrong API key, 404 unknown route, 413 body too
large, 429 load shedding (queue full, or queued longer than queue_timeout; with Retry-After), 503
engine dead / draining, 504 request timeout, 500 a bug (logged with its traceback).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from radixlm.runtime.errors import (
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    QueueTimeoutError,
    RequestAbortedError,
    RequestTimeoutError,
    RequestTooLongError,
)

logger = logging.getLogger(__name__)

RETRY_AFTER_S = "1"  # the Retry-After of load-shedding answers (429)
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}
# Pydantic puts the branch of a union into `loc` ("str", "list[int]", "ResponseFormat", ...).
_UNION_TAG = re.compile(r"^([A-Z]\w*|str|int|float|bool|none|function-\w+|\w+\[.*\])$")


class ApiError(Exception):
    """An error answered as `{"error": {...}}` with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    @property
    def type(self) -> str:
        return _TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )

    @property
    def reason(self) -> str:
        """The metrics label of this error: its code, else its type."""
        return self.code or self.type

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def to_api_error(exc: BaseException, rename: Mapping[str, str] | None = None) -> ApiError:
    """Map an exception to its HTTP error. `rename` maps engine field names to the API's (e.g.
    max_new_tokens -> max_tokens on /v1)."""
    rename = rename or {}
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValidationError):
        return validation_error(exc)
    if isinstance(exc, InvalidRequestError):
        field = rename.get(exc.field, exc.field) if exc.field else None
        code = "context_length_exceeded" if isinstance(exc, RequestTooLongError) else None
        return ApiError(400, str(exc), field, code)
    if isinstance(exc, QueueFullError):
        code = "queue_timeout" if isinstance(exc, QueueTimeoutError) else "queue_full"
        return ApiError(429, str(exc), code=code, headers={"Retry-After": RETRY_AFTER_S})
    if isinstance(exc, RequestTimeoutError):
        return ApiError(504, str(exc), code="request_timeout")
    if isinstance(exc, EngineDeadError):
        return ApiError(503, f"the engine is not available: {exc}", code="engine_dead")
    if isinstance(exc, RequestAbortedError):
        return ApiError(503, f"the request was aborted: {exc}", code="aborted")
    logger.error("internal error", exc_info=exc)
    return ApiError(
        500, f"internal server error: {type(exc).__name__}: {exc}", code="internal_error"
    )


def validation_error(exc: ValidationError) -> ApiError:
    """A readable 400 from pydantic's errors: the first few, each naming its field."""
    messages: list[str] = []
    params: list[str] = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err.get("loc", ()) if not _UNION_TAG.match(str(p))]
        param = ".".join(loc) or None
        kind = err.get("type", "")
        if kind == "json_invalid":
            text = f"invalid JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}"
        elif kind == "extra_forbidden":
            text = f"unknown field '{param}'"
        elif kind in ("model_type", "model_attributes_type", "dict_type") and not loc:
            text = "the request body must be a JSON object"
        elif kind == "missing":
            text = f"'{param}' is required"
        else:
            text = f"{param}: {err.get('msg')}" if param else str(err.get("msg"))
        if param in params and kind != "json_invalid":
            continue  # the other branches of a union: one message per field is enough
        params.append(param or "")
        messages.append(text)
        if len(messages) == 3:
            break
    return ApiError(
        400, "; ".join(messages) or "invalid request", params[0] or None if params else None
    )
