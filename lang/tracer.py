"""Tracing: run a program on placeholder arguments to see what it appends without a model.

`extract_prefix_by_tracing` finds the constant text every run of a program starts with (the
prefix all programs of a batch share, e.g. a system prompt and few-shot examples): it runs the
function with `Argument` placeholders and a `TracerState` that records constant text and stops
(`StopTracing`) at the first thing whose value depends on the arguments or on the model. The
interpreter sends that prefix to the backend's cache once before fanning out a batch, as SGLang's
`cache_program` does.

Ownership/threading: a tracer state lives on the thread that traces; the "currently tracing" flag
is thread-local, so tracing on one thread never affects programs running on others.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.ir import (
    ConstantText,
    Expr,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    Variable,
    as_expr,
    walk,
)

if TYPE_CHECKING:
    from radixlm.lang.function import Function

_local = threading.local()


class StopTracing(BaseException):  # SGLang's name
    """Raised inside a traced program where its output stops being constant.

    # NOTE: a BaseException on purpose, so a program's own `except Exception:` cannot swallow it.
    """


def is_tracing() -> bool:
    """True while the current thread is tracing a program."""
    return getattr(_local, "depth", 0) > 0


@contextmanager
def tracing_scope() -> Iterator[None]:
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _stop(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise StopTracing


class Argument(Expr):
    """A placeholder for a program argument whose value is unknown while tracing.

    Like in SGLang it is an expression, so `"Q: " + question` still builds a node list (and the
    constant "Q: " before it counts as prefix); appending it, or any use that needs the value
    (str(), f-strings, len, comparisons, attributes, ...), stops the trace.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name)

    def __repr__(self) -> str:
        return f"Argument({self.name!r})"

    __str__ = __format__ = __mul__ = __rmul__ = _stop
    __len__ = __iter__ = __getitem__ = __contains__ = __bool__ = _stop
    __int__ = __float__ = __index__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _stop
    __getattr__ = __call__ = _stop
    __hash__ = object.__hash__


class TracerState:
    """Stands in for a `ProgramState` while tracing; records the nodes a program appends."""

    def __init__(self, chat_template: ChatTemplate, *, only_prefix: bool = True) -> None:
        self.chat_template = chat_template
        self.only_prefix = only_prefix
        self.nodes: list[Expr] = []
        self._num_messages = 0
        self._cur_role: str | None = None

    def __iadd__(self, other: object) -> TracerState:
        for node in walk(as_expr(other)):
            self._execute(node)
        return self

    def _execute(self, node: Expr) -> None:
        if isinstance(node, ConstantText):
            self.nodes.append(node)
        elif isinstance(node, RoleBegin):
            if self._num_messages == 0 and node.role != "system":
                default = self.chat_template.default_system_prompt
                if default is not None:
                    self._execute(RoleBegin("system"))
                    self._execute(ConstantText(default))
                    self._execute(RoleEnd("system"))
            self._cur_role = node.role
            self.nodes.append(ConstantText(self.chat_template.get_prefix_and_suffix(node.role)[0]))
        elif isinstance(node, RoleEnd):
            self.nodes.append(ConstantText(self.chat_template.get_prefix_and_suffix(node.role)[1]))
            self._num_messages += 1
            self._cur_role = None
        elif self.only_prefix:
            raise StopTracing
        else:
            self.nodes.append(node)

    def get_var(self, name: str) -> Variable:
        if self.only_prefix:
            raise StopTracing
        return Variable(name)

    __getitem__ = get_var

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self._execute(RoleBegin(role))
        yield
        self._execute(RoleEnd(role))

    def system(self, expr: object | None = None) -> Any:
        return self._role_common("system", expr)

    def user(self, expr: object | None = None) -> Any:
        return self._role_common("user", expr)

    def assistant(self, expr: object | None = None) -> Any:
        return self._role_common("assistant", expr)

    def _role_common(self, role: str, expr: object | None) -> Any:
        if expr is None:
            return self._role_scope(role)
        self += RoleBegin(role) + as_expr(expr) + RoleEnd(role)
        return None

    def __getattr__(self, name: str) -> Any:
        # fork, text, messages, var_scope, set_var, ...: their results depend on the model.
        raise StopTracing

    def prefix(self) -> str:
        """The constant text before the first non-constant node."""
        out = []
        for node in self.nodes:
            if not isinstance(node, ConstantText):
                break
            out.append(node.value)
        return "".join(out)

    def generation_nodes(self) -> list[Expr]:
        return [n for n in self.nodes if isinstance(n, (Gen, Select))]


def _placeholder_arguments(function: Function, given: Mapping[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {name: Argument(name) for name in function.arg_names}
    args.update(given)
    args.update(function.bind_arguments)
    return args


def trace_program(
    function: Function,
    chat_template: ChatTemplate,
    arguments: Mapping[str, Any] | None = None,
    *,
    only_prefix: bool = False,
) -> TracerState:
    """Trace `function` with `arguments` (placeholders for the rest); never raises StopTracing.

    An exception raised by the program itself while tracing also ends the trace (the nodes so
    far are kept): a trace is a best-effort look ahead, never an error.
    """
    tracer = TracerState(chat_template, only_prefix=only_prefix)
    args = _placeholder_arguments(function, arguments or {})
    with tracing_scope():
        try:
            function.func(tracer, **args)
        except StopTracing:
            pass
        except Exception:  # the program ran on placeholders; stop where it failed
            pass
    return tracer


def extract_prefix_by_tracing(function: Function, chat_template: ChatTemplate) -> str:
    """The constant text that every run of `function` starts with (SGLang's name)."""
    return trace_program(function, chat_template, only_prefix=True).prefix()
