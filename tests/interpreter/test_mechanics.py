"""Interpreter mechanics on the in-memory FakeBackend: ordering, async appends, forks, errors,
streaming plumbing, batches, program-aware caching. (Programs on the real model: test_programs.py.)"""

from __future__ import annotations

import asyncio
import threading
import traceback

import pytest

import radixlm.interpreter.api as rl
from radixlm.interpreter.config import global_config
from radixlm.lang.errors import LangError, NoBackendError, ProgramError

SYS = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def test_append_is_asynchronous_and_reads_block(make_fake):
    gate = threading.Event()

    def hold(text, params):  # every gen waits until the program got past both appends
        if not gate.wait(60):
            raise AssertionError("the program never got past its appends: an append blocked")

    backend = make_fake(fail=hold)

    @rl.function
    def prog(s):
        s += "A:" + rl.gen("a")
        s += " B:" + rl.gen("b")
        gate.set()  # reached while the first gen still waits: the appends did not block
        assert s["a"] == "<1>"  # blocks until the first gen ran

    state = prog.run(backend=backend)
    assert state.text() == "A:<1> B:<2>"
    # each gen saw exactly the text before it
    assert [c[1] for c in backend.calls] == ["A:", "A:<1> B:"]


def test_roles_messages_and_default_system_prompt(fake):
    @rl.function
    def chat(s, q):
        s += rl.user(q)
        s += rl.assistant(rl.gen("answer"))
        with s.user():
            s += "more"
        s += rl.assistant_begin() + rl.gen("second") + rl.assistant_end()

    state = chat.run("hi", backend=fake)
    assert state.text().startswith(
        SYS + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<1>"
    )
    assert state.messages() == [
        {
            "role": "system",
            "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        },
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<1>"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "<2>"},
    ]
    # the end-of-turn string of the template is added to every gen's stop strings
    assert "<|im_end|>" in fake.calls[0][2].stop


def test_run_defaults_merge_with_gen_overrides(fake):
    @rl.function
    def prog(s):
        s += rl.gen("a", max_tokens=3, stop="\n") + rl.gen_int("n")

    prog.run(backend=fake, temperature=0.0, max_new_tokens=50)
    first, second = fake.calls[0][2], fake.calls[1][2]
    assert (first.temperature, first.max_new_tokens, first.stop[0]) == (0.0, 3, "\n")
    assert second.max_new_tokens == 50
    sampling, _ = second.to_native()
    assert sampling["regex"] == rl.REGEX_INT and sampling["temperature"] == 0.0


def test_fork_copies_state_caches_prefix_and_joins(fake):
    @rl.function
    def prog(s):
        s += "root:"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"[{i}]" + rl.gen("idea")
        s += " picked " + forks[1]["idea"]
        forks.join()

    state = prog.run(backend=fake)
    assert fake.calls[0] == ("cache_prefix", "root:", None)
    gen_texts = sorted(c[1] for c in fake.calls if c[0] == "generate")
    assert gen_texts == ["root:[0]", "root:[1]", "root:[2]"]
    assert state.text().startswith("root: picked <")
    assert sorted(state["idea"]) == ["<1>", "<2>", "<3>"]  # gather_variable: a list per name


def test_fork_group_append_forms_and_concat_join(fake):
    @rl.function
    def prog(s, contexts):
        s += "Facts:\n"
        forks = s.fork(len(contexts))
        forks += lambda i: f"{i}: " + contexts[i] + "\n"
        forks.join(mode="concate_and_append")
        s += "Q?"

    state = prog.run(contexts=["a", "b"], backend=fake)
    assert state.text() == "Facts:\n0: a\n1: b\nQ?"

    @rl.function
    def bad_join(s):
        s += "x"
        s.fork(2).join(mode="nope")

    with pytest.raises(ValueError, match="join mode"):
        bad_join.run(backend=fake)


def test_select_and_var_scope(make_fake):
    backend = make_fake(pick=lambda c: c[0])

    @rl.function
    def prog(s):
        with s.var_scope("block"):
            s += "x=" + rl.select("v", ["yes", "no"]) + ";"
        s += rl.gen("g", choices=["a", "b"])

    state = prog.run(backend=backend)
    assert state["v"] == "yes" and state["block"] == "x=yes;"
    assert state.get_meta_info("v") == {"method": "token_length_normalized"}
    assert state.text() == "x=yes;a"


def failing_backend(make_fake):
    def fail(text, params):
        if params.regex:
            raise ValueError("regex: constrained decoding not available")

    return make_fake(fail=fail)


def test_executor_error_names_the_program_line(make_fake):
    backend = failing_backend(make_fake)

    @rl.function
    def extract(s):
        s += "ok " + rl.gen("fine")
        s += rl.gen("bad", regex=r"\d+")  # the failing line

    with pytest.raises(ProgramError) as info:
        extract.run(backend=backend)
    err = info.value
    assert isinstance(err.__cause__, ValueError)
    assert "extract" in str(err) and "gen('bad')" in str(err)
    notes = "\n".join(getattr(err, "__notes__", []))
    assert "the failing line" in notes and "in extract" in notes


def test_error_read_inside_the_program_has_the_program_traceback(make_fake):
    backend = failing_backend(make_fake)

    @rl.function
    def reader(s):
        s += rl.gen("bad", regex="x")
        return s["bad"]

    with pytest.raises(ProgramError) as info:
        reader.run(backend=backend)
    names = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "reader" in names


def test_program_exception_propagates_unchanged(fake):
    @rl.function
    def broken(s):
        s += "a"
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine") as info:
        broken.run(backend=fake)
    assert "broken" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]


