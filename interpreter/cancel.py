"""`RequestScope`: the requests a program (and its forks), or a batch of programs, has in flight,
so that Ctrl-C in `run` / `run_batch` can abort them in the runtime.

Data flow: `run_program` / `run_program_batch` make a scope and make it current (a context
variable) on the threads that create executors; each executor's worker thread runs in a copy of
that context, so `NativeBackend` finds the scope there, tags each request with a fresh `rid`
(`begin`) and forgets it when the request ends (`end`). `cancel()` (on KeyboardInterrupt) marks
the scope cancelled, aborts every rid in flight through its backend, and makes any later request
of the scope raise `ProgramInterruptedError` instead of starting.

Threading: every method may be called from any thread (one lock guards the rid table).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from radixlm.lang.errors import LangError

logger = logging.getLogger(__name__)


class ProgramInterruptedError(LangError):
    """The program was interrupted (Ctrl-C): its requests were aborted, no new one starts."""


_current: ContextVar[RequestScope | None] = ContextVar("radixlm_request_scope", default=None)


def current_scope() -> RequestScope | None:
    return _current.get()


class RequestScope:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rids: dict[str, Any] = {}  # rid -> the backend it was sent to
        self.cancelled = False

    @contextlib.contextmanager
    def active(self) -> Iterator[RequestScope]:
        """Make this the current scope of this thread's context (executors created meanwhile
        copy it)."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def begin(self, backend: Any) -> str:
        with self._lock:
            if self.cancelled:
                raise ProgramInterruptedError("the program was interrupted; no new request starts")
            rid = uuid.uuid4().hex
            self._rids[rid] = backend
            return rid

    def end(self, rid: str) -> None:
        with self._lock:
            self._rids.pop(rid, None)

    def cancel(self) -> None:
        """Abort every request in flight; refuse later ones (idempotent)."""
        with self._lock:
            self.cancelled = True
            inflight = list(self._rids.items())
        for rid, backend in inflight:
            try:
                backend.abort_request(rid)
            except Exception:  # NOTE: best effort: the caller is propagating Ctrl-C
                logger.debug("aborting %s failed", rid, exc_info=True)
