"""The text pipeline over HTTP, on the shared server through the real `openai` client: stop
strings of multi-token characters, stop strings checked on the visible text, min_new_tokens with
a stop (streamed == non-streamed), logprob bytes, top_logprobs keys, text_offset, and request
validation (seed, stream_options)."""

from __future__ import annotations

import openai
import pytest

from radixlm.runtime.frontend.tokenizer import load_tokenizer
from radixlm.runtime.models.default_model import default_model_path

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_model_path())


@pytest.fixture(autouse=True)
def _kv_accounting(server):
    yield
    server.wait_idle_and_check_kv()


def _multi_token_char(tokenizer, text: str) -> str:
    """The first character of `text` that the tokenizer splits into 3 or more tokens."""
    return next(c for c in text if len(tokenizer.encode(c)) >= 3)


def test_completion_stop_of_a_multi_token_character(client, tokenizer):
    kwargs = {"model": "m", "prompt": "中文：我喜欢吃", "max_tokens": 24, **GREEDY}
    full = client.completions.create(**kwargs).choices[0].text
    stop = _multi_token_char(tokenizer, full[1:])  # not the first: some text comes before it
    out = client.completions.create(stop=stop, **kwargs).choices[0]
    assert out.finish_reason == "stop" and out.text == full[: full.index(stop)]
    parts = [c.choices[0].text for c in client.completions.create(stop=stop, stream=True, **kwargs)]
    assert "".join(parts) == out.text


def test_chat_stop_of_an_emoji(client, tokenizer):
    messages = [{"role": "user", "content": "Send me three happy emojis."}]
    kwargs = {"model": "m", "messages": messages, "max_tokens": 24, **GREEDY}
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    stop = next(c for c in full if len(c.encode()) == 4)  # an emoji: 4 bytes, 4 byte tokens
    out = client.chat.completions.create(stop=[stop], **kwargs).choices[0]
    assert out.finish_reason == "stop" and out.message.content == full[: full.index(stop)]


def test_stop_spanning_a_hidden_special_token_matches(server):
    """The user sees `OK\\n` (the `<|im_end|>` between is skipped): the stop `OK\\n` stops."""
    prompt = "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\n"
    params = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}

    def generate(**extra):
        body = {"text": prompt, "sampling_params": {**params, **extra}}
        return server.client.post("/generate", json=body).json()

    raw = generate(skip_special_tokens=False)["text"]
    head = raw[: raw.index("<|im_end|>")]
    assert raw.startswith(head + "<|im_end|>\n")
    stop = head[-2:] + "\n"
    out = generate(stop=[stop])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == head[:-2]


CJK = {"model": "m", "prompt": "中文：我喜欢吃", "max_tokens": 12, **GREEDY}


def test_chat_logprob_bytes_rebuild_the_content(client):
    """Partial-UTF-8 tokens carry their own bytes (not those of U+FFFD): joined, they are the
    content; each token string is valid text or OpenAI's `bytes:\\xNN` escape."""
    messages = [{"role": "user", "content": "Send me three happy emojis."}]
    out = client.chat.completions.create(
        model="m", messages=messages, max_tokens=12, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = out.choices[0].logprobs.content
    raw = b"".join(bytes(t.bytes) for t in content)
    assert raw.decode() == out.choices[0].message.content and len(raw) > len(content)
    for t in content:
        assert t.top_logprobs[0].bytes == t.bytes and "\ufffd" not in t.token
        assert all("\ufffd" not in alt.token for alt in t.top_logprobs)


def test_completion_top_logprobs_keys_never_collide(client):
    """Alternatives that all decode to U+FFFD alone used to share one key (2 keys of 5)."""
    lp = client.completions.create(logprobs=5, **CJK).choices[0].logprobs
    assert all(len(top) == 5 for top in lp.top_logprobs)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == value  # greedy: the chosen token is the top-1, under its own key


def test_text_offset_streamed_equals_non_streamed_and_counts_the_echo(client):
    whole = client.completions.create(logprobs=1, **CJK).choices[0]
    parts = list(client.completions.create(logprobs=1, stream=True, **CJK))
    offsets = [o for p in parts if p.choices[0].logprobs for o in p.choices[0].logprobs.text_offset]
    assert offsets == whole.logprobs.text_offset
    assert offsets == sorted(offsets) and offsets[-1] < len(whole.text)
    # Echo: offsets run through the prompt, then the completion (streamed and not).
    echoed = client.completions.create(logprobs=1, echo=True, **CJK).choices[0]
    parts = list(client.completions.create(logprobs=1, echo=True, stream=True, **CJK))
    streamed = [
        o for p in parts if p.choices[0].logprobs for o in p.choices[0].logprobs.text_offset
    ]
    assert streamed == echoed.logprobs.text_offset
    n = len(whole.logprobs.text_offset)
    prompt = CJK["prompt"]
    assert echoed.logprobs.text_offset[-n:] == [len(prompt) + o for o in whole.logprobs.text_offset]


def test_negative_seed_is_accepted_and_reproducible(client):
    kwargs = {"model": "m", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0}
    a = client.completions.create(seed=-7, **kwargs).choices[0].text
    assert a == client.completions.create(seed=-7, **kwargs).choices[0].text
    assert client.completions.create(seed=-(2**63), **kwargs).choices[0].finish_reason == "length"
    # n > 1 seeds its samples seed, seed + 1, ...: wrapped within int64, never refused.
    top = client.completions.create(seed=2**63 - 1, n=2, **kwargs)
    assert [c.finish_reason for c in top.choices] == ["length", "length"]


def test_stream_options_without_stream_is_rejected(client):
    opts = {"include_usage": True}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="m", prompt="hi", max_tokens=2, stream_options=opts)
    assert err.value.body["param"] == "stream_options" and "stream" in err.value.body["message"]
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=2, stream=False, stream_options=opts
        )
    assert err.value.body["param"] == "stream_options"
