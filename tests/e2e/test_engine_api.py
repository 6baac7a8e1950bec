"""The Engine API on the real default model: streaming, async, n > 1, seeds, stop conditions,
aborts, bad input, info/flush, and clean shutdown."""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest

from radixlm.runtime.errors import InvalidRequestError
from tests_helpers import get_engine, pid_alive, release_engine, wait_idle_and_check, wait_until

GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
PROMPT = "The three most important inventions in history are"


def test_stream_is_cumulative_and_ends_with_the_non_stream_result(engine) -> None:
    full = engine.generate(PROMPT, GREEDY)
    chunks = list(engine.generate(PROMPT, GREEDY, stream=True))
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 24}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_async_generate_and_async_stream(engine) -> None:
    async def run():
        one = await engine.async_generate(PROMPT, GREEDY)
        chunks = [c async for c in await engine.async_generate(PROMPT, GREEDY, stream=True)]
        batch = await engine.async_generate([PROMPT, "Hello"], GREEDY)
        return one, chunks, batch

    one, chunks, batch = asyncio.run(run())
    assert chunks[-1]["text"] == one["text"] == batch[0]["text"]
    assert len(batch) == 2


def test_batch_stream_chunks_carry_their_index(engine) -> None:
    chunks = list(
        engine.generate([PROMPT, "Hi there"], {**GREEDY, "max_new_tokens": 4}, stream=True)
    )
    finals = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"]}
    assert set(finals) == {0, 1}


def test_n_samples_share_the_prompt_kv(engine) -> None:
    prompt = "List some colors of the rainbow in a different order each time:"
    outs = engine.generate(prompt, {"n": 4, "temperature": 1.0, "max_new_tokens": 12, "seed": 3})
    assert len(outs) == 4
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs)
    assert len({tuple(o["output_ids"]) for o in outs}) > 1


def test_seeded_sampling_is_reproducible_whatever_the_batch(engine) -> None:
    params = {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 16, "seed": 1234}
    alone = engine.generate(PROMPT, params)["output_ids"]
    again = engine.generate(PROMPT, params)["output_ids"]
    in_batch = engine.generate(["Other prompt", PROMPT], [{**params, "seed": 5}, params])[1][
        "output_ids"
    ]
    assert alone == again == in_batch
    other = engine.generate(PROMPT, {**params, "seed": 4321})["output_ids"]
    assert other != alone


