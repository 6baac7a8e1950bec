"""`ProgramState` (the `s` a program receives, and what `run` returns) and fork groups.

Ownership/threading: a state is a thin handle on its `StreamExecutor`, which owns all the data
and the locking (see `executor.py`). Appending (`s += ...`) is meant for the program's own thread;
reads (`s["x"]`, `text()`, `text_iter()`) are safe from any thread and block until ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from radixlm.interpreter.cancel import RequestScope
from radixlm.interpreter.executor import StreamExecutor
from radixlm.interpreter.spans import SubmitSite
from radixlm.lang.ir import ConcatAndAppend, Expr, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd
from radixlm.lang.ir import as_expr as _as_expr


class ProgramState:
    """The state of a running or finished program."""

    def __init__(self, executor: StreamExecutor) -> None:
        self.executor = executor
        self.ret_value: Any = None
        # The requests of `run(stream=True)`: Ctrl-C while reading `text_iter` aborts them.
        self.request_scope: RequestScope | None = None

    @property
    def stream_executor(self) -> StreamExecutor:  # SGLang's attribute name
        return self.executor

    # ---- building -------------------------------------------------------------------------

    def __iadd__(self, other: object) -> ProgramState:
        self.executor.submit(_as_expr(other), SubmitSite.capture())
        return self

    def _role_common(self, role: str, expr: object | None) -> Any:
        if expr is not None:
            self.executor.submit(
                RoleBegin(role) + _as_expr(expr) + RoleEnd(role), SubmitSite.capture(3)
            )
            return None
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self.executor.submit(RoleBegin(role), SubmitSite.capture(3))
        yield
        self.executor.submit(RoleEnd(role), SubmitSite.capture(3))

    def system(self, expr: object | None = None) -> Any:
        """`s.system("...")` appends a message; `with s.system():` wraps what is appended inside."""
        return self._role_common("system", expr)

    def user(self, expr: object | None = None) -> Any:
        return self._role_common("user", expr)

    def assistant(self, expr: object | None = None) -> Any:
        return self._role_common("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block is also stored in variable `name`."""
        self.executor.submit(VarScopeBegin(name), SubmitSite.capture(3))
        yield
        self.executor.submit(VarScopeEnd(name), SubmitSite.capture(3))

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> ProgramStateGroup:
        """`size` copies of this state that continue independently (sharing the cached prefix)."""
        return ProgramStateGroup([ProgramState(e) for e in self.executor.fork(size)], self)

    @contextmanager
    def copy(self) -> Iterator[ProgramState]:
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    # ---- reading --------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        return self.executor.get_var(name)

    get_var = __getitem__

    def __setitem__(self, name: str, value: Any) -> None:
        self.executor.set_var(name, value)

    set_var = __setitem__

    def __contains__(self, name: str) -> bool:
        return name in self.executor.variables

    def get_meta_info(self, name: str) -> Any:
        """The runtime's meta info for variable `name` (tokens, cached_tokens, logprobs, ...)."""
        return self.executor.get_meta_info(name)

    def text(self) -> str:
        """The full text so far (waits for the expressions already appended)."""
        self.executor.sync()
        return self.executor.text_

    def messages(self) -> list[dict[str, str]]:
        """The chat messages so far, OpenAI-style `[{"role", "content"}]`."""
        self.executor.sync()
        with self.executor._cond:
            return [dict(m) for m in self.executor.messages_]

    def sync(self) -> None:
        self.executor.sync()

    def error(self) -> BaseException | None:
        """The exception that stopped this program, or None."""
        return self.executor.error()

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yield the text (or variable `var_name`) piece by piece as it is generated.

        On a non-streaming state, yields the whole text (or value) once. Raises the program's
        error after the last piece if it failed.
        """
        exe = self.executor
        if not exe.stream:
            yield self.text() if var_name is None else str(self.get_var(var_name))
            return
        try:
            if var_name is not None:
                exe.require_var(var_name)  # NOTE: waits while the program may still append it
            seen, version = 0, -1
            while True:
                version = exe.wait_change(version)
                current, done = self._current(var_name)
                if current is not None and len(current) > seen:
                    yield current[seen:]
                    seen = len(current)
                if done:
                    break
        except KeyboardInterrupt:
            if self.request_scope is not None:
                self.request_scope.cancel()  # Ctrl-C aborts the streamed program's requests
            raise
        exe.raise_if_failed()

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio code (waits in a thread, never blocks the event loop)."""
        loop = asyncio.get_running_loop()
        exe = self.executor
        if var_name is not None:
            await loop.run_in_executor(None, exe.require_var, var_name)
        if not exe.stream:
            value = await loop.run_in_executor(
                None, lambda: self.text() if var_name is None else str(self.get_var(var_name))
            )
            yield (value, self.get_meta_info(var_name)) if return_meta_data and var_name else value
            return
        seen, version = 0, -1
        while True:
            version = await loop.run_in_executor(None, exe.wait_change, version, 1.0)
            current, done = self._current(var_name)
            if current is not None and len(current) > seen:
                piece, seen = current[seen:], len(current)
                if return_meta_data and var_name is not None:
                    yield piece, exe.meta_info.get(var_name)
                else:
                    yield piece
            if done:
                break
        exe.raise_if_failed()

    def _current(self, var_name: str | None) -> tuple[str | None, bool]:
        """(text or variable value so far, whether it is complete)."""
        exe = self.executor
        with exe._cond:
            if var_name is None:
                return exe.text_, exe.finished
            value = exe.variables.get(var_name)
            event = exe.variable_event.get(var_name)
            done = exe.finished or (event is not None and event.is_set())
            return (None if value is None else str(value)), done

    # ---- display --------------------------------------------------------------------------

    def _repr_html_(self) -> str:
        from radixlm.interpreter.html import render_state

        return render_state(self)

    def display(self, interval: float = 0.1) -> ProgramState:
        """Show the state in a notebook, updating in place until the program finishes."""
        from radixlm.interpreter.html import display_live

        display_live(self, interval)
        return self

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The states returned by `s.fork(n)`: index them, append to all, and `join()`."""

    def __init__(self, states: list[ProgramState], src_state: ProgramState) -> None:
        self.states = states
        self.src_state = src_state

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        # `forks[i] += ...` rebinds the item to the same state.
        if value is not self.states[i]:
            raise TypeError("fork states cannot be replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(
        self, other: Callable[[int], object] | Sequence[object] | Expr | str
    ) -> ProgramStateGroup:
        """Append to every fork: one expression, a list (one per fork), or a function of the index."""
        for i, state in enumerate(self.states):
            if callable(other) and not isinstance(other, Expr):
                item = other(i)
            elif isinstance(other, (list, tuple)):
                item = other[i]
            else:
                item = other
            state.executor.submit(_as_expr(item), SubmitSite.capture())
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for the forks. `gather_variable`: new fork variables become lists on the source
        state; `concate_and_append`: the text each fork added is appended to the source state."""
        if mode == "gather_variable":
            src = self.src_state.executor
            known = set(src.variables)
            for state in self.states:
                state.executor.sync()
                state.executor.raise_if_failed()
                with state.executor._cond:
                    new = {k: v for k, v in state.executor.variables.items() if k not in known}
                with src._cond:
                    for name, value in new.items():
                        src.variables.setdefault(name, []).append(value)
        elif mode == "concate_and_append":
            self.src_state += ConcatAndAppend(tuple(self.states))
            self.src_state.executor.sync()
        else:
            raise ValueError(f"unknown join mode {mode!r} (gather_variable | concate_and_append)")
        for state in self.states:
            state.executor.end(
                "this fork was joined: it takes no more expressions (append to the state it was"
                " forked from, or fork again)"
            )
