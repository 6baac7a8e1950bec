"""Starting and stopping the scheduler and detokenizer processes (for `Engine` and the server).

Children are fresh interpreters (`python -m radixlm.runtime.processes.child <role>`), not multiprocessing
spawns: the user's `__main__` (a script without a `__name__` guard, a notebook) is never
re-imported. Each child reads its configuration as JSON on stdin, reports readiness as one JSON
line on a pipe, and is terminated, then killed, on shutdown. Children also exit by themselves when
their parent dies (see process_utils.configure_child_process).

At TP > 1 (runtime/distributed/) the scheduler is rank 0 of its group and this node's other ranks
are `tp_follower` children (`tp_rank_N`); `launch_processes` starts node 0's (the scheduler, the
detokenizer and node 0's followers), `launch_follower_node` another node's followers only. The
ranks meet at `dist_init_addr` (a free loopback port when unset, for one node).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.distributed.group import RankSpec
from radixlm.runtime.errors import EngineDeadError, InvalidRequestError
from radixlm.runtime.processes.ipc import PortArgs
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)
STARTUP_TIMEOUT = 900.0


@dataclass
class EngineProcesses:
    ports: PortArgs | None  # None on a node that runs followers only
    procs: dict[str, subprocess.Popen]
    info: dict[str, Any]

    def describe_death(self) -> str:
        """'' while every child runs, else which one exited."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                return f"the {name.replace('_', ' ')} process exited (code {code})"
        return ""

    def shutdown(self, timeout: float = 5.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self.ports is not None:
            self.ports.cleanup()


# The children's defaults (a user's own setting wins):
# - OMP_WAIT_POLICY: libgomp's default spins ~0.3 ms at every barrier. On a machine with other
#   busy processes (a 2-core CI box running tests, a laptop) a spinning team whose member was
#   descheduled burns its time slices waiting: decode steps of the default model were measured 7x
#   slower (43.7 s vs 6.4 s for 20 tokens at load 8 on 2 cores).
# - MALLOC_MMAP_THRESHOLD_: glibc's adaptive mmap threshold lets the scheduler's large, variably
#   sized tensors (logits rows of the vocabulary size) land on the heap, which fragments: resident
#   memory grew ~0.3 MB per request under load (docs/reliability.md). A fixed threshold keeps them
#   mmapped and returned on free; memory stays flat.
CHILD_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "MALLOC_MMAP_THRESHOLD_": "65536"}


def child_env() -> dict[str, str]:
    """The children's environment: ours, plus `CHILD_ENV_DEFAULTS` where unset."""
    return {**CHILD_ENV_DEFAULTS, **os.environ}


def launch_processes(
    args: ServerArgs, while_starting: Callable[[], Any] | None = None
) -> EngineProcesses:
    """Start node 0's children; run `while_starting` (e.g. load the tokenizer) while they boot;
    wait until all are ready. Raises EngineDeadError with the child's own error if one fails.
    The children get `args.resolved()`: every "auto" default filled in once, here."""
    args = args.resolved()
    if args.node_rank != 0:
        raise InvalidRequestError(
            "node_rank > 0 runs tensor-parallel followers only: start it with "
            "`radixlm serve --node-rank N ...` (launch_follower_node)",
            "node_rank",
        )
    ports = PortArgs.new()
    base = {"args": dataclasses.asdict(args), "ports": dataclasses.asdict(ports)}
    ranks = node_ranks(args)
    children = [("scheduler", "scheduler", _with_rank(base, ranks[0]))]
    children.append(("detokenizer", "detokenizer", base))
    children += [(f"tp_rank_{r.rank}", "tp_follower", _with_rank(base, r)) for r in ranks[1:]]
    return _launch(children, ports, while_starting)


def launch_follower_node(args: ServerArgs) -> EngineProcesses:
    """Start the tensor-parallel ranks of node `args.node_rank` > 0; they join rank 0 at
    `args.dist_init_addr` and follow it."""
    args = args.resolved()
    base = {"args": dataclasses.asdict(args)}
    children = [(f"tp_rank_{r.rank}", "tp_follower", _with_rank(base, r)) for r in node_ranks(args)]
    return _launch(children, None, None)


def run_follower_node(args: ServerArgs) -> int:
    """`radixlm serve --node-rank N` (N > 0): run this node's ranks until they end; returns the
    exit code (0: rank 0 stopped the group in order; 1: a rank failed, named in the log)."""
    try:
        procs = launch_follower_node(args)
    except EngineDeadError as exc:
        logger.error("%s", exc)
        return 1
    logger.info("node %d: tensor-parallel ranks %s follow rank 0 at %s", args.node_rank,
                ", ".join(procs.procs), args.dist_init_addr)  # fmt: skip
    try:
        while not (death := procs.describe_death()):
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 130
    finally:
        procs.shutdown()
    codes = [p.returncode for p in procs.procs.values()]
    if any(codes):
        logger.error("node %d stopped: %s", args.node_rank, death)
        return 1
    return 0


def node_ranks(args: ServerArgs) -> list[RankSpec | None]:
    """This node's ranks, rank 0 first on node 0 (`[None]` at TP=1: no group)."""
    if args.tp_size == 1:
        return [None]
    addr = args.dist_init_addr or f"127.0.0.1:{free_port()}"
    per_node = args.tp_size // args.nnodes
    first = args.node_rank * per_node
    return [RankSpec(first + i, i, args.tp_size, args.nnodes, addr) for i in range(per_node)]


def _with_rank(base: dict[str, Any], rank: RankSpec | None) -> dict[str, Any]:
    return base if rank is None else {**base, "rank": dataclasses.asdict(rank)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(
    children: list[tuple[str, str, dict[str, Any]]],
    ports: PortArgs | None,
    while_starting: Callable[[], Any] | None,
) -> EngineProcesses:
    procs: dict[str, subprocess.Popen] = {}
    readers: dict[str, int] = {}
    try:
        for name, role, config in children:
            read_fd, write_fd = os.pipe()
            proc = subprocess.Popen(
                [sys.executable, "-m", "radixlm.runtime.processes.child", role, str(write_fd)],
                env=child_env(),
                stdin=subprocess.PIPE,
                pass_fds=(write_fd,),
                close_fds=True,
            )
            os.close(write_fd)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(config).encode())
            proc.stdin.close()
            procs[name] = proc
            readers[name] = read_fd
        if while_starting is not None:
            while_starting()
        info: dict[str, Any] = {}
        for name in procs:
            msg = _wait_ready(name, readers[name], procs[name])
            info.update(msg.get("info", {}))
            info[f"{name}_pid"] = procs[name].pid
    except BaseException:
        EngineProcesses(ports, procs, {}).shutdown()
        raise
    finally:
        for fd in readers.values():
            os.close(fd)
    return EngineProcesses(ports, procs, info)


def _wait_ready(role: str, fd: int, proc: subprocess.Popen) -> dict[str, Any]:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
            if b"\n" in buf:
                msg = json.loads(buf.split(b"\n", 1)[0])
                if msg.get("status") != "ready":
                    raise EngineDeadError(f"the {role} process failed to start: {msg.get('error')}")
                return msg
        if proc.poll() is not None:
            break
    raise EngineDeadError(f"the {role} process did not start (exit code {proc.poll()})")
