"""The scheduler process: builds the `ModelRunner`, the tokenizer and the sockets, hands the
runner to a `Scheduler` (scheduler.py) and runs the loop

    recv every message (GenerateReq / AbortReq / ControlReq) -> `Scheduler.handle`
    -> `Scheduler.run_once` -> `BatchTokenOut` of `take_outputs()` to the detokenizer;
    control replies go to the tokenizer manager.

Ownership: this module owns the ZMQ context and sockets; the scheduler owns everything else.

At TP > 1 this process is rank 0 of the group (runtime/distributed/): it joins the group first,
its runner is a `LeaderModelRunner` (every forward is broadcast to the followers), the loop sends
keep-alives while idle, and a failure of any rank (its watchdog, or a collective that raises)
ends it with `SchedulerDied` naming the rank.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import time
from typing import Any

import zmq

from radixlm.runtime.distributed.group import STALE_S, RankSpec
from radixlm.runtime.distributed.leader import LeaderModelRunner
from radixlm.runtime.distributed.state import parallel_state
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.frontend.tokenizer import load_server_tokenizer
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.processes import io
from radixlm.runtime.processes.ipc import PortArgs, TypedReceiver, pull_socket, push_socket, send
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


class SchedulerSockets:
    def __init__(self, ports: PortArgs) -> None:
        self.ctx = zmq.Context(2)
        self.recv = TypedReceiver(pull_socket(self.ctx, ports.scheduler_ipc), io.ToScheduler)
        self.detokenizer = push_socket(self.ctx, ports.detokenizer_ipc)
        self.tokenizer = push_socket(self.ctx, ports.tokenizer_ipc)


def build_scheduler(args: ServerArgs) -> Scheduler:
    """The model runner (model, KV pool, CUDA graphs) and tokenizer for `args`, and their
    scheduler."""
    source = resolve_model(args.model_path, args.load_format)
    runner_cls = LeaderModelRunner if parallel_state().is_parallel else ModelRunner
    runner = runner_cls(args, source)
    return Scheduler(args, runner, load_server_tokenizer(args, source.gguf))


def event_loop(scheduler: Scheduler, sockets: SchedulerSockets) -> None:
    leader = scheduler.runner if isinstance(scheduler.runner, LeaderModelRunner) else None
    while True:
        if not scheduler.has_work:
            sockets.recv.poll(5 if scheduler.grammars.pending else 1000)
            if leader is not None:  # NOTE: idle iterations only; TP=1 never gets here
                leader.keep_alive()
        for msg in sockets.recv.recv_all():
            reply = scheduler.handle(msg)
            if reply is not None:
                send(sockets.tokenizer, reply)
        scheduler.run_once()
        outs = scheduler.take_outputs()
        if outs:
            send(sockets.detokenizer, io.BatchTokenOut(outs))


class _GroupFailure:
    """Rank 0's reaction to its watchdog finding a failed rank: the error goes to the launcher
    (still starting) or the tokenizer manager, then the process exits (the main thread may be
    stuck in a collective that never returns)."""

    def __init__(self, ports: PortArgs, pipe: Any) -> None:
        self.ports = ports
        self.pipe: Any = pipe  # None once readiness was reported

    def __call__(self, message: str) -> None:
        logger.error("stopping: %s", message)
        if self.pipe is not None:
            with contextlib.suppress(OSError):  # the main thread may have reported already
                self.pipe.send({"status": "error", "error": message})
        else:
            sock = push_socket(zmq.Context(1), self.ports.tokenizer_ipc)
            send(sock, io.SchedulerDied(message))
            time.sleep(0.2)
        os._exit(1)


def run_scheduler_process(
    args: ServerArgs, ports: PortArgs, pipe: Any, rank: RankSpec | None = None
) -> None:
    """Entry point of the scheduler process (processes/child.py); `rank`: rank 0's place in its
    tensor-parallel group (None at TP=1)."""
    from radixlm.runtime.distributed.rank_process import join_group
    from radixlm.runtime.processes.process_utils import configure_child_process

    configure_child_process("scheduler", args.log_level)
    watchdog = None
    on_failure = _GroupFailure(ports, pipe)
    try:
        if rank is not None:
            args, watchdog = join_group(args, rank, on_failure)
        scheduler = build_scheduler(args)
        sockets = SchedulerSockets(ports)
    except Exception as exc:
        logger.exception("scheduler failed to start")
        error = watchdog.wait_diagnosis(STALE_S + 1) if watchdog is not None else None
        pipe.send({"status": "error", "error": error or f"{type(exc).__name__}: {exc}"})
        raise SystemExit(1) from exc
    if watchdog is not None:
        signal.signal(signal.SIGTERM, lambda *_: _stop_group(watchdog))
    # NOTE: the model, tokenizer and library modules are permanent: frozen, the cyclic GC no
    # longer walks them, so a full collection inside the loop costs microseconds, not a stall.
    gc.collect()
    gc.freeze()
    pipe.send({"status": "ready", "info": scheduler.info.info(), "pid": os.getpid()})
    on_failure.pipe = None
    try:
        event_loop(scheduler, sockets)
    except Exception as exc:
        logger.exception("scheduler crashed")
        # NOTE: a collective that fails because a peer died says nothing of which: the watchdog
        # names the rank within seconds (and ends this process itself).
        error = watchdog.wait_diagnosis(STALE_S + 1) if watchdog is not None else None
        send(sockets.tokenizer, io.SchedulerDied(error or f"{type(exc).__name__}: {exc}"))
        time.sleep(0.2)
        raise SystemExit(1) from exc


def _stop_group(watchdog: Any) -> None:
    """SIGTERM at TP > 1: tell the followers this is an orderly stop, then exit."""
    with contextlib.suppress(Exception):
        watchdog.announce_stop()
    os._exit(0)
