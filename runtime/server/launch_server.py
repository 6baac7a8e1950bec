"""`radixlm serve` (also `python -m radixlm.runtime.server.launch_server`): start the engine's child
processes, then uvicorn (uvloop + httptools) serving `create_app` on --host/--port (127.0.0.1 by
default). After a one-token warm-up it logs SGLang's ready line, "The server is fired up and
ready to roll!", and /health answers 200.

Shutdown (SIGTERM or Ctrl-C): /health and new work get 503 at once, requests in flight get up to
--shutdown-timeout seconds to finish, the rest are aborted (they end with finish_reason "abort"),
then uvicorn stops, the TokenizerManager closes and the children are stopped; the exit code is 0.
A second SIGINT/SIGTERM aborts everything at once (and waits for the aborted requests' final
chunks, up to --shutdown-timeout); a third exits without waiting. If the scheduler
dies, the server keeps running and reports it: /health answers 503, requests get 503.

Threading: one process, one event loop (uvicorn's, in the main thread). Signal handlers only
schedule work onto that loop.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from types import FrameType
from typing import Any

import uvicorn

from radixlm.runtime.errors import RadixLMError
from radixlm.runtime.frontend.tokenizer_manager import GenerateInput
from radixlm.runtime.models.default_model import ModelNotFoundError
from radixlm.runtime.models.hf_cache import resolve_cached_model
from radixlm.runtime.processes.launch import launch_processes, run_follower_node
from radixlm.runtime.processes.process_utils import configure_logging
from radixlm.runtime.server.metrics import HEALTH_RID_PREFIX
from radixlm.runtime.server.state import ServerState
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger("radixlm.server")
READY_LINE = "The server is fired up and ready to roll!"
ABORT_GRACE_S = 5.0  # after aborting, how long requests get to deliver their final chunk
# NOTE: longer than common clients' idle-connection expiry (httpx: 5 s): when both are equal, a
# client can send a request on a keep-alive connection the server is closing at that instant,
# and the request fails without an answer.
KEEP_ALIVE_S = 30


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixlm serve", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    ServerArgs.add_cli_args(parser)
    for f in fields(ServerArgs):
        if f.default is True:  # NOTE: a store_true flag cannot turn these off: add --no-<flag>
            parser.add_argument(
                "--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false"
            )
    return parser


class Server(uvicorn.Server):
    """uvicorn's server with radixlm's warm-up/ready line and draining shutdown."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.signals = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()

    async def startup(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self._spawn(self._warm_up())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm_up(self) -> None:
        tm = self.state.tm
        assert tm is not None
        req = GenerateInput(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                            rid=f"{HEALTH_RID_PREFIX}warmup")  # fmt: skip
        try:
            async for _ in tm.generate(req):
                pass
        except Exception as exc:
            logger.error("warm-up request failed: %s", exc)
            return
        self.state.ready = True
        host, port = self.config.host, self.config.port
        logger.info("serving %s on http://%s:%s", self.state.model_name, host, port)
        logger.info(READY_LINE)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # NOTE: never call super(): uvicorn records the signal and re-raises it after serving,
        # which would turn a clean drain into exit code -15.
        self.signals += 1
        if self.loop is None or self.signals >= 3:
            self.should_exit = self.force_exit = True
            return
        action = self._drain if self.signals == 1 else self._abort_on_signal
        self.loop.call_soon_threadsafe(lambda: self._spawn(action()))

    async def _drain(self) -> None:
        state = self.state
        state.draining = True
        timeout = state.args.shutdown_timeout
        logger.info(
            "shutting down: %d request(s) in flight, waiting up to %.0f s", state.in_flight, timeout
        )
        deadline = time.monotonic() + timeout
        while state.in_flight and time.monotonic() < deadline and not self.should_exit:
            await asyncio.sleep(0.05)
        await self._abort_now(ABORT_GRACE_S)

    async def _abort_on_signal(self) -> None:
        # NOTE: the second signal aborts at once, then waits for the aborted requests' final
        # chunks up to --shutdown-timeout: a scheduler that cannot answer (hung) holds them, and
        # the third signal exits without waiting.
        await self._abort_now(max(ABORT_GRACE_S, self.state.args.shutdown_timeout))

    async def _abort_now(self, grace: float) -> None:
        state = self.state
        if state.in_flight and state.tm is not None and not state.tm.dead:
            logger.warning("aborting %d request(s) still in flight", state.in_flight)
            state.tm.abort("")
            deadline = time.monotonic() + grace
            while state.in_flight and time.monotonic() < deadline and not self.should_exit:
                await asyncio.sleep(0.05)
        self.should_exit = True


def serve_main(
    argv: list[str] | None = None, serve_dp: Callable[[ServerArgs], int] | None = None
) -> int:
    """Entry point of `radixlm serve`; returns the process exit code. `serve_dp` runs `--dp-size`
    replicas behind the router (`radixlm.router.dp.serve_dp`; passed in by the CLI, which sits
    above both runtime and router)."""
    parser = build_parser()
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args = ServerArgs.from_cli_args(ns)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    configure_logging(args.log_level)
    if args.dp_size > 1:
        if serve_dp is None:
            parser.error(
                "--dp-size > 1 runs replicas behind the router: start it with `radixlm serve`"
            )
        return serve_dp(args)
    if args.load_format != "dummy" and args.model_path and not os.path.exists(args.model_path):
        try:  # a HF repo id from the local HF cache (never downloads)
            args = resolve_cached_model(args)
        except FileNotFoundError as exc:
            logger.error("%s", exc)
            return 2
    if args.node_rank > 0:  # this node runs tensor-parallel followers only (no HTTP server)
        return run_follower_node(args)
    box: dict[str, Any] = {}

    def while_starting() -> None:
        # NOTE: the heavy imports (transformers, the app: ~2 s) run once the children are spawned,
        # overlapping their start-up instead of delaying it.
        from radixlm.runtime.frontend.tokenizer import load_server_tokenizer
        from radixlm.runtime.server import app  # noqa: F401

        box["tokenizer"] = load_server_tokenizer(args)

    try:
        procs = launch_processes(args, while_starting)
    except (ModelNotFoundError, RadixLMError, RuntimeError, OSError) as exc:
        logger.error("the engine failed to start: %s", exc)
        return 1
    except KeyboardInterrupt:  # Ctrl-C while the children start: they are already stopped
        return 130
    from radixlm.runtime.server.app import create_app

    state = ServerState(args, procs, box.get("tokenizer"))
    try:
        config = uvicorn.Config(
            create_app(state), host=args.host, port=args.port, loop="uvloop", http="httptools",
            log_level=args.log_level.lower(), access_log=False, timeout_graceful_shutdown=10,
            timeout_keep_alive=KEEP_ALIVE_S, ws="none", lifespan="on",
        )  # fmt: skip
        server = Server(config, state)
        server.run()
        return 0 if server.started else 1
    except SystemExit as exc:  # uvicorn exits 1 when it cannot bind
        return int(exc.code or 0)
    finally:
        procs.shutdown()
        logger.info("server stopped")


def main(argv: list[str] | None = None) -> int:
    """Alias of `serve_main` (what `radixlm.cli` calls)."""
    return serve_main(argv)


if __name__ == "__main__":
    raise SystemExit(serve_main())
