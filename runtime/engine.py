"""`Engine`: the runtime embedded in the user's process (SGLang's `Engine` API).

    engine = Engine()                                   # default model: SmolLM2-135M-Instruct
    out = engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
    for chunk in engine.generate(prompt, params, stream=True): ...
    engine.shutdown()

The user's process hosts the TokenizerManager on a private asyncio loop in a background thread,
so the synchronous API works anywhere, Jupyter included (whose own loop is already running).
The scheduler and detokenizer run in spawned child processes; `shutdown` (also at exit, or when
the Engine is garbage-collected) stops them. Ctrl-C while waiting aborts the in-flight requests
and re-raises KeyboardInterrupt; the engine stays usable.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

from radixlm.runtime.errors import EngineDeadError, InvalidRequestError
from radixlm.runtime.launch import EngineProcesses, launch_processes
from radixlm.runtime.models.default_model import DEFAULT_MODEL_NAME, ModelNotFoundError
from radixlm.runtime.process_utils import configure_logging
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.tokenizer import load_server_tokenizer
from radixlm.runtime.tokenizer_manager import GenerateInput, TokenizerManager

logger = logging.getLogger(__name__)


class _LoopThread:
    """An asyncio loop (uvloop when available) running in a daemon thread."""

    def __init__(self) -> None:
        try:
            import uvloop

            self.loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover
            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="radixlm-loop", daemon=True)
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
            raise ModelNotFoundError(
                f"model path {args.model_path!r} does not exist (models are never downloaded)"
            )

        def load_tokenizer() -> None:  # runs while the children start
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
        inputs, batched = self._normalize(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
            top_logprobs_num, return_text_in_logprobs, stream, rid,
        )  # fmt: skip
        loop = self._require_loop()
        if stream:
            return self._sync_stream(inputs, batched)
        return _wait(loop.submit(self._collect(inputs, batched)))

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
        inputs, batched = self._normalize(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
            top_logprobs_num, return_text_in_logprobs, stream, rid,
        )  # fmt: skip
        loop = self._require_loop()
        if stream:
            return self._async_stream(inputs, batched)
        return await asyncio.wrap_future(loop.submit(self._collect(inputs, batched)))

    def _normalize(
        self,
        prompt: Any,
        sampling_params: Any,
        input_ids: Any,
        return_logprob: Any,
        logprob_start_len: Any,
        top_logprobs_num: Any,
        return_text_in_logprobs: bool,
        stream: bool,
        rid: Any,
    ) -> tuple[list[list[GenerateInput]], bool]:
        """-> per prompt, its list of n sub-requests; and whether the input was a batch."""
        if prompt is not None and input_ids is not None:
            raise InvalidRequestError("pass either prompt or input_ids, not both", "input_ids")
        if prompt is None and input_ids is None:
            raise InvalidRequestError("a prompt (text or input_ids) is required", "prompt")
        if prompt is not None:
            batched = isinstance(prompt, list)
            texts = prompt if batched else [prompt]
            ids_list: list[Any] = [None] * len(texts)
        else:
            batched = bool(input_ids) and isinstance(input_ids[0], list)
            ids_list = input_ids if batched else [input_ids]
            texts = [None] * len(ids_list)
        count = len(texts)
        if batched and count == 0:
            raise InvalidRequestError("the batch of prompts is empty", "prompt")

        def per_item(value: Any, name: str) -> list[Any]:
            if isinstance(value, list) and (batched or name != "sampling_params"):
                if name == "sampling_params" or batched:
                    if len(value) != count:
                        raise InvalidRequestError(f"{name}: expected {count} entries", name)
                    return value
            return [value] * count

        params = per_item(sampling_params, "sampling_params")
        lps = per_item(return_logprob, "return_logprob")
        starts = per_item(logprob_start_len, "logprob_start_len")
        tops = per_item(top_logprobs_num, "top_logprobs_num")
        rids = per_item(rid, "rid") if rid is not None else [None] * count
        out: list[list[GenerateInput]] = []
        for i in range(count):
            sp = dict(params[i] or {})
            n = sp.pop("n", 1)
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128:
                raise InvalidRequestError("n must be an integer in [1, 128]", "n")
            subs = []
            for k in range(n):
                sub_sp = dict(sp)
                if n > 1 and sub_sp.get("seed") is not None:
                    sub_sp["seed"] = int(sub_sp["seed"]) + k
                sub_rid = rids[i] if n == 1 else (f"{rids[i]}-{k}" if rids[i] else None)
                subs.append(
                    GenerateInput(
                        text=texts[i],
                        input_ids=ids_list[i],
                        sampling_params=sub_sp,
                        rid=sub_rid,
                        return_logprob=bool(lps[i]),
                        logprob_start_len=starts[i],
                        top_logprobs_num=tops[i] or 0,
                        return_text_in_logprobs=return_text_in_logprobs,
                        stream=stream,
                    )
                )
            out.append(subs)
        return out, batched

    async def _one(self, req: GenerateInput) -> dict[str, Any]:
        result = None
        async for result in self.tokenizer_manager.generate(req):
            pass
        assert result is not None
        return result

    async def _collect(self, inputs: list[list[GenerateInput]], batched: bool) -> Any:
        tm = self.tokenizer_manager
        for subs in inputs:  # validate everything before anything runs
            for sub in subs:
                tm.validate(sub)
        await self._prefill_shared_prompts(inputs)
        flat = [sub for subs in inputs for sub in subs]
        results = await asyncio.gather(*(self._one(r) for r in flat))
        grouped, pos = [], 0
        for subs in inputs:
            group = results[pos : pos + len(subs)]
            pos += len(subs)
            grouped.append(group if len(subs) > 1 else group[0])
        return grouped if batched else grouped[0]

    async def _prefill_shared_prompts(self, inputs: list[list[GenerateInput]]) -> None:
        """n > 1: prefill the prompt once (max_new_tokens=0) so the n samples share its KV."""
        if self.server_args.disable_radix_cache:
            return
        warmups = [
            GenerateInput(text=subs[0].text, input_ids=subs[0].input_ids, sampling_params={"max_new_tokens": 0})
            for subs in inputs
            if len(subs) > 1
        ]
        if warmups:
            await asyncio.gather(*(self._one(w) for w in warmups))

    async def _stream_all(self, inputs: list[list[GenerateInput]], batched: bool) -> AsyncIterator[dict]:
        flat = [sub for subs in inputs for sub in subs]
        for sub in flat:
            self.tokenizer_manager.validate(sub)
        await self._prefill_shared_prompts(inputs)
        if len(flat) == 1 and not batched:
            async for chunk in self.tokenizer_manager.generate(flat[0]):
                yield chunk
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, req: GenerateInput) -> None:
            try:
                async for chunk in self.tokenizer_manager.generate(req):
                    await queue.put({**chunk, "index": index})
            except BaseException as exc:  # delivered to the consumer
                await queue.put(exc)
            finally:
                await queue.put(None)

        tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(flat)]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()

    def _sync_stream(self, inputs: list[list[GenerateInput]], batched: bool) -> Iterator[dict]:
        loop = self._require_loop()
        agen = self._stream_all(inputs, batched)
        try:
            while True:
                try:
                    yield _wait(loop.submit(agen.__anext__()))
                except StopAsyncIteration:
                    return
        finally:
            loop.submit(agen.aclose())

    async def _async_stream(self, inputs: list[list[GenerateInput]], batched: bool) -> AsyncIterator[dict]:
        loop = self._require_loop()
        agen = self._stream_all(inputs, batched)
        try:
            while True:
                try:
                    yield await asyncio.wrap_future(loop.submit(agen.__anext__()))
                except StopAsyncIteration:
                    return
        finally:
            loop.submit(agen.aclose())

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
        info = {k: v for k, v in vars(self.server_args).items()}
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
            try:
                loop.submit(tm.close()).result(5)
            except Exception:  # noqa: BLE001 - best effort during teardown
                pass
        procs.shutdown()
        if loop is not None:
            loop.stop()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
