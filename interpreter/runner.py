"""Running programs: `run_program`, `run_program_batch`, and program-aware prefix caching.

Threading: `run_program` calls the user's function on the caller's thread (or, with
`stream=True`, on a new daemon thread) while its executor's worker runs the expressions.
`run_program_batch` runs each program on a thread of a pool; programs share only the backend.

Errors: in `run`, an exception raised by the program's code propagates unchanged (its traceback
is the program's own), and a failure in the executor (e.g. the backend rejecting a `gen`) is
raised as a `ProgramError` naming the program line that appended the failing expression. In
`run_batch` nothing is raised: each failed program's state holds its error (`state.error()`),
reading one of its missing variables raises it, and the other programs run to completion (a
failed precache of the shared prefix is no exception: the programs then run without it).

Ctrl-C (KeyboardInterrupt) in `run` or `run_batch` aborts the requests the programs have in
flight (`cancel.py`'s `RequestScope`) and re-raises at once; their later requests never start.
Leaving a `generator_style` batch early (closing it) aborts the programs still running the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from radixlm.interpreter.cancel import RequestScope
from radixlm.interpreter.config import global_config, resolve_backend
from radixlm.interpreter.executor import StreamExecutor
from radixlm.interpreter.state import ProgramState
from radixlm.lang.sampling import SamplingParams
from radixlm.lang.tracer import extract_prefix_by_tracing

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from radixlm.interpreter.backend import Backend
    from radixlm.lang.function import Function


def _new_state(
    function: Function, backend: Backend, defaults: SamplingParams, stream: bool
) -> ProgramState:
    executor = StreamExecutor(
        backend,
        defaults,
        stream=stream,
        program_name=function.__name__,
        num_api_spec_tokens=function.num_api_spec_tokens,
    )
    return ProgramState(executor)


def _call(
    state: ProgramState, function: Function, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    """Run the user's function on `state`; record (and re-raise) what it raises."""
    try:
        state.ret_value = function.func(state, *args, **{**kwargs, **function.bind_arguments})
    except BaseException as e:
        state.executor.record_program_exception(e)
        raise
    finally:
        state.executor.end()


def run_program(
    function: Function,
    backend: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    defaults: SamplingParams,
    *,
    stream: bool = False,
) -> ProgramState:
    scope = RequestScope()
    with scope.active():
        state = _new_state(function, resolve_backend(backend), defaults, stream)
    state.request_scope = scope  # NOTE: Ctrl-C in `text_iter` of a streamed run cancels it
    if stream:

        def target() -> None:
            # The error is recorded on the state; text_iter() raises it.
            with contextlib.suppress(BaseException), scope.active():
                _call(state, function, args, kwargs)

        threading.Thread(target=target, name="radixlm-program", daemon=True).start()
        return state
    try:
        with scope.active():
            _call(state, function, args, kwargs)
        state.executor.sync()
    except KeyboardInterrupt:
        scope.cancel()  # NOTE: Ctrl-C aborts the program's requests, as Engine.generate does
        raise
    state.executor.raise_if_failed()
    return state


def cache_program(function: Function, backend: Any = None) -> str:
    """Trace `function` for its constant prefix and put it in the backend's cache.

    Returns the prefix (empty when it is too short to be worth a call, as in SGLang).
    """
    backend = resolve_backend(backend)
    prefix = extract_prefix_by_tracing(function, backend.chat_template)
    if len(prefix) <= global_config.precache_min_chars:
        return ""
    backend.cache_prefix(prefix)
    return prefix


def _num_threads(num_threads: int | str, n: int) -> int:
    if num_threads == "auto":
        num_threads = max(96, (os.cpu_count() or 1) * 16)  # SGLang's choice: programs mostly wait
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive int or 'auto', got {num_threads!r}")
    return max(1, min(num_threads, n))


def _run_one(
    function: Function,
    backend: Backend,
    kwargs: Mapping[str, Any],
    defaults: SamplingParams,
    scope: RequestScope,
) -> ProgramState:
    with scope.active():
        state = _new_state(function, backend, defaults, False)
        # The error is kept on the state: one failing program must not stop the batch.
        with contextlib.suppress(Exception):
            _call(state, function, (), kwargs)
    state.executor.sync()
    return state


def run_program_batch(
    function: Function,
    backend: Any,
    batch_kwargs: Sequence[Mapping[str, Any]],
    defaults: SamplingParams,
    *,
    num_threads: int | str = "auto",
    progress_bar: bool = False,
    precache: bool | None = None,
    generator_style: bool = False,
) -> list[ProgramState] | Iterator[ProgramState]:
    backend = resolve_backend(backend)
    if precache is None:
        precache = global_config.enable_precache_with_tracing
    if precache and len(batch_kwargs) > 1:
        try:
            cache_program(function, backend)
        except Exception:  # NOTE: never raised: each program meets the failure on its state
            logger.debug("precaching the shared prefix failed; running without", exc_info=True)
    if not batch_kwargs:
        return iter(()) if generator_style else []
    it = _run_batch(
        function,
        backend,
        batch_kwargs,
        defaults,
        _num_threads(num_threads, len(batch_kwargs)),
        progress_bar,
    )
    return it if generator_style else list(it)


def _run_batch(
    function: Function,
    backend: Backend,
    batch_kwargs: Sequence[Mapping[str, Any]],
    defaults: SamplingParams,
    num_threads: int,
    progress_bar: bool,
) -> Iterator[ProgramState]:
    pbar = None
    if progress_bar:
        from tqdm import tqdm

        pbar = tqdm(total=len(batch_kwargs), desc=function.__name__)
    scope = RequestScope()
    pool = ThreadPoolExecutor(num_threads, thread_name_prefix="radixlm-batch")
    interrupted = False
    try:
        futures: list[Future[ProgramState]] = []
        for kwargs in batch_kwargs:
            future = pool.submit(_run_one, function, backend, kwargs, defaults, scope)
            if pbar is not None:
                future.add_done_callback(lambda _f: pbar.update())
            futures.append(future)
        for future in futures:
            yield future.result()
    except BaseException:  # Ctrl-C, or GeneratorExit: the consumer left a generator_style batch
        # NOTE: surface at once: abort the batch's requests, drop the programs not started, and
        # do not wait for the pool (its threads end as their aborted requests return).
        interrupted = True
        scope.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        if not interrupted:
            pool.shutdown(wait=True)
        if pbar is not None:
            pbar.close()
