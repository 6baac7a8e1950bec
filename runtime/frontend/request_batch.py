"""Expanding one generate call (a prompt or a batch of prompts, each with `n` samples) into single
`GenerateInput`s, and running them on a `TokenizerManager`: the one request path, shared by
`Engine` and the HTTP server.

    batch = expand_request(prompt=["a", "b"], sampling_params={"n": 2, "max_new_tokens": 8})
    batch = validate(tm, batch)                 # optional: each sub-request validated+tokenized once
    results = await collect(tm, batch)          # flat: prompt-major, n samples each (SGLang's order)
    async for chunk in stream(tm, batch): ...   # chunks of a batch carry "index" (flat position)

`collect` and `stream` validate a batch that is not validated yet; a validated batch carries its
`PreparedReq`s (the typed messages for the scheduler), so nothing is validated or tokenized twice.

Threading: the coroutines run on the TokenizerManager's event loop. Ownership: a `RequestBatch`
is immutable; every request it starts is aborted if the caller goes away (cancellation, closing
the stream), because the TokenizerManager's `generate` aborts in its `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.frontend.prepare import GenerateInput, PreparedReq
from radixlm.runtime.frontend.tokenizer_manager import TokenizerManager
from radixlm.runtime.sampling.sampling_params import SamplingParams

MAX_N = 128


@dataclass(frozen=True)
class RequestBatch:
    groups: list[list[GenerateInput]]  # per prompt, its n sub-requests
    batched: bool  # the prompt was a list (the caller expects a list back)
    prepared: tuple[PreparedReq, ...] | None = None  # per `flat` entry; set by `validate`

    @property
    def flat(self) -> list[GenerateInput]:
        return [sub for subs in self.groups for sub in subs]

    @property
    def is_single(self) -> bool:
        """One prompt, n == 1: results are a dict, stream chunks carry no index."""
        return not self.batched and len(self.groups[0]) == 1


def expand_request(
    prompt: Any = None,
    sampling_params: Any = None,
    input_ids: Any = None,
    return_logprob: Any = False,
    logprob_start_len: Any = None,
    top_logprobs_num: Any = None,
    return_text_in_logprobs: bool = False,
    stream: bool = False,
    rid: Any = None,
) -> RequestBatch:
    """Normalise SGLang's generate arguments. Per-prompt arguments may be lists (one entry per
    prompt) when the prompt is a batch; `n` in sampling_params expands into n sub-requests (rid
    `"{rid}-{k}"`, seed `seed + k`)."""
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
        # NOTE: a list `sampling_params` is per prompt only for a batch; for one prompt a list
        # is an error (it is not a dict), reported by the validation of sampling params.
        if isinstance(value, list) and batched:
            if len(value) != count:
                raise InvalidRequestError(
                    f"{name}: expected {count} entries, got {len(value)}", name
                )
            return value
        return [value] * count

    params = per_item(sampling_params, "sampling_params")
    lps = per_item(return_logprob, "return_logprob")
    starts = per_item(logprob_start_len, "logprob_start_len")
    tops = per_item(top_logprobs_num, "top_logprobs_num")
    rids = per_item(rid, "rid") if rid is not None else [None] * count
    if not all(r is None or isinstance(r, str) for r in rids):
        raise InvalidRequestError("rid must be a string (a list of strings for a batch)", "rid")
    groups: list[list[GenerateInput]] = []
    for i in range(count):
        if params[i] is not None and not isinstance(params[i], dict):
            raise InvalidRequestError("sampling_params must be an object", "sampling_params")
        sp = dict(params[i] or {})
        n = sp.pop("n", 1)
        if n is None:
            n = 1
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
            raise InvalidRequestError(f"n must be an integer in [1, {MAX_N}], got {n!r}", "n")
        subs = []
        for k in range(n):
            sub_sp = dict(sp)
            seed = sub_sp.get("seed")
            if n > 1 and isinstance(seed, int) and not isinstance(seed, bool):
                # NOTE: wraps within int64, so every seed valid for n = 1 stays valid.
                sub_sp["seed"] = (
                    (seed + k + 2**63) % 2**64 - 2**63 if -(2**63) <= seed < 2**63 else seed
                )
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
        groups.append(subs)
    seen: set[str] = set()
    for sub in (sub for subs in groups for sub in subs if sub.rid is not None):
        if sub.rid in seen:
            raise InvalidRequestError(f"duplicate request id {sub.rid!r} in the batch", "rid")
        seen.add(sub.rid)
    return RequestBatch(groups, batched)


def validate(tm: TokenizerManager, batch: RequestBatch) -> RequestBatch:
    """The batch with every sub-request validated and tokenized (`prepared`), once all of them
    are valid and fit in the queue: nothing runs before that (raises the first error). A
    prompt's text is tokenized once: its other `n - 1` samples reuse the first one's ids."""
    if batch.prepared is not None:
        return batch
    prepared: list[PreparedReq] = []
    for first, *others in batch.groups:
        head = tm.prepare(first)
        ids = head.msg.input_ids
        prepared.append(head)
        # NOTE: the samples differ from the first only in rid and seed (expand_request)
        prepared.extend(
            tm.prepare(dataclasses.replace(sub, text=None, input_ids=ids)) for sub in others
        )
    tm.check_queue(len(prepared))
    return dataclasses.replace(batch, prepared=tuple(prepared))


def group_results(batch: RequestBatch, flat: list[dict[str, Any]]) -> Any:
    """The Engine's shape: a dict; a list of n dicts; a list per prompt (of dicts or lists)."""
    grouped, pos = [], 0
    for subs in batch.groups:
        group = flat[pos : pos + len(subs)]
        pos += len(subs)
        grouped.append(group if len(subs) > 1 else group[0])
    return grouped if batch.batched else grouped[0]


