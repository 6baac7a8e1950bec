"""`RuntimeEndpoint`: run programs against a server that speaks SGLang's native HTTP protocol.

`radixlm serve` and SGLang's own server both work: the requests are SGLang's (`POST /generate`,
non-streaming and SSE streaming, `GET /get_model_info`, `GET /get_server_info`,
`POST /flush_cache`, `Authorization: Bearer <api_key>`), and all the backend logic (payloads,
cumulative streaming, batched `select` by input-token logprobs) is `NativeBackend`'s: this class
is only the HTTP transport, the chat template, and the mapping of HTTP errors to typed exceptions.

Chat template: taken from `/get_model_info`'s `chat_template` (radixlm's server reports the
tokenizer's Jinja template, `bos_token` and `eos_token`), so roles render exactly as on the
in-process Engine. A server that does not report one (SGLang's) gets the plain template with a
warning; `chat_template=` (a `ChatTemplate` or a Jinja string) overrides both.

Ownership: the backend owns its `httpx.Client` (closed by `shutdown()`); the server is never
started or stopped by it. Threading: `httpx.Client` is thread-safe and pools connections, so one
backend serves every executor thread of `run_batch` at once; nothing else here is mutable.
"""

from __future__ import annotations

import json
import ssl
import warnings
from collections.abc import Iterator
from typing import Any

import httpx

from radixlm.interpreter.native import NativeBackend, Payload, Response
from radixlm.lang.chat_template import PLAIN_TEMPLATE, ChatTemplate, from_jinja
from radixlm.lang.errors import ChatTemplateError, LangError


