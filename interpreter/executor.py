"""`StreamExecutor`: runs one program state's expressions, in order, on its own worker thread.

`s += expr` only enqueues (`submit`), so the program keeps going while the model works; reading
a variable (`get_var`) blocks until the expression that sets it has run. Forks are new executors
that start from a copy of this one's text, messages and variables.

Threading and ownership:
- The worker thread is the only writer of the text, spans, messages, variables and meta info
  (except `set_var`), always under `self._cond`'s lock; other threads read them under the lock.
  Role bookkeeping (`_cur_role`, scope positions) is touched by the worker only.
- `self._cond` is notified on every change (text grows, variable set, finished), which is what
  streaming (`text_iter`) and the live notebook view wait on; `_version` counts the changes.
- After an error the worker stops, records it, and releases every waiter; later submits are
  dropped (their variables become "ready" and reading them raises the program's error).
- `end()` enqueues a sentinel: the worker exits after the work already queued.
"""

from __future__ import annotations

import collections
import contextvars
import itertools
import queue
import threading
import uuid
from typing import Any

from radixlm.interpreter.backend import Backend
from radixlm.interpreter.nodes import NodeRunner, describe
from radixlm.interpreter.spans import Span, SubmitSite, program_error
from radixlm.lang.errors import LangError, ProgramError, VariableNotFoundError
from radixlm.lang.ir import CommitLazy, Expr, variable_name, walk
from radixlm.lang.sampling import SamplingParams

_END = object()
_ids = itertools.count()


