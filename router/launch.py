"""`radixlm router --worker-urls URL...`: serve the router app with uvicorn until SIGTERM/Ctrl-C.

    radixlm serve --port 31001 &
    radixlm serve --port 31002 &
    radixlm router --port 30000 --worker-urls http://127.0.0.1:31001 http://127.0.0.1:31002

The router holds no model: it starts in a second and may start before its workers (they join the
pool once their /health answers 200). `serve_router` is also what `radixlm serve --dp-size N`
runs in its own process, in front of the replicas it started (router/dp.py).
"""

from __future__ import annotations

import logging
import sys
from types import FrameType

import uvicorn

from radixlm.router.config import RouterArgs

logger = logging.getLogger("radixlm.router")
READY_LINE = "The router is fired up and ready to route!"
KEEP_ALIVE_S = 30  # NOTE: above httpx's 5 s pool expiry, as the server's (launch_server.py)


class _Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # NOTE: not super(): uvicorn would re-raise the signal after serving (exit code -15)
        self.force_exit = self.should_exit  # a second signal: stop without waiting
        self.should_exit = True


def serve_router(args: RouterArgs, ready_line: str = READY_LINE) -> int:
    """Run the router in this process until a signal stops it; returns the exit code."""
    from radixlm.router.app import create_router_app

    config = uvicorn.Config(
        create_router_app(args), host=args.host, port=args.port, loop="uvloop", http="httptools",
        log_level=args.log_level.lower(), access_log=False, timeout_keep_alive=KEEP_ALIVE_S,
        ws="none", lifespan="on", timeout_graceful_shutdown=10,
    )  # fmt: skip
    server = _Server(config)
    handler = _ReadyLog(ready_line)
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits 1 when it cannot bind
        return int(exc.code or 0)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    return 0 if server.started else 1


class _ReadyLog(logging.Handler):
    """Logs `ready_line` once uvicorn says it is running (after the lifespan's first checks)."""

    def __init__(self, ready_line: str) -> None:
        super().__init__()
        self.ready_line = ready_line

    def emit(self, record: logging.LogRecord) -> None:
        if "Application startup complete" in record.getMessage():
            logger.info(self.ready_line)


def main(argv: list[str] | None = None) -> int:
    args = RouterArgs.from_cli(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    logging.getLogger("httpx").setLevel(logging.WARNING)  # NOTE: one line per health check
    logger.info("routing to %d worker(s) with policy %s", len(args.worker_urls), args.policy)
    return serve_router(args)


if __name__ == "__main__":
    raise SystemExit(main())
