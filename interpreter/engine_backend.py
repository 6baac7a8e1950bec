"""`EngineBackend`: run programs on an in-process `radixlm.Engine`.

The native protocol's payload maps one to one onto `Engine.generate(...)` keyword arguments, so
this class is only the transport (`NativeBackend` has the logic) plus the chat template, derived
from the engine's tokenizer.

Ownership: an engine passed in stays the caller's (this backend never shuts it down); an engine
this backend created (`EngineBackend(model_path=...)`) is shut down by `shutdown()`.
Threading: `Engine.generate` is called from many executor threads at once; the engine is
responsible for being thread-safe (it batches concurrent requests).
"""

from __future__ import annotations

import copy
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from radixlm.interpreter.native import NativeBackend, Payload, Response
from radixlm.lang.chat_template import ChatTemplate, from_tokenizer

_REQUEST_KEYS = ("sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
                 "return_text_in_logprobs")  # fmt: skip

# One backend per engine, so `run(backend=engine)` does not re-derive the chat template each time.
_by_engine: weakref.WeakKeyDictionary[Any, EngineBackend] = weakref.WeakKeyDictionary()


class EngineBackend(NativeBackend):
    """The in-process engine as a backend: `EngineBackend(engine)` or `EngineBackend(**engine_args)`."""

    def __init__(self, engine: Any = None, **engine_args: Any) -> None:
        self._owns_engine = engine is None
        if engine is None:
            from radixlm.runtime.frontend.engine import Engine

            engine = Engine(**engine_args)
        elif engine_args:
            raise TypeError("pass either an engine or engine arguments, not both")
        self.engine = engine
        self._chat_template = from_tokenizer(engine.tokenizer)
        # NOTE: a private copy behind a lock: the engine's own thread encodes with its tokenizer,
        # and a Rust-backed tokenizer must not be entered from two threads at once.
        self._tokenizer = copy.deepcopy(engine.tokenizer) if engine.tokenizer is not None else None
        self._tokenizer_lock = threading.Lock()

    @classmethod
    def for_engine(cls, engine: Any) -> EngineBackend:
        """The shared backend of `engine` (created on first use)."""
        try:
            backend = _by_engine.get(engine)
        except TypeError:  # not weak-referenceable
            return cls(engine)
        if backend is None:
            backend = _by_engine.setdefault(engine, cls(engine))
        return backend

    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat_template

    @staticmethod
    def _kwargs(payload: Payload) -> dict[str, Any]:
        kwargs = {k: payload[k] for k in (*_REQUEST_KEYS, "rid") if k in payload}
        if "input_ids" in payload:
            kwargs["input_ids"] = payload["input_ids"]
        else:
            kwargs["prompt"] = payload["text"]
        return kwargs

    def _tokenize(self, text: str) -> list[int] | None:
        """The engine's prompt ids for `text` (it encodes with this tokenizer, the same way)."""
        if self._tokenizer is None:
            return None
        with self._tokenizer_lock:
            return list(self._tokenizer.encode(text))

    def _request(self, payload: Payload) -> Response | list[Response]:
        return self.engine.generate(**self._kwargs(payload))

    def _request_stream(self, payload: Payload) -> Iterator[Response]:
        yield from self.engine.generate(stream=True, **self._kwargs(payload))

    def abort_request(self, rid: str) -> None:
        self.engine.abort_request(rid)

    def flush_cache(self) -> bool:
        """Drop the engine's prefix cache; while requests run it refuses: False and a warning."""
        flushed = bool(self.engine.flush_cache())
        if not flushed:
            warnings.warn("cache not flushed: requests are running", stacklevel=3)
        return flushed

    def get_server_info(self) -> dict[str, Any]:
        return self.engine.get_server_info()

    def shutdown(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()