def test_batch_keeps_going_when_one_program_fails(make_fake):
    backend = failing_backend(make_fake)

    @rl.function
    def prog(s, i):
        s += f"{i}:" + rl.gen("out", regex=r"\d" if i == 2 else None)
        if i == 4:
            raise RuntimeError("program 4 fails itself")

    states = prog.run_batch([{"i": i} for i in range(6)], backend=backend, num_threads=3)
    assert [s.error() is None for s in states] == [True, True, False, True, False, True]
    assert isinstance(states[2].error(), ValueError)
    with pytest.raises(ProgramError):
        states[2]["out"]
    assert isinstance(states[4].error(), RuntimeError)
    assert states[4]["out"].startswith("<")  # set before the program raised
    assert all(s["out"].startswith("<") for k, s in enumerate(states) if k not in (2,))


def test_batch_precache_traces_the_shared_prefix(make_fake, capsys):
    few_shot = "Answer with one word.\n" + "Q: capital of France?\nA: Paris\n" * 3

    @rl.function
    def qa(s, question):
        s += few_shot + "Q: " + question + "\nA:" + rl.gen("answer")

    backend = make_fake()
    states = qa.run_batch([("x",), ("y",), ("z",)], backend=backend, progress_bar=True)
    assert [s["answer"] for s in states]
    caches = [c for c in backend.calls if c[0] == "cache_prefix"]
    assert caches == [("cache_prefix", few_shot + "Q: ", None)]
    assert "3/3" in capsys.readouterr().err  # the tqdm progress bar

    backend = make_fake()
    qa.run_batch([{"question": "x"}, {"question": "y"}], backend=backend, precache=False)
    assert not [c for c in backend.calls if c[0] == "cache_prefix"]
    global_config.enable_precache_with_tracing = False
    try:
        qa.run_batch([{"question": "x"}, {"question": "y"}], backend=backend)
        assert not [c for c in backend.calls if c[0] == "cache_prefix"]
    finally:
        global_config.enable_precache_with_tracing = True
    assert qa.cache(backend) == few_shot + "Q: "


def test_batch_generator_style_and_positional_arguments(fake):
    @rl.function
    def prog(s, a, b="B"):
        s += a + b

    it = prog.run_batch([("1",), ("2", "x")], backend=fake, generator_style=True)
    assert [s.text() for s in it] == ["1B", "2x"]
    with pytest.raises(TypeError):
        prog.run_batch([()], backend=fake)
    assert prog.bind(b="!").run("z", backend=fake).text() == "z!"


