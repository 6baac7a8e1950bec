"""The real server as a subprocess, for the server and interpreter tests (importable as
`server_process`: `tests/` is on pytest's pythonpath)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx

STARTUP_TIMEOUT = 240.0
# A small KV pool keeps several servers (and the shared test Engine) within CI memory.
BASE_ARGS = ["--max-total-tokens", "16384", "--log-level", "info"]
# The session's shared server (`main_server` in tests/conftest.py).
MAIN_API_KEY = "test-key"
MAIN_BODY_LIMIT = 128 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`python -m radixlm.runtime.server.launch_server` (default model) on a free loopback port."""

    def __init__(
        self,
        *extra: str,
        api_key: str | None = None,
        command: list[str] | None = None,
        port: int | None = None,
    ) -> None:
        """`command` replaces `python -m radixlm.runtime.server.launch_server` (e.g. the
        `radixlm serve` console script); `port` (default: a free one) lets a test restart a
        server where it was."""
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_file = tempfile.NamedTemporaryFile("w+", prefix="radixlm-server-", suffix=".log")  # noqa: SIM115
        args = [*BASE_ARGS, *extra] + (["--api-key", api_key] if api_key else [])
        self.proc = subprocess.Popen(
            [
                *(command or [sys.executable, "-m", "radixlm.runtime.server.launch_server"]),
                "--port",
                str(self.port),
                *args,
            ],
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
        )
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=120.0)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}:\n{self.logs()[-4000:]}"
                )
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"server not ready after {STARTUP_TIMEOUT} s:\n{self.logs()[-4000:]}")

    def logs(self) -> str:
        self.log_file.flush()
        with open(self.log_file.name) as f:
            return f.read()

    def info(self) -> dict[str, Any]:
        resp = self.client.get("/get_server_info")
        resp.raise_for_status()
        return resp.json()

    def wait_idle_and_check_kv(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until no request runs, then check exact KV accounting through /get_server_info:
        nothing locked, every slot free or held by the (evictable) prefix cache."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.info()
            if info["num_running"] == 0 and info["num_waiting"] == 0:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle after {timeout} s: {info}")
            time.sleep(0.1)
        assert info["protected_slots"] == 0, info
        assert info["free_slots"] + info["evictable_slots"] == info["capacity"], info
        return info

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.client.close()
        return self.proc.returncode

    def close(self) -> None:
        self.stop()
        self.log_file.close()


def sse_events(lines: Any) -> Iterator[dict[str, Any] | str]:
    """Parse `data: ...` lines: dicts, and the string "[DONE]"."""
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: ") :]
        yield payload if payload == "[DONE]" else json.loads(payload)
