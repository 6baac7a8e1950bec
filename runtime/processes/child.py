"""Entry point of the engine's child processes: `python -m radixlm.runtime.processes.child <role> <fd>`.

Reads `{"args": ServerArgs fields, "ports": PortArgs fields, "rank": RankSpec fields}` as JSON
from stdin ("ports" absent for a follower, "rank" absent at TP=1) and runs the role's loop
(`scheduler`, `detokenizer`, or `tp_follower`: a tensor-parallel rank other than 0); readiness (or
the startup error) goes to file descriptor <fd> as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


class ReadyPipe:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, msg: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(msg) + "\n").encode())
        os.close(self.fd)


def main() -> None:
    role, fd = sys.argv[1], int(sys.argv[2])
    config = json.loads(sys.stdin.read())
    from radixlm.runtime.distributed.group import RankSpec
    from radixlm.runtime.processes.ipc import PortArgs
    from radixlm.runtime.server_args import ServerArgs

    args = ServerArgs(**config["args"])
    rank = RankSpec(**config["rank"]) if "rank" in config else None
    pipe = ReadyPipe(fd)
    if role == "tp_follower":
        from radixlm.runtime.distributed.rank_process import run_follower_process

        assert rank is not None
        run_follower_process(args, rank, pipe)
        return
    ports = PortArgs(**config["ports"])
    if role == "scheduler":
        from radixlm.runtime.scheduler.process import run_scheduler_process

        run_scheduler_process(args, ports, pipe, rank)
    elif role == "detokenizer":
        from radixlm.runtime.frontend.detokenizer import run_detokenizer_process

        run_detokenizer_process(args, ports, pipe)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
