"""`Engine`: the runtime embedded in the user's process (SGLang's `Engine` API).

    engine = Engine()                                   # default model: SmolLM2-135M-Instruct
    out = engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
    for chunk in engine.generate(prompt, params, stream=True): ...
    engine.shutdown()

`Engine(tp_size=N)` runs the model over N tensor-parallel ranks (the scheduler is rank 0, the
others follow it in lock-step: docs/distributed.md); other nodes' ranks start with
`radixlm serve --node-rank K`.

The user's process hosts the TokenizerManager on a private asyncio loop in a background thread,
so the synchronous API works anywhere, Jupyter included (whose own loop is already running).
The scheduler and detokenizer run in spawned child processes; `shutdown` (also at exit, or when
the Engine is garbage-collected) stops them. Ctrl-C while waiting aborts the in-flight requests
and re-raises KeyboardInterrupt; the engine stays usable. A request or stream read after (or
during) `shutdown` raises RequestAbortedError, never hangs; a sync stream's `close()` may come from
another thread than its reader's (it aborts the stream's requests).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

from radixlm.runtime.errors import EngineDeadError, RequestAbortedError
from radixlm.runtime.frontend import request_batch
from radixlm.runtime.frontend.request_batch import RequestBatch
from radixlm.runtime.frontend.tokenizer_manager import TokenizerManager
from radixlm.runtime.models.default_model import DEFAULT_MODEL_NAME
from radixlm.runtime.models.hf_cache import resolve_cached_model
from radixlm.runtime.processes.launch import EngineProcesses, launch_processes
from radixlm.runtime.processes.process_utils import configure_logging
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


class _LoopThread:
    """An asyncio loop (uvloop when available) running in a daemon thread."""

    def __init__(self) -> None:
        try:
            import uvloop

            self.loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover
            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="radixlm-loop", daemon=True
        )
        self.thread.start()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


def _wait(fut: concurrent.futures.Future, on_interrupt: Any = None) -> Any:
    try:
        return fut.result()
    except KeyboardInterrupt:
        fut.cancel()  # the coroutine's finally-block aborts its requests
        if on_interrupt is not None:
            on_interrupt()
        raise


class _SyncStream(Iterator[dict]):
    """A sync stream over the loop's async stream. Unlike a generator, `close()` may come from
    another thread while one reads: it cancels the pending read, whose cancellation runs the async
    stream's `finally` (it aborts the requests); that reader then sees the end of the stream.
    After `Engine.shutdown()`, a read raises RequestAbortedError at once."""

    def __init__(self, engine: Engine, agen: AsyncIterator[dict]) -> None:
        self._engine, self._agen = engine, agen
        self._lock = threading.Lock()
        self._closed = False
        self._pending: concurrent.futures.Future | None = None

    def __next__(self) -> dict:
        with self._lock:
            if self._closed:
                raise StopIteration
            try:
                loop = self._engine._live_loop()
            except RequestAbortedError:
                self._closed = True
                raise
            self._pending = fut = loop.submit(self._agen.__anext__())
        try:
            return _wait(fut, on_interrupt=self.close)
        except StopAsyncIteration:
            self._closed = True
            raise StopIteration from None
        except concurrent.futures.CancelledError:
            if self._closed:  # closed by another thread
                raise StopIteration from None
            raise
        except BaseException:
            self._closed = True
            raise

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = self._pending
        if pending is not None and not pending.done():
            pending.cancel()  # NOTE: cancelling the read closes the async stream (it aborts)
            return
        if pending is not None and pending.cancelled():
            return  # an interrupted read: its cancellation closes the async stream
        with contextlib.suppress(RequestAbortedError):
            self._engine._live_loop().submit(self._agen.aclose())

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        self.server_args = ServerArgs.from_kwargs(model_path=model_path, **kwargs)
        configure_logging(self.server_args.log_level)
        args = self.server_args
        self._procs: EngineProcesses | None = None
        self._loop: _LoopThread | None = None
        self._closed = False
        self.tokenizer = None
        if args.load_format != "dummy" and args.model_path and not os.path.exists(args.model_path):
            # a HF repo id from the local HF cache, else ModelNotFoundError (never downloads)
            args = self.server_args = resolve_cached_model(args)

        def load_tokenizer() -> None:  # runs while the children start
            # NOTE: imported here, after the spawn: transformers takes ~1 s to import.
            from radixlm.runtime.frontend.tokenizer import load_server_tokenizer

            self.tokenizer = load_server_tokenizer(args)

        self._procs = procs = launch_processes(args, load_tokenizer)
        self._loop = _LoopThread()
        self.tokenizer_manager: TokenizerManager = self._loop.submit(
            self._start_tm(args, procs)
        ).result()
        self.model_name = args.served_model_name or (
            DEFAULT_MODEL_NAME if args.model_path is None else args.model_path
        )
        self._finalizer = weakref.finalize(
            self, Engine._cleanup, procs, self._loop, self.tokenizer_manager
        )
        atexit.register(self._finalizer)

    async def _start_tm(self, args: ServerArgs, procs: EngineProcesses) -> TokenizerManager:
        tm = TokenizerManager(args, procs.ports, self.tokenizer, procs.info, procs.describe_death)
        tm.start()
        return tm

    # ---- generation ----------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        return_text_in_logprobs: bool = False,
        stream: bool = False,
        rid: str | list[str] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """Generate for one prompt (a dict) or a batch (a list of dicts). `n > 1` in
        `sampling_params` returns a list of n results per prompt. With `stream=True`, returns
        an iterator of chunks whose `text` is cumulative (batch chunks carry `index`)."""
        batch = request_batch.expand_request(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
            top_logprobs_num, return_text_in_logprobs, stream, rid,
        )  # fmt: skip
        loop = self._require_loop()
        tm = self.tokenizer_manager
        if stream:
            return _SyncStream(self, request_batch.stream(tm, batch))
        return request_batch.group_results(
            batch, _wait(loop.submit(request_batch.collect(tm, batch)))
        )

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        return_text_in_logprobs: bool = False,
        stream: bool = False,
        rid: str | list[str] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]] | AsyncIterator[dict[str, Any]]:
        batch = request_batch.expand_request(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
            top_logprobs_num, return_text_in_logprobs, stream, rid,
        )  # fmt: skip
        loop = self._require_loop()
        if stream:
            return self._async_stream(batch)
        flat = await asyncio.wrap_future(
            loop.submit(request_batch.collect(self.tokenizer_manager, batch))
        )
        return request_batch.group_results(batch, flat)

    def _live_loop(self) -> _LoopThread:
        """The loop, or RequestAbortedError once shut down (a stream read then must not hang)."""
        if self._closed or self._loop is None or not self._loop.loop.is_running():
            raise RequestAbortedError("the engine is shut down")
        return self._loop

    async def _async_stream(self, batch: RequestBatch) -> AsyncIterator[dict]:
        """The loop's stream, read from the caller's loop (each read is a hop to ours)."""
        agen = request_batch.stream(self.tokenizer_manager, batch)
        try:
            while True:
                try:
                    yield await asyncio.wrap_future(self._live_loop().submit(agen.__anext__()))
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed and self._loop is not None:
                self._loop.submit(agen.aclose())

    # ---- control -------------------------------------------------------------------------------
    def _control(self, kind: str) -> dict[str, Any]:
        resp = _wait(self._require_loop().submit(self.tokenizer_manager.control(kind)))
        if not resp.ok:
            raise RuntimeError(f"{kind} failed: {resp.error}")
        return resp.data

    def flush_cache(self) -> bool:
        """Drop every cached prefix (only when no request runs). Returns True on success."""
        resp = _wait(self._require_loop().submit(self.tokenizer_manager.control("flush_cache")))
        return resp.ok

    def get_server_info(self) -> dict[str, Any]:
        info = dict(vars(self.server_args))
        info.update(self._procs.info if self._procs else {})
        info.update(self._control("get_info"))
        info["model_name"] = self.model_name
        return info

    def check_invariants(self) -> dict[str, Any]:
        """Raise unless the engine is idle with exact KV accounting (free + evictable == capacity,
        nothing locked, no request rows held). For tests and debugging."""
        return self._control("check_invariants")

    def abort_request(self, rid: str = "") -> None:
        """Abort one request by id ("" aborts all)."""
        loop = self._require_loop()
        loop.loop.call_soon_threadsafe(self.tokenizer_manager.abort, rid)

    def _require_loop(self) -> _LoopThread:
        if self._closed or self._loop is None:
            raise EngineDeadError("the engine is shut down")
        return self._loop

    # ---- lifecycle -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if getattr(self, "_finalizer", None) is not None:
            self._finalizer()

    @staticmethod
    def _cleanup(procs: EngineProcesses, loop: _LoopThread | None, tm: TokenizerManager) -> None:
        if loop is not None and loop.loop.is_running():
            with contextlib.suppress(Exception):  # best effort during teardown
                loop.submit(tm.close()).result(5)
        procs.shutdown()
        if loop is not None:
            loop.stop()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
