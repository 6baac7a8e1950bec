"""Typed exceptions of the runtime. Each names the offending field or limit in its message."""

from __future__ import annotations


class RadixLMError(Exception):
    """Base class of radixlm's own errors."""


class InvalidRequestError(RadixLMError, ValueError):
    """A request argument is invalid (HTTP 400). `field` names it when known."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class RequestTooLongError(InvalidRequestError):
    """Prompt (plus max_new_tokens) exceeds the context length or the KV pool (HTTP 400)."""


class GrammarError(InvalidRequestError):
    """A regex / JSON schema / choice list cannot be compiled (HTTP 400)."""


class QueueFullError(RadixLMError):
    """Too many queued requests (HTTP 429)."""


class QueueTimeoutError(QueueFullError):
    """The request waited in the scheduler's queue longer than `queue_timeout` before it started,
    and was dropped without running (HTTP 429: load shedding, retry later)."""


class RequestAbortedError(RadixLMError):
    """The request was aborted (by the client, a timeout, or shutdown)."""


class RequestTimeoutError(RequestAbortedError):
    """The request ran longer than `request_timeout` and was aborted."""


class EngineDeadError(RadixLMError):
    """The scheduler process died; the engine cannot serve any more requests (HTTP 503)."""
