"""Process helpers shared by the scheduler and detokenizer processes and their launcher."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

LOG_FORMAT = "[%(asctime)s %(processName)s] %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    root = logging.getLogger("radixlm")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, "%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(level.upper())


def configure_child_process(name: str, log_level: str) -> None:
    """Name the process, route logs, ignore Ctrl-C (the parent decides when children stop), and
    exit when the parent dies, so that no process is ever orphaned."""
    import multiprocessing

    multiprocessing.current_process().name = f"radixlm-{name}"
    configure_logging(log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    parent = os.getppid()

    def watch_parent() -> None:
        # NOTE: polling getppid works whichever thread started us (PR_SET_PDEATHSIG would fire
        # when the *thread* that spawned the child exits, which may be long before its process).
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
