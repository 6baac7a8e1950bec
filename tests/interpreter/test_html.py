"""The notebook view: escaped text, separated roles, highlighted generations, live updates."""

from __future__ import annotations

import re
import threading

import radixlm.interpreter.api as rl
from radixlm.interpreter.html import render_spans
from radixlm.interpreter.spans import Span


def test_roles_are_blocks_template_markup_hidden_and_text_escaped(make_fake):
    backend = make_fake(reply=lambda t, p: "<b>bold</b> & co")

    @rl.function
    def chat(s):
        s += "<raw & plain>\n"
        s += rl.user("Is 1 < 2?")
        s += rl.assistant(rl.gen("answer"))

    html = chat.run(backend=backend)._repr_html_()
    assert "&lt;raw &amp; plain&gt;" in html and "<raw" not in html
    assert html.count('class="rl-msg"') == 3  # default system, user, assistant
    assert re.search(r'class="rl-role">user</div><div class="rl-body">Is 1 &lt; 2\?', html)
    assert '<span class="rl-gen" title="gen answer">&lt;b&gt;bold&lt;/b&gt; &amp; co</span>' in html
    body_text = re.sub(r"<[^>]+>", "", html.split("</style>")[1])
    assert "im_start" not in body_text  # role markup lives in a tooltip, not in the text
    assert "running" not in html


def test_error_and_running_status():
    html = render_spans([Span("text", "x")], ValueError("bad <thing>"), running=True)
    assert "ValueError: bad &lt;thing&gt;" in html and "running…" in html
    html = render_spans(
        [Span("role_begin", "<|im_start|>user\n", "user"), Span("text", "open", "user")]
    )
    assert html.count("<div") == html.count("</div>")  # an unclosed message is still closed


def test_display_updates_one_output_in_place(make_fake, monkeypatch):
    import IPython.display  # test extras (ipykernel): never skipped

    shown, updates = [], []
    updated = threading.Event()

    class Handle:
        def update(self, obj):
            updates.append(obj.data)
            updated.set()

    def after_an_update(i: int) -> None:  # each character waits for the output to be updated
        if i and not updated.wait(60):
            raise AssertionError("the output was never updated while the program ran")
        updated.clear()

    def fake_display(obj, display_id=False):
        shown.append(obj.data)
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    backend = make_fake(reply=lambda t, p: "streamed text", before_chunk=after_an_update)

    @rl.function
    def prog(s):
        s += rl.assistant(rl.gen("answer"))

    state = prog.run(backend=backend, stream=True).display(interval=0.01)
    assert len(shown) == 1 and len(updates) >= len("streamed text")
    assert "running" in updates[0]  # updated in place while it ran, then once finished
    assert "streamed text" in updates[-1] and "running" not in updates[-1]
    assert state["answer"] == "streamed text"
