"""Jupyter view of a program state: messages as separated blocks, generated text highlighted.

`render_state` builds static HTML from a snapshot of the state's spans (every piece of text is
escaped). `display_live` shows it in a notebook through an IPython display handle and updates the
same output in place as the program runs. IPython is imported only when displaying.

Threading: both read the executor's snapshot under its lock; `display_live` runs on the caller's
(the notebook cell's) thread and polls the executor's change counter.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from radixlm.interpreter.spans import Span

if TYPE_CHECKING:
    from radixlm.interpreter.state import ProgramState

_ROLE_COLORS = {"system": "#8e8e8e", "user": "#3b82f6", "assistant": "#16a34a"}
_STYLE = """<style>
.rl-state{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px;line-height:1.45}
.rl-msg{border-left:4px solid var(--rl-c);margin:6px 0;padding:2px 8px;background:rgba(127,127,127,.06)}
.rl-role{font-weight:600;color:var(--rl-c);font-size:11px;text-transform:uppercase;letter-spacing:.05em}
.rl-body,.rl-raw{white-space:pre-wrap;word-break:break-word}
.rl-gen{background:rgba(250,204,21,.35);border-radius:3px}
.rl-select{background:rgba(96,165,250,.35);border-radius:3px}
.rl-error{border-left:4px solid #dc2626;color:#dc2626;padding:2px 8px;white-space:pre-wrap}
.rl-status{color:#8e8e8e;font-size:11px}
</style>"""


def _piece(span: Span) -> str:
    text = html.escape(span.text)
    if span.kind in ("gen", "select"):
        title = html.escape(f"{span.kind} {span.name}" if span.name else span.kind, quote=True)
        return f'<span class="rl-{span.kind}" title="{title}">{text}</span>'
    return text


def render_spans(
    spans: list[Span], error: BaseException | None = None, running: bool = False
) -> str:
    """HTML for a sequence of spans: role blocks (template markup hidden) and plain text."""
    out = [_STYLE, '<div class="rl-state">']
    body: list[str] = []
    role: str | None = None

    def flush_plain() -> None:
        if body:
            out.append(f'<div class="rl-raw">{"".join(body)}</div>')
            body.clear()

    for span in spans:
        if span.kind == "role_begin":
            flush_plain()
            role = span.role
            color = _ROLE_COLORS.get(role or "", "#a855f7")
            out.append(
                f'<div class="rl-msg" style="--rl-c:{color}" title="{html.escape(span.text, quote=True)}">'
                f'<div class="rl-role">{html.escape(role or "")}</div><div class="rl-body">'
            )
        elif span.kind == "role_end":
            out.append("</div></div>")
            role = None
        elif role is not None:
            out.append(_piece(span))
        else:
            body.append(_piece(span))
    if role is not None:
        out.append("</div></div>")  # a message still open (running, or never closed)
    flush_plain()
    if error is not None:
        msg = html.escape(f"{type(error).__name__}: {error}")
        out.append(f'<div class="rl-error">{msg}</div>')
    if running:
        out.append('<div class="rl-status">running…</div>')
    out.append("</div>")
    return "".join(out)


def render_state(state: ProgramState) -> str:
    spans, error, finished, _ = state.executor.snapshot()
    return render_spans(spans, error, running=not finished)


def display_live(state: ProgramState, interval: float = 0.1) -> None:
    """Display `state` and keep updating the same output until the program finishes."""
    from IPython.display import HTML, display

    exe = state.executor
    handle = display(HTML(render_state(state)), display_id=True)
    version = -1
    while True:
        version = exe.wait_change(version, timeout=interval)
        spans, error, finished, _ = exe.snapshot()
        # `finished` is the worker's exit; a non-streaming state that was synced is done too.
        done = finished or (error is not None)
        if handle is not None:
            handle.update(HTML(render_spans(spans, error, running=not done)))
        if done:
            break
        time.sleep(interval)  # at most ~1/interval updates per second, however fast tokens come
