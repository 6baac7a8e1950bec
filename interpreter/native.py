"""`NativeBackend`: a backend that speaks SGLang's native `/generate` protocol.

Subclasses only say how one request travels (`_request`, `_request_stream`): the in-process
Engine calls `engine.generate(...)`; `RuntimeEndpoint` POSTs the same payload to a server. The
payload is SGLang's: `{"text" | "input_ids", "sampling_params", "return_logprob",
"logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "stream"}`; a response is
`{"text", "meta_info"}` (a list of them for a batch), streaming responses carry the cumulative text.

Threading: see `backend.py`; the only mutable state is `token_usage` (a locked counter).
"""

from __future__ import annotations

import contextlib
import threading
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from radixlm.interpreter.backend import Backend, MetaInfo
from radixlm.interpreter.cancel import current_scope
from radixlm.interpreter.logprob_select import select_by_logprobs
from radixlm.interpreter.token_usage import TokenUsage
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.lang.sampling import SamplingParams

Payload = dict[str, Any]
Response = dict[str, Any]


class NativeBackend(Backend):
    """Backend logic over SGLang's native protocol; subclasses provide the transport."""

    _usage_lock = threading.Lock()

    @property
    def token_usage(self) -> TokenUsage:
        """SGLang's `backend.token_usage`: prompt and completion tokens of the `gen` calls."""
        usage = self.__dict__.get("_token_usage")
        if usage is None:
            with self._usage_lock:
                usage = self.__dict__.setdefault("_token_usage", TokenUsage())
        return usage

    @abstractmethod
    def _request(self, payload: Payload) -> Response | list[Response]:
        """Send one `/generate` request (non-streaming); a batch payload returns a list."""

    @abstractmethod
    def _request_stream(self, payload: Payload) -> Iterator[Response]:
        """Send one streaming request; yield responses with the cumulative text so far."""

    def _tokenize(self, text: str) -> list[int] | None:
        """The prompt token ids the runtime would use for `text`, when known locally."""
        return None

    @staticmethod
    def _payload(text: str, params: SamplingParams) -> Payload:
        sampling, extra = params.to_native()
        return {"text": text, "sampling_params": sampling, **extra}

    @contextlib.contextmanager
    def _scoped(self, payload: Payload) -> Iterator[Payload]:
        """Tag the request with a rid of the current `RequestScope` (cancel.py), if any, so that
        Ctrl-C in `run` / `run_batch` can abort it."""
        scope = current_scope()
        if scope is None:
            yield payload
            return
        rid = scope.begin(self)
        try:
            yield {**payload, "rid": rid}
        finally:
            scope.end(rid)

    def generate(self, text: str, params: SamplingParams) -> tuple[str, MetaInfo]:
        with self._scoped(self._payload(text, params)) as payload:
            out = self._request(payload)
        assert isinstance(out, dict)
        self.token_usage.add(out["meta_info"])
        return out["text"], out["meta_info"]

    def generate_stream(self, text: str, params: SamplingParams) -> Iterator[tuple[str, MetaInfo]]:
        with self._scoped({**self._payload(text, params), "stream": True}) as payload:
            emitted, meta = "", None
            for chunk in self._request_stream(payload):
                full = chunk["text"]
                # NOTE: cumulative text only grows; anything else would mean the runtime retracted
                # text it already streamed, which the interpreter cannot un-append.
                if full.startswith(emitted):
                    delta, emitted = full[len(emitted) :], full
                else:
                    delta = ""
                meta = chunk["meta_info"]
                yield delta, meta
        self.token_usage.add(meta)

    def select(
        self,
        text: str,
        choices: Sequence[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        return select_by_logprobs(
            self._request, self._tokenize, text, choices, temperature, choices_method
        )

    def cache_prefix(self, text: str) -> None:
        if text:
            self._request({"text": text, "sampling_params": {"max_new_tokens": 0}})
