"""The scheduler process: builds the `ModelRunner`, the tokenizer and the sockets, hands the
runner to a `Scheduler` (scheduler.py) and runs the loop

    recv every message (GenerateReq / AbortReq / ControlReq) -> `Scheduler.handle`
    -> `Scheduler.run_once` -> `BatchTokenOut` of `take_outputs()` to the detokenizer;
    control replies go to the tokenizer manager.

Ownership: this module owns the ZMQ context and sockets; the scheduler owns everything else.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import Any

import zmq

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
    runner = ModelRunner(args, source)
    return Scheduler(args, runner, load_server_tokenizer(args, source.gguf))


def event_loop(scheduler: Scheduler, sockets: SchedulerSockets) -> None:
    while True:
        if not scheduler.has_work:
            sockets.recv.poll(5 if scheduler.grammars.pending else 1000)
        for msg in sockets.recv.recv_all():
            reply = scheduler.handle(msg)
            if reply is not None:
                send(sockets.tokenizer, reply)
        scheduler.run_once()
        outs = scheduler.take_outputs()
        if outs:
            send(sockets.detokenizer, io.BatchTokenOut(outs))


def run_scheduler_process(args: ServerArgs, ports: PortArgs, pipe: Any) -> None:
    """Entry point of the scheduler process (processes/child.py)."""
    from radixlm.runtime.processes.process_utils import configure_child_process

    configure_child_process("scheduler", args.log_level)
    try:
        scheduler = build_scheduler(args)
        sockets = SchedulerSockets(ports)
    except Exception as exc:
        logger.exception("scheduler failed to start")
        pipe.send({"status": "error", "error": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(1) from exc
    # NOTE: the model, tokenizer and library modules are permanent: frozen, the cyclic GC no
    # longer walks them, so a full collection inside the loop costs microseconds, not a stall.
    gc.collect()
    gc.freeze()
    pipe.send({"status": "ready", "info": scheduler.info.info(), "pid": os.getpid()})
    try:
        event_loop(scheduler, sockets)
    except Exception as exc:
        logger.exception("scheduler crashed")
        send(sockets.tokenizer, io.SchedulerDied(f"{type(exc).__name__}: {exc}"))
        time.sleep(0.2)
        raise SystemExit(1) from exc