async def run_one(tm: TokenizerManager, req: GenerateInput) -> dict[str, Any]:
    """Validate and run one request to completion; its final result."""
    return await run_prepared(tm, tm.prepare(req))


async def run_prepared(tm: TokenizerManager, req: PreparedReq) -> dict[str, Any]:
    """Run one prepared request to completion; its final result."""
    final = None
    async with contextlib.aclosing(tm.submit(req)) as agen:
        async for chunk in agen:
            final = chunk
    assert final is not None
    return final


async def prefill_shared_prompts(tm: TokenizerManager, batch: RequestBatch) -> None:
    """n > 1: prefill each (validated) prompt once (max_new_tokens=0) so its n samples share the
    KV. The prompt's ids are reused: the warm-up is not tokenized again."""
    if tm.args.disable_radix_cache:
        return
    assert batch.prepared is not None
    warmups, pos = [], 0
    for subs in batch.groups:
        if len(subs) > 1:
            first = batch.prepared[pos].msg
            msg = msgspec.structs.replace(
                first, rid=uuid.uuid4().hex, sampling_params=SamplingParams(max_new_tokens=0),
                return_logprob=False, logprob_start_len=-1, top_logprobs_num=0, stream=False,
            )  # fmt: skip
            warmups.append(PreparedReq(msg))
        pos += len(subs)
    if warmups:
        await _gather_or_cancel([run_prepared(tm, w) for w in warmups])


async def collect(tm: TokenizerManager, batch: RequestBatch) -> list[dict[str, Any]]:
    """Run every sub-request to completion; the final results, flat, in order. On the first
    error (or cancellation) the others are cancelled, which aborts them."""
    batch = validate(tm, batch)
    assert batch.prepared is not None
    await prefill_shared_prompts(tm, batch)
    return await _gather_or_cancel([run_prepared(tm, r) for r in batch.prepared])


async def _gather_or_cancel(coros: list[Any]) -> list[Any]:
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()  # NOTE: a no-op for finished tasks; aborts the rest after an error


async def stream(tm: TokenizerManager, batch: RequestBatch) -> AsyncIterator[dict[str, Any]]:
    """Stream chunks (cumulative text per sub-request) as they come. Chunks of a batch (or n > 1)
    carry `index`, the sub-request's flat position. Closing the iterator aborts what still runs."""
    batch = validate(tm, batch)
    flat = batch.prepared
    assert flat is not None
    await prefill_shared_prompts(tm, batch)
    if batch.is_single:
        async with contextlib.aclosing(tm.submit(flat[0])) as agen:
            async for chunk in agen:
                yield chunk
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, req: PreparedReq) -> None:
        try:
            async with contextlib.aclosing(tm.submit(req)) as agen:
                async for chunk in agen:
                    queue.put_nowait({**chunk, "index": index})
        except BaseException as exc:  # delivered to the consumer
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(None)

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
