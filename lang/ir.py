"""The intermediate representation: the expressions a program appends to its state.

A program builds expressions with the primitives (`gen`, `select`, `user`, ...) and Python's `+`
(`"Q: " + gen("a")` is an `ExprList`), and appends them with `s += expr`. The interpreter's
executor runs them in order; the tracer records them to find a batch's shared prefix.

Ownership: every node is an immutable value (frozen dataclass), safe to share between threads and
between the states of a batch. `ConcatAndAppend` holds references to fork states, which the
interpreter owns; the node itself never mutates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.lang.choices import ChoicesSamplingMethod
from radixlm.lang.sampling import SamplingParams


class Expr:
    """Base of all nodes. `a + b` concatenates (flattening nested lists); strings become constants."""

    __slots__ = ()

    def __add__(self, other: object) -> ExprList:
        return concat(self, as_expr(other))

    def __radd__(self, other: object) -> ExprList:
        return concat(as_expr(other), self)


def as_expr(value: object) -> Expr:
    """A node as is; a `str` as `ConstantText`. Anything else is a `TypeError`.

    # NOTE: non-strings are rejected on purpose (not `str()`-ed): an accidental `s += 3` or a tracer
    # placeholder must not silently become text.
    """
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return ConstantText(value)
    if value is None:
        raise ValueError("cannot append None to a program state")
    raise TypeError(
        f"expected a string or a radixlm expression, got {type(value).__name__}: {value!r}"
    )


def concat(a: Expr, b: Expr) -> ExprList:
    left = a.exprs if isinstance(a, ExprList) else (a,)
    right = b.exprs if isinstance(b, ExprList) else (b,)
    return ExprList(left + right)


@dataclass(frozen=True)
class ExprList(Expr):
    """A sequence of nodes run in order."""

    exprs: tuple[Expr, ...]


@dataclass(frozen=True)
class ConstantText(Expr):
    """Literal text appended to the state."""

    value: str


@dataclass(frozen=True)
class Gen(Expr):
    """Generate text with the model and store it in variable `name` (if given)."""

    name: str | None
    params: SamplingParams


@dataclass(frozen=True)
class Select(Expr):
    """Pick one of `choices` by scoring each with the model; store it in variable `name`."""

    name: str | None
    choices: tuple[str, ...]
    temperature: float
    choices_method: ChoicesSamplingMethod


@dataclass(frozen=True)
class RoleBegin(Expr):
    """Open a chat message of `role` (appends the chat template's prefix)."""

    role: str


@dataclass(frozen=True)
class RoleEnd(Expr):
    """Close the chat message of `role` (appends the chat template's suffix)."""

    role: str


@dataclass(frozen=True)
class Variable(Expr):
    """The value of variable `name` of the same state, appended as text (used in traces)."""

    name: str


@dataclass(frozen=True)
class VarScopeBegin(Expr):
    """Start capturing all text appended until the matching `VarScopeEnd` into variable `name`."""

    name: str


@dataclass(frozen=True)
class VarScopeEnd(Expr):
    name: str


@dataclass(frozen=True)
class CommitLazy(Expr):
    """Send the state's text to the backend's prefix cache now (before a fork fans out)."""


@dataclass(frozen=True, eq=False)
class ConcatAndAppend(Expr):
    """Append the text each fork state added after the fork point (`join("concate_and_append")`)."""

    states: tuple[Any, ...]


@dataclass(frozen=True)
class SeparateReasoning(Expr):
    """Split the `<think>` section off variable `name` (a `gen` that just ran): the variable and
    the state's text keep the answer, `{name}_reasoning_content` gets the reasoning."""

    name: str
    model_type: str

    @property
    def reasoning_name(self) -> str:
        return f"{self.name}_reasoning_content"


# Nodes that set a variable when they run (the executor creates a ready-event for each).
VARIABLE_NODES = (Gen, Select, VarScopeBegin)


def variable_name(expr: Expr) -> str | None:
    """The variable a node sets, if any."""
    if isinstance(expr, VARIABLE_NODES):
        return expr.name
    if isinstance(expr, SeparateReasoning):
        return expr.reasoning_name
    return None


def walk(expr: Expr):
    """Yield the leaf nodes of `expr` in execution order (flattening `ExprList`s)."""
    if isinstance(expr, ExprList):
        for child in expr.exprs:
            yield from walk(child)
    else:
        yield expr
