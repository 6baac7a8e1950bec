"""`radixlm serve --dp-size N`: N replicas behind one HTTP endpoint.

Each replica is an ordinary `radixlm serve` process (its own tokenizer manager, scheduler and
detokenizer, so its own KV pool and prefix cache) on a free loopback port, started with the same
flags minus `--host/--port/--dp-size`. Once every replica answers /health, this process serves the
router (router/app.py, cache-aware policy with its default settings) on `--host/--port`.

Lifetime: the replicas are this process's children. SIGTERM/Ctrl-C stop the router, then each
replica gets SIGTERM (it drains its requests, as a single server does) and is killed if it is
still there after `--shutdown-timeout` + 30 s. On Linux a replica also gets SIGTERM if this
process dies without cleaning up (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import socket
import subprocess
import sys
import time
from dataclasses import fields

import httpx

from radixlm.router.config import RouterArgs
from radixlm.router.launch import serve_router
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger("radixlm.server")
_NOT_FORWARDED = ("host", "port", "dp_size")
READY_LINE = "The server is fired up and ready to roll!"  # the single server's line


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def replica_argv(args: ServerArgs, port: int) -> list[str]:
    """`radixlm serve` flags reproducing `args` for one replica on 127.0.0.1:`port`."""
    argv = ["--host", "127.0.0.1", "--port", str(port)]
    for f in fields(ServerArgs):
        value = getattr(args, f.name)
        if f.name in _NOT_FORWARDED or value == f.default or value is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            # NOTE: launch_server adds `--no-<flag>` for every field whose default is True
            argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):  # Linux: PR_SET_PDEATHSIG (1)
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def _wait_ready(replicas: list[tuple[subprocess.Popen, str]]) -> str | None:
    """None once every replica's /health answers 200; an error message if one exits first."""
    pending = list(replicas)
    while pending:
        for proc, url in list(pending):
            if proc.poll() is not None:
                return f"replica {url} exited with {proc.returncode} while starting"
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    pending.remove((proc, url))
            except httpx.HTTPError:
                pass
        time.sleep(0.25)
    return None


def _stop(replicas: list[tuple[subprocess.Popen, str]], timeout: float) -> None:
    for proc, _ in replicas:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc, url in replicas:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("replica %s did not stop in time: killed", url)
            proc.kill()
            proc.wait()


def serve_dp(args: ServerArgs) -> int:
    """Entry point of `radixlm serve --dp-size N` (N > 1); returns the exit code."""
    replicas: list[tuple[subprocess.Popen, str]] = []
    try:
        for _ in range(args.dp_size):
            port = free_port()
            cmd = [sys.executable, "-m", "radixlm.runtime.server.launch_server",
                   *replica_argv(args, port)]  # fmt: skip
            replicas.append((subprocess.Popen(cmd, preexec_fn=_die_with_parent),
                             f"http://127.0.0.1:{port}"))  # fmt: skip
        logger.info("started %d replicas: %s", len(replicas), " ".join(u for _, u in replicas))
        error = _wait_ready(replicas)
        if error:
            logger.error("%s", error)
            return 1
        logging.getLogger("httpx").setLevel(logging.WARNING)
        router_args = RouterArgs(worker_urls=tuple(u for _, u in replicas), host=args.host,
                                 port=args.port, api_key=args.api_key, log_level=args.log_level)  # fmt: skip
        return serve_router(router_args, ready_line=READY_LINE)
    except KeyboardInterrupt:
        return 130
    finally:
        _stop(replicas, args.shutdown_timeout + 30.0)
        logger.info("server stopped")
