"""What each IR node does to a program state: the executor's worker-thread half.

`NodeRunner` is mixed into `StreamExecutor`; its methods run only on the executor's worker thread
(see `executor.py` for the locking rules: every write to the shared fields happens under
`self._cond`, and `_changed()` is called with it held).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from radixlm.formats.reasoning import split_reasoning
from radixlm.interpreter.spans import Span
from radixlm.interpreter.speculative import (
    can_speculate,
    consume_constant,
    format_regex,
    speculative_gen,
)
from radixlm.lang.errors import LangError
from radixlm.lang.ir import (
    CommitLazy,
    ConcatAndAppend,
    ConstantText,
    Expr,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Variable,
    VarScopeBegin,
    VarScopeEnd,
    walk,
)

if TYPE_CHECKING:
    from radixlm.interpreter.backend import Backend
    from radixlm.interpreter.executor import StreamExecutor
    from radixlm.lang.chat_template import ChatTemplate
    from radixlm.lang.sampling import SamplingParams


class NodeRunner:
    """Node handlers; the state they act on is defined by `StreamExecutor`."""

    backend: Backend
    chat_template: ChatTemplate
    default_params: SamplingParams
    stream: bool
    _cond: threading.Condition
    text_: str
    spans: list[Span]
    messages_: list[dict[str, str]]
    variables: dict[str, Any]
    meta_info: dict[str, Any]
    variable_event: dict[str, threading.Event]
    _cur_role: str | None
    _cur_role_begin_pos: int
    _scope_start: dict[str, list[int]]  # NOTE: a stack per name: scopes of one name may nest
    num_api_spec_tokens: int | None
    speculated_text: str

    def _changed(self) -> None:
        raise NotImplementedError

    def get_var(self, name: str) -> Any:
        raise NotImplementedError

    def _execute(self, node: Expr) -> None:
        if isinstance(node, ConstantText):
            self._fill(node.value, "text")
        elif isinstance(node, Gen):
            self._gen(node)
        elif isinstance(node, Select):
            self.speculated_text = ""  # NOTE: the choice may differ from the speculated text
            decision = self.backend.select(
                self.text_, node.choices, node.temperature, node.choices_method
            )
            self._fill(decision.decision, "select", node.name)
            self._set_result(node.name, decision.decision, decision.meta_info)
        elif isinstance(node, RoleBegin):
            self._role_begin(node.role)
        elif isinstance(node, RoleEnd):
            self._role_end(node.role)
        elif isinstance(node, Variable):
            self._fill(str(self.get_var(node.name)), "text")
        elif isinstance(node, VarScopeBegin):
            self._scope_start.setdefault(node.name, []).append(len(self.text_))
        elif isinstance(node, VarScopeEnd):
            starts = self._scope_start[node.name]
            start = starts.pop()
            if not starts:
                del self._scope_start[node.name]
            self._set_result(node.name, self.text_[start:], None)
        elif isinstance(node, CommitLazy):
            if self.text_:
                self.backend.cache_prefix(self.text_)
        elif isinstance(node, SeparateReasoning):
            self._separate_reasoning(node)
        elif isinstance(node, ConcatAndAppend):
            pieces = []
            for state in node.states:
                child: StreamExecutor = state.executor
                child.sync()
                child.raise_if_failed()
                pieces.append(child.text_[child.fork_start_text_pos :])
            self._fill("".join(pieces), "text")
        else:
            raise TypeError(f"unknown expression {node!r}")

    def _fill(self, value: str, kind: str, name: str | None = None) -> None:
        if self.speculated_text and kind not in ("gen", "select"):
            self.speculated_text = consume_constant(self.speculated_text, value)
        with self._cond:
            self.text_ += value
            last = self.spans[-1] if self.spans else None
            if (
                kind == "text"
                and last is not None
                and last.kind == "text"
                and last.role == self._cur_role
            ):
                self.spans[-1] = last.extend(value)
            elif value or kind in ("gen", "select"):
                self.spans.append(Span(kind, value, self._cur_role, name))
            self._changed()

    def _set_result(self, name: str | None, value: Any, meta: Any) -> None:
        if name is None:
            return
        with self._cond:
            self.variables[name] = value
            self.meta_info[name] = meta
            self._changed()
        self.variable_event[name].set()

    def _gen(self, node: Gen) -> None:
        params = self.default_params.merge(node.params).with_extra_stop(self.chat_template.stop_str)
        if not self.stream:
            if self.num_api_spec_tokens is not None and can_speculate(params, self._cur_role):
                text, meta, self.speculated_text = speculative_gen(
                    self.backend, self.text_, params, self.speculated_text,
                    self.num_api_spec_tokens, lambda: self._spec_format(params),
                )  # fmt: skip
            else:
                text, meta = self.backend.generate(self.text_, params)
            self._fill(text, "gen", node.name)
            self._set_result(node.name, text, meta)
            return
        self._fill("", "gen", node.name)
        value, meta = "", None
        for delta, meta in self.backend.generate_stream(self.text_, params):
            value += delta
            with self._cond:
                self.text_ += delta
                self.spans[-1] = self.spans[-1].extend(delta)
                if node.name is not None:
                    self.variables[node.name] = value
                    self.meta_info[node.name] = meta
                self._changed()
        self._set_result(node.name, value, meta)

    def lookahead(self) -> list[Expr]:
        return []  # StreamExecutor: the nodes already sent after the running one

    def _spec_format(self, params: SamplingParams) -> str | None:
        """The regex a speculative request for this gen follows (speculative.py)."""
        ahead: list[tuple[str, Any]] = []
        for node in self.lookahead():
            if isinstance(node, ConstantText):
                ahead.append(("text", node.value))
            elif isinstance(node, Gen):
                nxt = self.default_params.merge(node.params)
                ahead.append(("gen", nxt if can_speculate(nxt, self._cur_role) else None))
            else:
                break
        return format_regex(params, ahead)

    def _separate_reasoning(self, node: SeparateReasoning) -> None:
        value = str(self.get_var(node.name))
        reasoning, content = split_reasoning(value, node.model_type)
        with self._cond:
            # NOTE: the gen's text is the end of the state's text (this node follows it).
            if self.text_.endswith(value):
                self.text_ = self.text_[: len(self.text_) - len(value)] + content
                # Spans partition the text: the gen's span keeps the answer only.
                for k in range(len(self.spans) - 1, -1, -1):
                    span = self.spans[k]
                    if span.kind in ("gen", "select") and span.name == node.name:
                        self.spans[k] = replace(span, text=content)
                        break
            self.variables[node.name] = content
            self._changed()
        self._set_result(node.reasoning_name, reasoning or "", None)

    def _role_begin(self, role: str) -> None:
        if self._cur_role is not None:
            raise LangError(f"cannot open a {role!r} message inside a {self._cur_role!r} message")
        default = self.chat_template.default_system_prompt
        if not self.messages_ and role != "system" and default is not None:
            self._role_begin("system")
            self._fill(default, "text")
            self._role_end("system")
        prefix, _ = self.chat_template.get_prefix_and_suffix(role)
        self._cur_role = role
        self._fill(prefix, "role_begin")
        self._cur_role_begin_pos = len(self.text_)

    def _role_end(self, role: str) -> None:
        if self._cur_role != role:
            raise LangError(
                f"{role}_end() without a matching {role}_begin() (open: {self._cur_role})"
            )
        content = self.text_[self._cur_role_begin_pos :].lstrip()
        _, suffix = self.chat_template.get_prefix_and_suffix(role)
        self._fill(suffix, "role_end")
        self._cur_role = None
        with self._cond:
            self.messages_.append({"role": role, "content": content})
            self._changed()


def describe(expr: Expr) -> str:
    """A short name of the expression, for error messages (`gen('answer')`)."""
    for node in walk(expr):
        if isinstance(node, Gen):
            return f"gen({node.name!r})" if node.name else "gen()"
        if isinstance(node, Select):
            return f"select({node.name!r})" if node.name else "select()"
    return type(expr).__name__