def test_streaming_text_iter_and_async(make_fake):
    taken = threading.Event()

    def after_the_reader_took_the_last(i: int) -> None:  # an event, not a delay
        if i and not taken.wait(60):
            raise AssertionError("the reader never received a streamed chunk")
        taken.clear()

    gated = make_fake(reply=lambda t, p: "hello world", before_chunk=after_the_reader_took_the_last)
    backend = make_fake(reply=lambda t, p: "hello world")

    @rl.function
    def prog(s):
        s += "Say:" + rl.gen("answer")

    state = prog.run(backend=gated, stream=True)
    chunks = []
    for chunk in state.text_iter("answer"):
        chunks.append(chunk)
        taken.set()
    # each character reached the reader before the next was generated: one chunk each
    assert chunks == list("hello world"), chunks
    state = prog.run(backend=backend, stream=True)
    assert "".join(state.text_iter()) == "Say:hello world"

    async def collect():
        state = prog.run(backend=backend, stream=True)
        return [c async for c in state.text_async_iter("answer")]

    assert "".join(asyncio.run(collect())) == "hello world"
    # non-streaming states yield the whole value once
    assert list(prog.run(backend=backend).text_iter("answer")) == ["hello world"]


def test_streaming_error_is_raised_by_text_iter(make_fake):
    backend = failing_backend(make_fake)

    @rl.function
    def prog(s):
        s += "a" + rl.gen("x", regex="y")

    state = prog.run(backend=backend, stream=True)
    with pytest.raises(ProgramError):
        list(state.text_iter())
    assert isinstance(state.error(), ValueError)


def test_no_backend_and_finished_state(fake, monkeypatch):
    monkeypatch.setattr(global_config, "default_backend", None)

    @rl.function
    def prog(s):
        s += "x"

    with pytest.raises(NoBackendError):
        prog.run()
    rl.set_default_backend(fake)
    state = prog()
    assert rl.get_default_backend() is fake and state.text() == "x"
    with pytest.raises(LangError, match="finished"):
        state += "more"

    @rl.function
    def appends_none(s):
        s += None

    with pytest.raises(ValueError, match="None"):
        appends_none.run()


def test_nested_roles_fail_clearly(fake):
    @rl.function
    def prog(s):
        s += rl.user_begin() + rl.assistant("x")

    with pytest.raises(ProgramError, match="inside a 'user' message"):
        prog.run(backend=fake)


def test_writing_to_a_joined_fork_says_it_was_joined(fake):
    @rl.function
    def prog(s):
        s += "start "
        forks = s.fork(2)
        forks += rl.gen("x", max_tokens=2)
        forks.join()
        forks[0] += "late"

    with pytest.raises(LangError, match="joined") as err:
        prog.run(backend=fake)
    assert "finished" not in str(err.value)  # the program was still running


def test_nested_var_scopes_of_one_name(fake):
    @rl.function
    def prog(s):
        with s.var_scope("x"):
            s += "a "
            with s.var_scope("x"):
                s += "b"
            s["inner"] = s["x"]
            s += " c"

    state = prog.run(backend=fake)
    assert state["inner"] == "b" and state["x"] == "a b c"


def test_unknown_variable_in_text_iter_and_get_meta_info_is_named(make_fake):
    backend = make_fake(reply=lambda t, p: "hi")

    @rl.function
    def prog(s):
        s += "Say:" + rl.gen("answer")

    for stream in (False, True):
        state = prog.run(backend=backend, stream=stream)
        with pytest.raises(KeyError, match="no_such_var") as err:
            list(state.text_iter("no_such_var"))
        assert isinstance(err.value, LangError)
        with pytest.raises(KeyError, match="no_such_var"):
            state.get_meta_info("no_such_var")
        assert state.get_meta_info("answer") is not None and state["answer"] == "hi"
