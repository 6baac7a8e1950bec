"""Starting and stopping the scheduler and detokenizer processes (for `Engine` and the server).

Children are fresh interpreters (`python -m radixlm.runtime.processes.child <role>`), not multiprocessing
spawns: the user's `__main__` (a script without a `__name__` guard, a notebook) is never
re-imported. Each child reads its configuration as JSON on stdin, reports readiness as one JSON
line on a pipe, and is terminated, then killed, on shutdown. Children also exit by themselves when
their parent dies (see process_utils.configure_child_process).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.errors import EngineDeadError
from radixlm.runtime.processes.ipc import PortArgs
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)
STARTUP_TIMEOUT = 900.0
ROLES = ("scheduler", "detokenizer")


@dataclass
class EngineProcesses:
    ports: PortArgs
    procs: dict[str, subprocess.Popen]
    info: dict[str, Any]

    def describe_death(self) -> str:
        """'' while every child runs, else which one exited."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                return f"the {name} process exited (code {code})"
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
    """Start the children; run `while_starting` (e.g. load the tokenizer) while they boot; wait
    until both are ready. Raises EngineDeadError with the child's own error if one fails.
    The children get `args.resolved()`: every "auto" default filled in once, here."""
    args = args.resolved()
    ports = PortArgs.new()
    config = json.dumps(
        {"args": dataclasses.asdict(args), "ports": dataclasses.asdict(ports)}
    ).encode()
    procs: dict[str, subprocess.Popen] = {}
    readers: dict[str, int] = {}
    try:
        for role in ROLES:
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
            proc.stdin.write(config)
            proc.stdin.close()
            procs[role] = proc
            readers[role] = read_fd
        if while_starting is not None:
            while_starting()
        info: dict[str, Any] = {}
        for role in ROLES:
            msg = _wait_ready(role, readers[role], procs[role])
            info.update(msg.get("info", {}))
            info[f"{role}_pid"] = procs[role].pid
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
