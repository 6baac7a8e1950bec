"""Server test fixtures: `server` (the session's shared `main_server`, from tests/conftest.py,
unless a module overrides it), `start_server` (a factory of per-module servers), `tiny_server`
(a session server on the tiny random-weight model, for the reliability tests), and the invariants
checked after every server test (`_server_invariants`): KV accounting back to idle, no request
left in the tokenizer manager, no process or socket leaked."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil
import pytest

from radixlm.runtime.models.default_model import default_model_path
from server_process import ServerProcess

# The tiny random-weight model with SmolLM2's real tokenizer (vocab 49152): text, stop strings,
# chat templates and constraints work, and a forward costs next to nothing (reliability tests).
# One torch thread: the scheduler leaves the other core to the HTTP process and the test's clients.
TINY_MODEL_ARGS = (
    "--model-path", "tiny-smollm", "--load-format", "dummy",
    "--tokenizer-path", default_model_path(), "--num-threads", "1",
)  # fmt: skip
# `tiny_server`: 65536 KV slots, enough for the load test's 256 requests in flight (retraction is
# test_faults' subject, on a small pool), and a queue limit above that concurrency.
TINY_SERVER_ARGS = (*TINY_MODEL_ARGS, "--max-total-tokens", "65536",
                    "--max-queued-requests", "1024", "--grammar-compile-timeout", "10")  # fmt: skip
# Sockets a healthy idle server may hold beyond its baseline: the keep-alive connections of the
# test's own clients (each ServerProcess keeps one httpx client open).
SOCKET_SLACK = 8
INVARIANT_TIMEOUT_S = 30.0

_BASELINES: dict[int, dict[str, Any]] = {}


def start_tracked(
    *extra: str, api_key: str | None = None, command: list[str] | None = None
) -> ServerProcess:
    """Start a server, wait until ready, and record its baseline (children, sockets)."""
    server = ServerProcess(*extra, api_key=api_key, command=command)
    try:
        server.wait_ready()
    except BaseException:
        server.close()  # NOTE: a server that failed to start must not outlive the test
        raise
    _BASELINES[id(server)] = _snapshot(server)
    return server


@pytest.fixture(scope="module")
def start_server() -> Iterator[Callable[..., ServerProcess]]:
    """Factory: start a server for this module (stopped at the end of the module)."""
    started: list[ServerProcess] = []

    def start(
        *extra: str, api_key: str | None = None, command: list[str] | None = None
    ) -> ServerProcess:
        server = start_tracked(*extra, api_key=api_key, command=command)
        started.append(server)
        return server

    yield start
    for server in started:
        _close_and_check(server)


@pytest.fixture(scope="module")
def server(main_server: ServerProcess) -> ServerProcess:
    """A module's server: the shared one unless the module overrides this fixture."""
    return main_server


@pytest.fixture(scope="session")
def tiny_model_args() -> tuple[str, ...]:
    """Flags that select the tiny random-weight model (for `start_server`)."""
    return TINY_MODEL_ARGS


@pytest.fixture(scope="session")
def tiny_server() -> Iterator[ServerProcess]:
    """One tiny-model server for the session's reliability modules (load, bad input, faults'
    reference run): large KV pool, --max-queued-requests above the load test's concurrency."""
    server = start_tracked(*TINY_SERVER_ARGS)
    try:
        yield server
    finally:
        _close_and_check(server)


# ---- concurrent clients ---------------------------------------------------------------------
@dataclass
class Outcome:
    """How one HTTP request ended, seen from its client."""

    path: str
    body: dict[str, Any]
    status: int = 0  # 0: no HTTP answer (transport error or client-side timeout)
    latency_s: float = 0.0
    json: Any = None  # the answer of a non-streaming request (or an error body)
    events: list[Any] = field(default_factory=list)  # SSE events (dicts, then "[DONE]")
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # the transport error, if any
    disconnected: bool = False  # the client hung up on purpose (mid-stream)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def error_code(self) -> str | None:
        """The error's `code` (or `type`): of the HTTP answer, or of an SSE error event."""
        errs = [e["error"] for e in self.events if isinstance(e, dict) and "error" in e]
        if isinstance(self.json, dict) and "error" in self.json:
            errs.append(self.json["error"])
        return (errs[0].get("code") or errs[0].get("type")) if errs else None


async def _request(client: Any, path: str, body: dict[str, Any], hang_up_after: int | None,
                   headers: dict[str, str], on_event: Callable[[Outcome], None] | None,
                   ) -> Outcome:  # fmt: skip
    out = Outcome(path, body)
    start = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body, headers=headers) as resp:
            out.status = resp.status_code
            out.headers = dict(resp.headers)
            if resp.headers.get("content-type", "").startswith("text/event-stream"):
                async for line in resp.aiter_lines():
                    if not line:
                        continue
                    assert line.startswith("data: "), line
                    payload = line[len("data: ") :]
                    out.events.append(payload if payload == "[DONE]" else json.loads(payload))
                    if on_event is not None:
                        on_event(out)
                    if hang_up_after is not None and len(out.events) >= hang_up_after:
                        out.disconnected = True
                        break  # NOTE: leaving the block closes the connection mid-stream
            else:
                raw = await resp.aread()
                out.json = json.loads(raw) if raw else None
    except Exception as exc:  # a hang, a reset, a broken stream: the caller asserts on it
        out.error = f"{type(exc).__name__}: {exc}"
    out.latency_s = time.perf_counter() - start
    return out


