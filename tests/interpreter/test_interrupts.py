"""Programs on the real Engine when things go wrong around them: Ctrl-C in `run` and `run_batch`
aborts the programs' requests in the engine, `run_batch` never raises when its shared-prefix
precache fails, and `rl.flush_cache` while requests run says so. Ctrl-C is a real SIGINT sent to
this process by a helper thread once the engine reports the requests running (observed state)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

import pytest

import radixlm.interpreter.api as rl
from tests_helpers import wait_idle_and_check

MAX = 256


@contextlib.contextmanager
def _interrupt_when(predicate: Callable[[], bool]) -> Iterator[None]:
    """SIGINT to this process (the main thread gets KeyboardInterrupt) once `predicate()` holds
    inside the block; never after it (the helper stops when the block ends)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            if predicate():
                os.kill(os.getpid(), signal.SIGINT)
                return
            stop.wait(0.02)  # NOTE: polling an observed state, not a timing assumption

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _generated(engine) -> int:
    return engine.get_server_info()["generated_tokens"]


def _running_at_least(engine, n: int) -> Callable[[], bool]:
    return lambda: engine.get_server_info()["num_running"] >= n


@rl.function
def _many(s):
    s += "Count to one thousand:"
    forks = s.fork(12)
    for f in forks:
        f += rl.gen("x", max_tokens=MAX, ignore_eos=True)
    forks.join()


def test_ctrl_c_in_run_aborts_the_programs_requests(engine):
    before = _generated(engine)
    with _interrupt_when(_running_at_least(engine, 12)), pytest.raises(KeyboardInterrupt):
        _many.run(backend=engine, temperature=0)
    wait_idle_and_check(engine)  # the 12 requests were aborted: nothing runs any more
    assert _generated(engine) - before < 12 * MAX


def test_ctrl_c_in_run_aborts_the_programs_requests_on_a_server(main_server):
    """The same through `RuntimeEndpoint`: the aborts travel as POST /abort_request."""
    from radixlm.interpreter.runtime_endpoint import RuntimeEndpoint

    endpoint = RuntimeEndpoint(main_server.base_url, api_key=main_server.api_key)
    try:
        before = main_server.info()["generated_tokens"]
        with (
            _interrupt_when(lambda: main_server.info()["num_running"] >= 12),
            pytest.raises(KeyboardInterrupt),
        ):
            _many.run(backend=endpoint, temperature=0)
        main_server.wait_idle_and_check_kv()
        assert main_server.info()["generated_tokens"] - before < 12 * MAX
    finally:
        endpoint.shutdown()


def test_ctrl_c_in_run_batch_surfaces_before_the_batch_ends_and_aborts_it(engine):
    @rl.function
    def one(s, i):
        s += f"Story number {i}:" + rl.gen("x", max_tokens=MAX, ignore_eos=True)

    before = _generated(engine)
    with _interrupt_when(_running_at_least(engine, 6)), pytest.raises(KeyboardInterrupt):
        one.run_batch([{"i": i} for i in range(6)], backend=engine, precache=False, num_threads=6)
    at_raise = _generated(engine) - before
    assert at_raise < 6 * MAX  # it did not wait for the whole batch
    wait_idle_and_check(engine)
    assert _generated(engine) - before < 6 * MAX


def test_run_batch_never_raises_when_the_precache_fails(engine):
    """A shared prefix over the context length: each state holds the error, precache or not."""
    context = engine.get_server_info()["context_length"]
    prefix = "word " * (context + 100)

    @rl.function
    def long(s, q):
        s += prefix + q + rl.gen("a", max_tokens=2)

    args = [{"q": "one?"}, {"q": "two?"}]
    for precache in (True, False):
        states = long.run_batch(args, backend=engine, precache=precache)
        assert len(states) == 2 and all(st.error() is not None for st in states)
        assert all("context" in str(st.error()) for st in states)


def test_flush_cache_while_requests_run_returns_false_and_warns(engine):
    stream = engine.generate(
        "Tell me a story", {"max_new_tokens": MAX, "ignore_eos": True}, stream=True
    )
    next(stream)
    try:
        with pytest.warns(UserWarning, match="not flushed"):
            assert rl.flush_cache(engine) is False
    finally:
        stream.close()
    wait_idle_and_check(engine)
    assert rl.flush_cache(engine) is True


def test_leaving_a_generator_style_batch_early_aborts_the_rest(engine):
    @rl.function
    def one(s, n):
        s += "Tell a story:" + rl.gen("x", max_tokens=n, ignore_eos=True)

    before = _generated(engine)
    batch = [{"n": 4}] + [{"n": MAX}] * 3
    states = one.run_batch(
        batch, backend=engine, precache=False, num_threads=4, generator_style=True
    )
    for state in states:
        assert state["x"]
        break
    states.close()  # what leaving the loop does once the generator is collected
    wait_idle_and_check(engine)
    assert _generated(engine) - before < 4 + 3 * MAX


def test_ctrl_c_while_reading_a_streamed_run_aborts_it(engine):
    before = _generated(engine)
    state = _many.run(backend=engine, temperature=0, stream=True)
    with _interrupt_when(_running_at_least(engine, 12)), pytest.raises(KeyboardInterrupt):
        for _ in state.text_iter():
            pass
    wait_idle_and_check(engine)
    assert _generated(engine) - before < 12 * MAX