class EndpointError(LangError, RuntimeError):
    """The server answered with an error (or could not be reached).

    `status` is the HTTP status (None when there was no answer); `message`, `param` and `code`
    come from the `{"error": {...}}` body that radixlm's (and OpenAI-style) servers send.
    """

    def __init__(
        self,
        message: str,
        status: int | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message if status is None else f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.param = param
        self.code = code


class EndpointRequestError(EndpointError, ValueError):
    """The server rejected the request as invalid (HTTP 400/413/422): a bad argument."""


class EndpointAuthError(EndpointError, PermissionError):
    """The server refused the API key (HTTP 401/403): pass `api_key=` (the server's `--api-key`)."""


class EndpointConnectionError(EndpointError, ConnectionError):
    """The server could not be reached, or the connection broke mid-response."""


def _error_class(status: int) -> type[EndpointError]:
    if status in (401, 403):
        return EndpointAuthError
    if status in (400, 413, 422):
        return EndpointRequestError
    return EndpointError


def _error_from_body(status: int, body: Any, fallback: str) -> EndpointError:
    """Build the typed error from an error body: `{"error": {...}}`, `{"message": ...}` or text."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        message, param, code = err.get("message"), err.get("param"), err.get("code")
    else:
        message = body.get("message") if isinstance(body, dict) else None
        message = message or (err if isinstance(err, str) else None)
        param = code = None
    return _error_class(status)(str(message or fallback), status, param, code)


def _raise_for_status(resp: httpx.Response) -> None:
    if resp.status_code == 200:
        return
    resp.read()
    try:
        body: Any = resp.json()
    except ValueError:
        body = None
    raise _error_from_body(resp.status_code, body, resp.text.strip() or resp.reason_phrase)


def template_from_model_info(
    info: dict[str, Any], override: ChatTemplate | str | None = None
) -> ChatTemplate:
    """The chat template for a server whose `/get_model_info` answered `info`.

    Order: `override` (a `ChatTemplate`, or a Jinja template string), then the server's reported
    Jinja `chat_template`, else `PLAIN_TEMPLATE` with a warning.
    """
    if isinstance(override, ChatTemplate):
        return override
    name = str(info.get("model_path") or "server")
    # NOTE: bos_token "" as in `from_tokenizer`: the server's tokenizer adds BOS itself.
    eos = str(info.get("eos_token") or "")
    if isinstance(override, str):
        return from_jinja(override, bos_token="", eos_token=eos, name=name)
    source = info.get("chat_template")
    if isinstance(source, dict):
        source = source.get("default")
    if not source:
        warnings.warn(
            f"the server of {name!r} does not report a chat template (SGLang's server does not); "
            "rendering roles with the plain template: pass chat_template=... to set it",
            stacklevel=3,
        )
        return PLAIN_TEMPLATE
    try:
        return from_jinja(str(source), bos_token="", eos_token=eos, name=name)
    except ChatTemplateError as e:
        warnings.warn(f"{e}; using the plain chat template instead", stacklevel=3)
        return PLAIN_TEMPLATE


class RuntimeEndpoint(NativeBackend):
    """A backend over HTTP: `RuntimeEndpoint("http://127.0.0.1:30000", api_key=None)`.

    `verify`: TLS verification (a bool, or a CA bundle path, as SGLang's `verify`).
    `timeout`: seconds to wait for a response (None: forever); connecting waits at most 30 s.
    Connects at construction (reads `/get_model_info`); raises `EndpointError` if that fails.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: bool | str | None = None,
        chat_template: ChatTemplate | str | None = None,
        timeout: float | None = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        tls: bool | ssl.SSLContext = (
            ssl.create_default_context(cafile=verify)
            if isinstance(verify, str)
            else verify is not False
        )
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            verify=tls,
            timeout=httpx.Timeout(timeout, connect=min(timeout or 30.0, 30.0)),
            # NOTE: run_batch may run ~100 executor threads; let each hold a connection.
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        try:
            self.model_info: dict[str, Any] = self._call("GET", "/get_model_info")
        except BaseException:
            self._client.close()
            raise
        self._chat_template = template_from_model_info(self.model_info, chat_template)

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.base_url!r})"

    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat_template

    def get_model_name(self) -> str:
        return str(self.model_info["model_path"])

    # ---- transport -----------------------------------------------------------------------------

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        """One non-streaming request; the JSON answer (or the text, for a non-JSON answer)."""
        try:
            resp = self._client.request(method, path, json=payload)
        except httpx.TransportError as e:
            raise EndpointConnectionError(f"{method} {self.base_url}{path} failed: {e}") from e
        _raise_for_status(resp)
        try:
            return resp.json()
        except ValueError:
            return resp.text

    def _request(self, payload: Payload) -> Response | list[Response]:
        return self._call("POST", "/generate", payload)

    def _request_stream(self, payload: Payload) -> Iterator[Response]:
        """POST with `stream: true`; parse SSE `data: {...}` events up to `data: [DONE]`.

        Closing this generator early closes the connection, which makes the server abort the
        request (it stops generating for a reader that went away).
        """
        try:
            with self._client.stream("POST", "/generate", json=payload) as resp:
                _raise_for_status(resp)
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, SSE comments
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if isinstance(event, dict) and "error" in event:
                        # NOTE: the status line (200) was sent before the failure.
                        raise _error_from_body(500, event, "the stream failed")
                    yield event
        except httpx.TransportError as e:
            raise EndpointConnectionError(f"streaming from {self.base_url} failed: {e}") from e

    # ---- server operations -----------------------------------------------------------------

    def flush_cache(self) -> bool:
        """Drop the server's prefix cache. A server busy with requests refuses: False and a
        warning."""
        try:
            self._call("POST", "/flush_cache", {"empty_cache": True})
        except EndpointRequestError as e:  # 400: requests are running (SGLang's answer too)
            warnings.warn(f"cache not flushed: {e.message}", stacklevel=3)
            return False
        return True

    def abort_request(self, rid: str) -> None:
        self._call("POST", "/abort_request", {"rid": rid})

    def get_server_info(self) -> dict[str, Any]:
        return self._call("GET", "/get_server_info")

    def shutdown(self) -> None:
        """Close the connections (the server keeps running)."""
        self._client.close()