def test_stop_string_is_cut_and_never_streamed(engine) -> None:
    full = engine.generate(PROMPT, GREEDY)["text"]
    words = full.split()
    stop = words[len(words) // 2]
    expected = full[: full.find(stop)]
    params = {**GREEDY, "stop": [stop]}
    out = engine.generate(PROMPT, params)
    assert out["text"] == expected
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    chunks = [c["text"] for c in engine.generate(PROMPT, params, stream=True)]
    assert chunks[-1] == expected and all(stop not in c for c in chunks)


def test_stop_token_ids_min_tokens_and_zero_tokens(engine) -> None:
    ids = engine.generate(PROMPT, GREEDY)["output_ids"]
    stopped = engine.generate(PROMPT, {**GREEDY, "stop_token_ids": [ids[3]]})
    assert stopped["output_ids"] == ids[: ids.index(ids[3]) + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[3]}
    chat = "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\n"
    short = engine.generate(chat, {"temperature": 0, "max_new_tokens": 64})
    assert short["meta_info"]["finish_reason"]["type"] == "stop"  # the model ends with <|im_end|>
    n = short["meta_info"]["completion_tokens"]
    longer = engine.generate(
        chat, {"temperature": 0, "max_new_tokens": 64, "min_new_tokens": n + 5}
    )
    assert longer["meta_info"]["completion_tokens"] >= n + 5
    zero = engine.generate(PROMPT, {"max_new_tokens": 0})
    assert zero["output_ids"] == [] and zero["text"] == ""
    assert zero["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def _multi_token_char(tokenizer, text: str) -> str:
    """The first character of `text` that the tokenizer splits into 3 or more tokens."""
    return next(c for c in text if len(tokenizer.encode(c)) >= 3)


def test_stop_strings_of_multi_token_characters(engine) -> None:
    """A CJK character (several byte-level tokens) as the stop: it used to run to the length."""
    prompt = "中文：我喜欢吃"
    full = engine.generate(prompt, GREEDY)["text"]
    stop = _multi_token_char(engine.tokenizer, full)
    params = {**GREEDY, "stop": [stop]}
    out = engine.generate(prompt, params)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == full[: full.index(stop)]
    assert [c["text"] for c in engine.generate(prompt, params, stream=True)][-1] == out["text"]


def test_min_new_tokens_with_a_stop_string_streamed_equals_non_streamed(engine) -> None:
    """The stop found after min_new_tokens is the one cut (not the first one in the text)."""
    prompt, params = "The capital of France is", {**GREEDY, "max_new_tokens": 40}
    ref = engine.generate(prompt, params)
    first = ref["text"].index(".")
    n_first = next(n for n in range(1, 41) if "." in engine.tokenizer.decode(ref["output_ids"][:n]))
    params = {**params, "min_new_tokens": n_first + 1, "stop": ["."]}
    out = engine.generate(prompt, params)
    streamed = [c["text"] for c in engine.generate(prompt, params, stream=True)][-1]
    assert out["text"] == streamed and len(out["text"]) > first
    assert ref["text"].startswith(out["text"])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "."}


@pytest.fixture(scope="module")
def overlap_engine():
    """The default model with the overlapped decode schedule forced on (it is CUDA-only)."""
    kwargs = {"overlap_schedule_on_cpu": True}
    yield get_engine(**kwargs)
    release_engine(**kwargs)


def test_overlapped_batch_finishing_at_different_steps(overlap_engine) -> None:
    """Greedy requests of one overlapped batch that end at different steps (max_new_tokens, a stop
    token id, the model's EOS) get exactly what each gets alone, and the overlap did run."""
    chat = "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\n"
    prompts = [PROMPT, PROMPT + " the", chat, "1, 2, 3, 4,"]
    first = overlap_engine.generate(prompts[1], GREEDY)["output_ids"]
    params = [
        {**GREEDY, "max_new_tokens": 3},
        {**GREEDY, "stop_token_ids": [first[5]]},
        {"temperature": 0, "max_new_tokens": 40},  # ends with <|im_end|>
        {**GREEDY, "max_new_tokens": 30},
    ]
    alone = [overlap_engine.generate(p, sp) for p, sp in zip(prompts, params)]
    before = overlap_engine.get_server_info()["overlapped_steps"]
    together = overlap_engine.generate(prompts, params)
    assert overlap_engine.get_server_info()["overlapped_steps"] > before
    lengths = {len(o["output_ids"]) for o in together}
    assert len(lengths) == 4, lengths  # four different finishing steps
    for a, t in zip(alone, together):
        assert t["output_ids"] == a["output_ids"]
        assert t["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]


def test_overlap_launches_no_step_past_a_length_limit(overlap_engine) -> None:
    """A request ending on max_new_tokens costs one prefill and max_new_tokens - 1 decode steps:
    the overlapped schedule does not launch a step for a token that cannot be used."""
    before = overlap_engine.get_server_info()
    out = overlap_engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 6})
    after = overlap_engine.get_server_info()
    assert len(out["output_ids"]) == 6
    assert after["overlapped_steps"] > before["overlapped_steps"]
    assert after["forward_ct"] - before["forward_ct"] == 6
    # One extend (the prompt, first token); five decode steps in six timed iterations (the first
    # only launches a step, the last only reads one).
    assert after["extend_iterations"] - before["extend_iterations"] == 1
    assert after["decode_iterations"] - before["decode_iterations"] == 6
    assert after["extend_seconds"] > before["extend_seconds"]
    assert after["decode_seconds"] > before["decode_seconds"]
    # the five decode forwards' model time lies inside those iterations (CPU: synchronous)
    model_s = after["decode_model_seconds"] - before["decode_model_seconds"]
    assert 0 < model_s < after["decode_seconds"] - before["decode_seconds"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sampling_params": {"temperature": -1}}, "temperature"),
        ({"sampling_params": {"max_new_tokens": 10**6}}, "max_new_tokens"),
        ({"sampling_params": {"bogus": 1}}, "bogus"),
        ({"top_logprobs_num": 1000, "return_logprob": True}, "top_logprobs_num"),
        ({"logprob_start_len": 10**4, "return_logprob": True}, "logprob_start_len"),
    ],
)
def test_invalid_requests_raise_and_the_engine_keeps_serving(engine, kwargs, field) -> None:
    with pytest.raises(InvalidRequestError) as info:
        engine.generate(PROMPT, **kwargs)
    assert field in str(info.value)
    assert engine.generate("Hi", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def test_bad_prompts_are_rejected(engine) -> None:
    with pytest.raises(InvalidRequestError):
        engine.generate("")
    with pytest.raises(InvalidRequestError):
        engine.generate(input_ids=[10**7])
    with pytest.raises(InvalidRequestError):
        engine.generate("word " * 9000)  # beyond the context length


def test_abort_by_request_id(engine) -> None:
    long = {"max_new_tokens": 400, "ignore_eos": True}
    results = []
    for chunk in engine.generate(PROMPT, long, stream=True, rid="long-1"):
        if not results:  # the first chunk: the request is registered and running
            engine.abort_request("long-1")
        results.append(chunk)
    assert results[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert results[-1]["meta_info"]["completion_tokens"] < 400


def test_abort_sent_before_its_request_arrives_takes_effect(engine) -> None:
    """The abort is posted to the engine's loop before the request is: it must not be dropped."""
    engine.abort_request("early-1")
    out = engine.generate(PROMPT, {"max_new_tokens": 400, "ignore_eos": True}, rid="early-1")
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["completion_tokens"] < 400
    # it was consumed: the same rid runs normally afterwards
    again = engine.generate(PROMPT, {"max_new_tokens": 3, "ignore_eos": True}, rid="early-1")
    assert again["meta_info"]["finish_reason"]["type"] == "length"


def test_shared_prefix_hits_the_cache(engine) -> None:
    context = " ".join(
        f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(120)
    )

    def first_chunk(question: str) -> dict:
        stream = engine.generate(context + question, {"max_new_tokens": 1}, stream=True)
        first = next(iter(stream))
        for _ in stream:
            pass
        return first["meta_info"]

    engine.flush_cache()
    cold, warm = first_chunk(" Is 7 even?"), first_chunk(" Is 8 even?")
    assert cold["cached_tokens"] == 0
    # the whole shared context came from the cache: only the question's tokens were computed
    assert warm["prompt_tokens"] - warm["cached_tokens"] <= 8 < warm["cached_tokens"]


def test_server_info_and_flush_cache(engine) -> None:
    info = engine.get_server_info()
    for key in ("max_total_num_tokens", "context_length", "model_name", "free_slots", "device"):
        assert key in info
    engine.generate(PROMPT, {"max_new_tokens": 2})
    assert engine.get_server_info()["evictable_slots"] > 0
    assert engine.flush_cache() is True
    after = engine.get_server_info()
    assert after["evictable_slots"] == 0 and after["free_slots"] == after["max_total_num_tokens"]


def test_token_ids_only_engine_with_dummy_weights() -> None:
    from radixlm.runtime.frontend.engine import Engine

    with Engine(model_path="tiny-llama", load_format="dummy", skip_tokenizer_init=True) as eng:
        out = eng.generate(
            input_ids=[1, 5, 9, 11], sampling_params={"max_new_tokens": 5, "ignore_eos": True}
        )
        assert len(out["output_ids"]) == 5 and out["text"] == ""
        with pytest.raises(InvalidRequestError):
            eng.generate("text needs a tokenizer")
        pids = [eng.get_server_info()[f"{role}_pid"] for role in ("scheduler", "detokenizer")]
    wait_until(lambda: not any(pid_alive(p) for p in pids), "the engine's children to exit")


def test_engine_arguments_are_checked() -> None:
    from radixlm.runtime.frontend.engine import Engine
    from radixlm.runtime.models.default_model import ModelNotFoundError

    with pytest.raises(TypeError, match="bogus_flag"):
        Engine(bogus_flag=1)
    with pytest.raises(InvalidRequestError, match="schedule_policy"):
        Engine(schedule_policy="nope")
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype"):
        Engine(kv_cache_dtype="int4")
    with pytest.raises(InvalidRequestError, match="quantization"):
        Engine(quantization="awq")
    with pytest.raises(ModelNotFoundError):
        Engine(model_path="/nonexistent/model")


def test_streams_after_shutdown_raise_and_close_from_another_thread() -> None:
    """A stream read after shutdown raises RequestAbortedError at once (it used to hang), sync and
    async; closing a stream that another thread is reading aborts it instead of raising."""
    from radixlm.runtime.errors import RequestAbortedError
    from radixlm.runtime.frontend.engine import Engine

    params = {"max_new_tokens": 200, "ignore_eos": True}
    with Engine(model_path="tiny-llama", load_format="dummy", skip_tokenizer_init=True) as eng:
        stream = eng.generate(input_ids=[1, 5, 9], sampling_params=params, stream=True)
        next(stream)
        reader = threading.Thread(target=lambda: [None for _ in stream], daemon=True)
        reader.start()
        stream.close()  # the reader may be inside next(): no "generator already executing"
        reader.join(60)  # NOTE: a hang guard, not a timing assertion
        assert not reader.is_alive()
        wait_idle_and_check(eng)  # the closed stream's request was aborted
        sync = eng.generate(input_ids=[1, 5, 9], sampling_params=params, stream=True)
        next(sync)
        errors: list[BaseException] = []

        async def read_async_after_shutdown() -> None:
            agen = await eng.async_generate(input_ids=[1, 5], sampling_params=params, stream=True)
            await agen.__anext__()
            eng.shutdown()
            try:
                await agen.__anext__()
            except BaseException as exc:
                errors.append(exc)

        def read_after_shutdown() -> None:
            asyncio.run(read_async_after_shutdown())
            try:
                next(sync)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=read_after_shutdown, daemon=True)
        thread.start()
        thread.join(60)  # NOTE: a hang guard, not a timing assertion
    assert not thread.is_alive(), "a stream read after shutdown hangs"
    assert [type(e) for e in errors] == [RequestAbortedError, RequestAbortedError]
    assert all("shut down" in str(e) for e in errors)