class StreamExecutor(NodeRunner):
    """Executes the expressions of one program state; see the module docstring for the rules."""

    def __init__(
        self,
        backend: Backend,
        default_params: SamplingParams,
        *,
        stream: bool = False,
        program_name: str = "program",
        num_api_spec_tokens: int | None = None,
    ) -> None:
        self.sid = uuid.uuid4().hex
        self.num_api_spec_tokens = num_api_spec_tokens
        self.speculated_text = ""  # see speculative.py
        self.backend = backend
        self.default_params = default_params
        self.stream = stream
        self.program_name = program_name
        self.chat_template = backend.chat_template

        self._cond = threading.Condition()
        self.text_ = ""
        self.spans: list[Span] = []
        self.messages_: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.variable_event: dict[str, threading.Event] = {}
        self.error_: BaseException | None = None
        self._program_error: ProgramError | None = None
        self.finished = False
        self._version = 0
        self._pending = 0
        self._dead = False
        self._ended = False
        self._end_reason: str | None = None
        self._children: list[StreamExecutor] = []

        self._cur_role: str | None = None
        self._cur_role_begin_pos = 0
        self._scope_start: dict[str, list[int]] = {}
        self.fork_start_text_pos = 0

        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # NOTE: worker thread only: queue items taken early by `lookahead`, run before the queue.
        self._taken: collections.deque[Any] = collections.deque()
        self._ahead: list[Expr] = []  # the rest of the expression being run
        ctx = contextvars.copy_context()
        self._worker = threading.Thread(
            target=ctx.run, args=(self._work,), name=f"radixlm-exec-{next(_ids)}", daemon=True
        )
        self._worker.start()

    # ---- called from the program's thread -------------------------------------------------

    def submit(self, expr: Expr, site: SubmitSite | None = None) -> None:
        names = [n for n in map(variable_name, walk(expr)) if n is not None]
        with self._cond:
            if self._ended:
                raise LangError(
                    self._end_reason
                    or f"program {self.program_name!r} has finished; its state is read-only"
                )
            for name in names:
                self.variable_event[name] = threading.Event()
            if names:
                self._cond.notify_all()  # `require_var` waits for names to appear
            if self._dead:  # the worker stopped on an error: nothing will run, release readers
                for name in names:
                    self.variable_event[name].set()
                return
            self._pending += 1
        self._queue.put((expr, site))

    def end(self, reason: str | None = None) -> None:
        """No more expressions: the worker exits after the queued ones (idempotent). `reason`:
        what a later `submit` says (default: the program has finished)."""
        with self._cond:
            if self._ended:
                return
            self._ended = True
            self._end_reason = reason
            self._cond.notify_all()  # `require_var` waits for the program's code to end
            children = list(self._children)
        self._queue.put(_END)
        for child in children:
            child.end()

    def sync(self) -> None:
        """Wait until every submitted expression has run (or the executor failed)."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0 or self._dead)

    def get_var(self, name: str) -> Any:
        event = self.variable_event.get(name)
        if event is not None:
            event.wait()
        with self._cond:
            if name in self.variables:
                return self.variables[name]
        self.raise_if_failed()
        raise VariableNotFoundError(f"program {self.program_name!r} has no variable {name!r}")

    def require_var(self, name: str, timeout: float | None = None) -> None:
        """Raise VariableNotFoundError unless `name` is (or, while a streaming program still runs,
        becomes) a variable of this state."""
        with self._cond:
            self._cond.wait_for(
                lambda: name in self.variables or name in self.variable_event
                or not (self.stream and not self._ended and not self._dead),
                timeout,
            )  # fmt: skip
            if name in self.variables or name in self.variable_event:
                return
        self.raise_if_failed()
        raise VariableNotFoundError(f"program {self.program_name!r} has no variable {name!r}")

    def set_var(self, name: str, value: Any) -> None:
        with self._cond:
            self.variables[name] = value
            self._changed()

    def get_meta_info(self, name: str, timeout: float | None = None) -> Any:
        self.require_var(name, timeout)
        event = self.variable_event.get(name)
        if event is not None and not event.wait(timeout):
            raise TimeoutError(f"timed out waiting for variable {name!r}")
        with self._cond:
            return self.meta_info.get(name)

    def fork(self, size: int) -> list[StreamExecutor]:
        size = int(size)
        if size < 1:
            raise ValueError(f"fork size must be >= 1, got {size}")
        if size > 1:
            # Put the shared prefix in the runtime's cache once, before the forks race to it.
            # NOTE: submitted unconditionally: `self.text_` may still be growing on the worker.
            self.submit(CommitLazy())
        self.sync()
        self.raise_if_failed()
        children = []
        for _ in range(size):
            child = StreamExecutor(
                self.backend,
                self.default_params,
                stream=self.stream,
                program_name=self.program_name,
            )
            with self._cond:
                child.text_ = self.text_
                child.spans = list(self.spans)
                child.messages_ = list(self.messages_)
                child.variables = dict(self.variables)
                child.meta_info = dict(self.meta_info)
            child._cur_role = self._cur_role
            child._cur_role_begin_pos = self._cur_role_begin_pos
            child.fork_start_text_pos = len(child.text_)
            children.append(child)
        with self._cond:
            self._children.extend(children)
        return children

    def record_program_exception(self, exc: BaseException) -> None:
        """The program's own code raised: remember it as the state's error."""
        with self._cond:
            if self.error_ is None:
                self.error_ = exc
            self._changed()

    def error(self) -> BaseException | None:
        self.sync()
        return self.error_

    def program_error(self) -> BaseException | None:
        """The error to raise for this state: the program's own exception, or a ProgramError."""
        with self._cond:
            if self._program_error is not None:
                return self._program_error
            return self.error_

    def raise_if_failed(self) -> None:
        err = self.program_error()
        if err is not None:
            raise err

    def snapshot(self) -> tuple[list[Span], BaseException | None, bool, int]:
        """(spans, error, finished, version), consistent with each other."""
        with self._cond:
            return list(self.spans), self.error_, self.finished, self._version

    def wait_change(self, version: int, timeout: float | None = None) -> int:
        """Block until the state changed after `version` (or finished); return the new version."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != version or self.finished, timeout)
            return self._version

    # ---- the worker thread ----------------------------------------------------------------

    def _changed(self) -> None:  # caller holds self._cond
        self._version += 1
        self._cond.notify_all()

    def _work(self) -> None:
        while True:
            item = self._taken.popleft() if self._taken else self._queue.get()
            if item is _END:
                break
            expr, site = item
            try:
                nodes = list(walk(expr))
                for i, node in enumerate(nodes):
                    self._ahead = nodes[i + 1 :]
                    self._execute(node)
            except BaseException as e:  # recorded; surfaces where the state is read
                self._fail(e, expr, site)
                break
            with self._cond:
                self._pending -= 1
                self._changed()
        with self._cond:
            self.finished = True
            self._changed()

    def lookahead(self) -> list[Expr]:
        """The nodes the program has already sent after the running one: the rest of its
        expression, then the expressions queued behind it (taken off the queue, run in order)."""
        while True:
            try:
                self._taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        out = list(self._ahead)
        for item in self._taken:
            if item is _END:
                break
            out.extend(walk(item[0]))
        return out

    def _fail(self, exc: BaseException, expr: Expr, site: SubmitSite | None) -> None:
        what = describe(expr)
        with self._cond:
            self._dead = True
            if self.error_ is None:
                self.error_ = exc
                self._program_error = program_error(self.program_name, what, site, exc)
            events = list(self.variable_event.values())
            self._changed()
        for event in events:
            event.set()
