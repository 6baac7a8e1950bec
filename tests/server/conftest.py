"""Server test fixtures: `server` (the session's shared `main_server`, from tests/conftest.py,
unless a module overrides it) and `start_server` (a factory of per-module servers)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from server_process import ServerProcess


@pytest.fixture(scope="module")
def start_server() -> Iterator[Callable[..., ServerProcess]]:
    """Factory: start a server for this module (stopped at the end of the module)."""
    started: list[ServerProcess] = []

    def start(*extra: str, api_key: str | None = None) -> ServerProcess:
        server = ServerProcess(*extra, api_key=api_key)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture(scope="module")
def server(main_server: ServerProcess) -> ServerProcess:
    """A module's server: the shared one unless the module overrides this fixture."""
    return main_server