def run_requests(
    server: ServerProcess,
    requests: Sequence[tuple[str, dict[str, Any]]],
    concurrency: int,
    hang_up_after: int | None = None,
    timeout_s: float = 120.0,
    on_event: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """POST every (path, body) with at most `concurrency` in flight, each on its own connection
    pool slot; the outcomes, in order. `hang_up_after`: streaming clients disconnect after that
    many events; `on_event(outcome)` runs (on the client's loop thread) after each SSE event.
    Blocks (runs its own event loop: call it from a thread to overlap other work)."""

    async def main() -> list[Outcome]:
        # NOTE: idle connections expire on the client first (the server keeps them 30 s), so a
        # request is never sent on a connection the server is closing.
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency,
                              keepalive_expiry=2.0)  # fmt: skip
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=server.base_url, limits=limits,
                                     timeout=timeout_s) as client:  # fmt: skip

            async def one(path: str, body: dict[str, Any]) -> Outcome:
                async with gate:
                    return await _request(
                        client, path, body, hang_up_after, server.headers, on_event
                    )

            return await asyncio.gather(*(one(p, b) for p, b in requests))

    return asyncio.run(main())


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0.0 when absent), matching the given labels."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def process_rss_mb(server: ServerProcess) -> float:
    """Resident memory of the server and its children together, in MiB."""
    proc = psutil.Process(server.proc.pid)
    procs = [proc, *proc.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs) / 2**20


# NOTE: test modules cannot import this conftest (importlib import mode): they get the helpers
# as fixtures.
@pytest.fixture(name="run_requests")
def run_requests_fixture() -> Callable[..., list[Outcome]]:
    return run_requests


@pytest.fixture(name="metric_value")
def metric_value_fixture() -> Callable[..., float]:
    return metric_value


@pytest.fixture(name="process_rss_mb")
def process_rss_mb_fixture() -> Callable[[ServerProcess], float]:
    return process_rss_mb


# ---- invariants -----------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _server_invariants(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test, on every live server it used: idle KV accounting exact, no request left
    in the tokenizer manager, the same child processes as at start, sockets back to baseline.
    A server the test stopped or broke on purpose (SIGTERM, SIGKILL of a child) is checked for
    leftover child processes instead."""
    yield
    for value in request.node.funcargs.values():
        if isinstance(value, ServerProcess):
            check_server_invariants(value)


def check_server_invariants(server: ServerProcess) -> None:
    base = _BASELINES.get(id(server))
    if server.proc.poll() is not None:
        if base is not None:
            alive = [pid for pid in base["children"] if _alive(pid)]
            assert not alive, f"child processes outlived the server: {alive}"
        return
    if httpx.get(server.base_url + "/health", timeout=10).status_code != 200:
        return  # a test broke it on purpose (test_faults) and checks it itself
    info = server.wait_idle_and_check_kv(INVARIANT_TIMEOUT_S)
    assert info["tm_requests"] == 0, f"requests left in the tokenizer manager: {info}"
    if base is None:  # a server started elsewhere (main_server): its baseline is now
        _BASELINES[id(server)] = _snapshot(server)
        return
    snap = _wait_sockets(server, base["sockets"] + SOCKET_SLACK)
    assert snap["children"] == base["children"], (snap, base)
    assert snap["sockets"] <= base["sockets"] + SOCKET_SLACK, (
        f"the server holds {snap['sockets']} sockets, {base['sockets']} at start"
    )


def _wait_sockets(server: ServerProcess, limit: int) -> dict[str, Any]:
    # NOTE: closed client connections are reaped by the server's event loop asynchronously.
    deadline = time.monotonic() + INVARIANT_TIMEOUT_S
    while True:
        snap = _snapshot(server)
        if snap["sockets"] <= limit or time.monotonic() > deadline:
            return snap
        time.sleep(0.2)


def _snapshot(server: ServerProcess) -> dict[str, Any]:
    proc = psutil.Process(server.proc.pid)
    children = sorted(p.pid for p in proc.children(recursive=True))
    sockets = len(proc.net_connections(kind="inet"))
    return {"children": children, "sockets": sockets}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _close_and_check(server: ServerProcess) -> None:
    base = _BASELINES.pop(id(server), None)
    server.close()
    if base is not None:
        alive = [pid for pid in base["children"] if _alive(pid)]
        assert not alive, f"child processes outlived the server: {alive}"
