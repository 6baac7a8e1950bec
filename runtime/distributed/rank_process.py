"""The process of one tensor-parallel rank: `join_group` (shared by rank 0's scheduler process,
scheduler/process.py) and `run_follower_process` (ranks 1..N-1, processes/child.py's
`tp_follower` role).

A follower process: join the group, build its `ModelRunner` (a collective with every other rank's),
report readiness, then follow rank 0 (follower.py). It exits 0 when rank 0 stops in
order, 1 on any failure, after storing its error for rank 0's watchdog (group.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from radixlm.runtime.distributed.group import GroupWatchdog, RankSpec, init_group, rank_device
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


def join_group(
    args: ServerArgs, spec: RankSpec, on_failure: Callable[[str], None]
) -> tuple[ServerArgs, GroupWatchdog]:
    """This rank's args (its device) after joining the group; its watchdog is running."""
    args = args.replace(device=rank_device(args.resolved().device or "cpu", spec.local_rank))
    init_group(spec, args.device or "cpu")
    return args, GroupWatchdog(spec, on_failure)


def _exit_on_failure(message: str) -> None:
    if message:
        logger.error("stopping: %s", message)
        os._exit(1)
    os._exit(0)  # rank 0 stopped in order


def run_follower_process(args: ServerArgs, spec: RankSpec, pipe: Any) -> None:
    from radixlm.runtime.distributed.follower import Follower
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.models.loader import resolve_model
    from radixlm.runtime.processes.process_utils import configure_child_process

    configure_child_process(f"tp-rank-{spec.rank}", args.log_level)
    watchdog = None
    try:
        args, watchdog = join_group(args, spec, _exit_on_failure)
        runner = ModelRunner(args, resolve_model(args.model_path, args.load_format))
    except Exception as exc:
        logger.exception("tensor-parallel rank %d failed to start", spec.rank)
        _report(watchdog, exc)
        pipe.send({"status": "error", "error": f"rank {spec.rank}: {type(exc).__name__}: {exc}"})
        raise SystemExit(1) from exc
    pipe.send({"status": "ready", "pid": os.getpid()})
    try:
        Follower(runner).run()
    except Exception as exc:
        logger.exception("tensor-parallel rank %d failed", spec.rank)
        _report(watchdog, exc)
        raise SystemExit(1) from exc


def _report(watchdog: GroupWatchdog | None, exc: Exception) -> None:
    if watchdog is not None:
        with contextlib.suppress(Exception):  # rank 0's store may be gone already
            watchdog.report_error(f"{type(exc).__name__}: {exc}")
