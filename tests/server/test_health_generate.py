"""`/health_generate` when the engine takes too long (docs/server.md: "503 if it fails or takes
over 20 s"): the server's app in-process over ASGI, with a tokenizer manager that accepts the
request and never answers (a hung scheduler, without waiting for one). The documented number is
the code's; the wait is shortened for the test, and the request is closed (aborted) after it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from radixlm.runtime.server import native_api
from radixlm.runtime.server.app import create_app
from radixlm.runtime.server.state import ServerState
from radixlm.runtime.server_args import ServerArgs

DOCS = Path(__file__).resolve().parents[2] / "docs" / "server.md"


class SilentEngine:
    """A TokenizerManager that takes every request and never answers one."""

    dead: str | None = None

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.closed: list[str] = []

    def prepare(self, req: Any) -> Any:
        return req

    async def submit(self, req: Any) -> AsyncIterator[dict[str, Any]]:
        self.submitted.append(req.rid)
        try:
            await asyncio.Event().wait()  # nothing ever comes
            yield {}
        finally:
            self.closed.append(req.rid)  # the real one aborts the request here


def test_the_documented_timeout_is_the_codes():
    stated = re.findall(r"`GET /health_generate` \|[^|]*takes over (\d+) s", DOCS.read_text())
    assert stated == [f"{native_api.HEALTH_GENERATE_TIMEOUT:.0f}"], stated


def test_no_generation_in_time_is_a_503_and_the_request_is_closed(monkeypatch):
    monkeypatch.setattr(native_api, "HEALTH_GENERATE_TIMEOUT", 0.05)
    engine = SilentEngine()
    state = ServerState(ServerArgs(enable_metrics=False), None, None, tm=engine, ready=True)  # type: ignore[arg-type]
    app = create_app(state)

    async def probe() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/health_generate")

    resp = asyncio.run(asyncio.wait_for(probe(), 120))  # a failsafe against a hang, not a bound
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["message"].startswith("no generation within"), resp.json()
    assert len(engine.submitted) == 1 and engine.closed == engine.submitted
    assert engine.submitted[0].startswith(native_api.HEALTH_RID_PREFIX)
