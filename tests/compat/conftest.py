"""One `radixlm serve` for every compat test (SGLang's frontend, SGLang's protocol, OpenAI's
client): started once per session, with an API key so every client also proves it sends one, and
`--tool-call-parser qwen25` (tool_choice "auto") and `--reasoning-parser qwen3`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from server_process import ServerProcess

COMPAT_API_KEY = "compat-key"


@pytest.fixture(scope="session")
def compat_server() -> Iterator[ServerProcess]:
    server = ServerProcess(
        "--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3",
        # NOTE: the corpus's larger schemas compile in seconds, but a loaded 2-core CI machine
        # can stretch that past the 30 s default.
        "--grammar-compile-timeout", "180",
        api_key=COMPAT_API_KEY,
    )  # fmt: skip
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()
