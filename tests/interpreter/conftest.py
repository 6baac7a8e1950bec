"""Fixtures of the interpreter tests.

- `FakeBackend`: a tiny deterministic in-memory backend, ONLY for unit tests of the interpreter's
  own mechanics (ordering, forks, errors, streaming plumbing, HTML). Program-level tests use the
  real Engine (project rule: no mocks of our own runtime where the real one can run).
- `backend`: the backends programs are tested through: "engine" (an `EngineBackend` on the
  session's shared default Engine, `engine` from tests/conftest.py) and "endpoint"
  (`RuntimeEndpoint` over HTTP, with an API key, against `main_server`: the session's real
  `radixlm serve` subprocess, from tests/conftest.py). After each test through the endpoint the
  server must be idle with exact KV accounting, as the Engine is checked by tests/conftest.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from radixlm.interpreter.backend import Backend
from radixlm.lang.chat_template import ChatTemplate, from_jinja
from radixlm.lang.choices import ChoicesDecision
from radixlm.lang.sampling import SamplingParams

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


class FakeBackend(Backend):
    """Deterministic backend for interpreter-mechanics tests (see the module docstring).

    `reply(text, params)` gives each completion (default: "<n>" with n = number of generate calls
    so far); `select` picks `pick(choices)` (default: the last); `fail(text, params)` may raise;
    `before_chunk(i)` runs before streamed character i (a test's gate on an event, never a delay).
    Every call is recorded in `calls` as (method, text, detail).
    """

    def __init__(
        self,
        reply: Callable[[str, SamplingParams], str] | None = None,
        pick: Callable[[Sequence[str]], str] | None = None,
        fail: Callable[[str, SamplingParams], None] | None = None,
        before_chunk: Callable[[int], None] | None = None,
        template: ChatTemplate | None = None,
    ) -> None:
        self.reply = reply
        self.pick = pick or (lambda choices: choices[-1])
        self.fail = fail
        self.before_chunk = before_chunk
        self.calls: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        self._template = template or from_jinja(SMOLLM2_TEMPLATE, eos_token="<|im_end|>")

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    def _record(self, method: str, text: str, detail: Any) -> int:
        with self._lock:
            self.calls.append((method, text, detail))
            return sum(1 for c in self.calls if c[0] in ("generate", "generate_stream"))

    def generate(self, text: str, params: SamplingParams) -> tuple[str, dict[str, Any]]:
        n = self._record("generate", text, params)
        if self.fail is not None:
            self.fail(text, params)
        out = self.reply(text, params) if self.reply else f"<{n}>"
        return out, {"prompt_tokens": len(text), "completion_tokens": len(out), "cached_tokens": 0}

    def generate_stream(
        self, text: str, params: SamplingParams
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        n = self._record("generate_stream", text, params)
        if self.fail is not None:
            self.fail(text, params)
        out = self.reply(text, params) if self.reply else f"<{n}>"
        for i, ch in enumerate(out):
            if self.before_chunk is not None:
                self.before_chunk(i)
            yield ch, {"completion_tokens": i + 1}

    def select(self, text, choices, temperature, choices_method) -> ChoicesDecision:
        self._record("select", text, tuple(choices))
        return ChoicesDecision(self.pick(choices), {"method": choices_method.name})

    def cache_prefix(self, text: str) -> None:
        self._record("cache_prefix", text, None)


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def make_fake() -> Callable[..., FakeBackend]:
    return FakeBackend


@pytest.fixture(scope="module", params=["engine", "endpoint"])
def backend(request, engine):
    """The backend a program test runs on (every such test runs once per param)."""
    if request.param == "engine":
        from radixlm.interpreter.engine_backend import EngineBackend

        yield EngineBackend(engine)
    elif request.param == "endpoint":
        from radixlm.interpreter.runtime_endpoint import RuntimeEndpoint

        server = request.getfixturevalue("main_server")
        endpoint = RuntimeEndpoint(server.base_url, api_key=server.api_key)
        yield endpoint
        endpoint.shutdown()
    else:
        raise AssertionError(request.param)


@pytest.fixture(autouse=True)
def _endpoint_server_invariants(request) -> Iterator[None]:
    """After a test that used the endpoint server: idle, nothing locked, exact KV accounting."""
    callspec = getattr(request.node, "callspec", None)
    uses_server = "main_server" in request.fixturenames or (
        callspec is not None and callspec.params.get("backend") == "endpoint"
    )
    server = request.getfixturevalue("main_server") if uses_server else None
    yield
    if server is not None:
        server.wait_idle_and_check_kv()
