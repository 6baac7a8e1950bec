"""`--reasoning-parser` (qwen3, deepseek-r1): `<think>` sections split into reasoning_content,
plain and streamed (token by token on a tokenizer with the think tags as special tokens), and on
the real server (`--reasoning-parser qwen3`, whose markers are several tokens on the default
vocabulary) through the `openai` client and `/separate_reasoning`."""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest
from compat.tokenizers import special_tokenizer

from radixlm.runtime.server.openai_format import StreamConverter
from radixlm.runtime.server.reasoning_parsers import REASONING_PARSERS, Split
from radixlm.runtime.server.reasoning_stream import ReasoningChunks
from server_process import ServerProcess

CASES = [
    ("qwen3", "<think>\nLet me add 2 and 2.\n</think>\n\nIt is 4.", Split("Let me add 2 and 2.", "It is 4.")),
    ("qwen3", "It is 4.", Split(None, "It is 4.")),
    ("qwen3", "<think>still thinking", Split("still thinking", "")),
    ("deepseek-r1", "Let me add.\n</think>\nIt is 4.", Split("Let me add.", "It is 4.")),
    ("deepseek-r1", "<think>Let me add.</think>It is 4.", Split("Let me add.", "It is 4.")),
    ("deepseek-r1", "no end tag", Split("no end tag", "")),
]  # fmt: skip


@pytest.mark.parametrize(("parser", "text", "expected"), CASES)
def test_split(parser: str, text: str, expected: Split) -> None:
    assert REASONING_PARSERS[parser].split(text) == expected


@pytest.mark.parametrize(("parser", "text", "expected"), CASES)
def test_streamed_reasoning_deltas(parser: str, text: str, expected: Split) -> None:
    tok = special_tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    if "</think>" in text:
        assert tok.convert_tokens_to_ids("</think>") in ids
    conv, split = (
        StreamConverter(True, "m", 1, 1, False, False),
        ReasoningChunks(REASONING_PARSERS[parser]),
    )
    chunks: list[dict[str, Any]] = []
    for k in range(1, len(ids) + 1):
        meta = {"finish_reason": {"type": "stop"} if k == len(ids) else None}
        cumulative = tok.decode(ids[:k], skip_special_tokens=False)
        chunks += split.filter(
            conv.convert({"text": cumulative, "output_ids": ids[:k], "meta_info": meta})
        )
    deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    assert reasoning.strip() == (expected.reasoning or "") and content == expected.content
    for d in deltas:  # no delta ever carries a piece of a tag
        assert "<" not in d.get("content", "") + d.get("reasoning_content", "")
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.fixture(scope="module")
def client(compat_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=compat_server.base_url + "/v1", api_key=compat_server.api_key)


THINKING = r"<think>[a-z ]{1,12}</think>[A-Z][a-z]{1,8}\."
ANSWER = r"[A-Z][a-z]{1,8}\."
NUMBER = r"[1-9][0-9]{0,2}"  # nothing of `<think>` / `</think>` fits


def _default_ids(text: str) -> list[int]:
    from radixlm.runtime.frontend.tokenizer import load_tokenizer
    from radixlm.runtime.models.default_model import default_model_path

    return load_tokenizer(default_model_path()).encode(text, add_special_tokens=False)


def test_constraint_applies_after_reasoning(
    client: openai.OpenAI, compat_server: ServerProcess
) -> None:
    """A prompt that already opened `<think>` (deepseek-r1 style, native API with
    `think_end_ids`): the reasoning is free (logit_bias pushes `</think>`, which the regex forbids)
    and the regex constrains only the answer after `</think>` (temperature 0.8, 8 seeds); the
    server's `/separate_reasoning` splits it. On the OpenAI API the server sets those ids itself."""
    end = _default_ids("</think>")  # NOTE: the default vocabulary: `</think>` is 3 tokens
    prompt = "<|im_start|>user\nSay a word.<|im_end|>\n<|im_start|>assistant\n<think>\n"
    for seed in range(8):
        sp = {"regex": ANSWER, "think_end_ids": end, "logit_bias": {str(t): 100 for t in end},
              "temperature": 0.8, "seed": seed, "max_new_tokens": 64}  # fmt: skip
        out = compat_server.client.post("/generate", json={"text": prompt, "sampling_params": sp})
        assert out.status_code == 200, out.text
        text = out.json()["text"]
        assert "</think>" in text, text
        split = compat_server.client.post(
            "/separate_reasoning", json={"text": text, "reasoning_parser": "deepseek-r1"}
        ).json()
        assert split["reasoning_text"] is not None and re.fullmatch(ANSWER, split["text"]), split
    compat_server.wait_idle_and_check_kv()


def _think_bias() -> dict[str, int]:
    """logit_bias that makes the default model think first: `<` (+30) opens, then the pieces of
    `</think>` (+100) fill the reasoning until they spell the end marker; the answer's regex
    forbids all of them, so after `</think>` the model answers on its own."""
    bias = {str(t): 100 for t in _default_ids("</think>")}
    bias[str(_default_ids("<")[0])] = 30
    return bias


def test_server_splits_reasoning(client: openai.OpenAI, compat_server: ServerProcess) -> None:
    """`--reasoning-parser qwen3` on the default vocabulary, where `<think>` and `</think>` are
    several ordinary tokens: the chat endpoint sets the marker ids itself, the reasoning is free
    and the regex constrains only the answer after `</think>` (temperature 0.8, 8 seeds; the
    server splits reasoning_content from content), streaming too."""
    msgs = [{"role": "user", "content": "Say a number."}]
    extra = {"regex": NUMBER, "logit_bias": _think_bias()}
    for seed in range(8):
        resp = client.chat.completions.create(
            model="m", messages=msgs, temperature=0.8, seed=seed, max_tokens=64, extra_body=extra
        )
        msg = resp.choices[0].message
        assert resp.choices[0].finish_reason == "stop", msg
        # NOTE: the reasoning may be empty; the markers themselves are text the regex forbids.
        assert msg.reasoning_content is not None and "<" not in msg.reasoning_content, msg
        assert re.fullmatch(NUMBER, msg.content), msg
    stream = client.chat.completions.create(
        model="m", messages=msgs, temperature=0.8, seed=1, max_tokens=64, stream=True,
        extra_body=extra,
    )  # fmt: skip
    reasoning = content = ""
    for chunk in stream:
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    assert re.fullmatch(NUMBER, content) and "<" not in reasoning, (
        reasoning,
        content,
    )
    # separate_reasoning: false keeps the raw text, and the regex covers all of it.
    raw = client.chat.completions.create(
        model="m", messages=msgs, temperature=0.8, seed=0, max_tokens=40,
        extra_body={"regex": THINKING, "separate_reasoning": False},
    )  # fmt: skip
    assert re.fullmatch(THINKING, raw.choices[0].message.content)
    compat_server.wait_idle_and_check_kv()


def test_separate_reasoning_endpoint(compat_server: ServerProcess) -> None:
    c = compat_server.client
    out = c.post("/separate_reasoning", json={"text": "<think>hm</think>Yes."}).json()
    assert out == {"text": "Yes.", "reasoning_text": "hm"}
    out = c.post(
        "/separate_reasoning", json={"text": "hm</think>Yes.", "reasoning_parser": "deepseek-r1"}
    ).json()
    assert out == {"text": "Yes.", "reasoning_text": "hm"}
    bad = c.post("/separate_reasoning", json={"text": "x", "reasoning_parser": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_parser"


def test_language_separate_reasoning(compat_server: ServerProcess) -> None:
    """SGLang's helper name in radixlm's language, on 8 sampled (temperature 0.8) runs."""
    import radixlm as rl

    backend = rl.RuntimeEndpoint(compat_server.base_url, api_key=compat_server.api_key)

    @rl.function
    def think(s: Any) -> None:
        s += rl.user("Say a word.")
        s += rl.assistant(
            rl.separate_reasoning(rl.gen("answer", regex=THINKING, max_tokens=40), "qwen3")
        )

    states = think.run_batch([{}] * 8, backend=backend, temperature=0.8)
    for state in states:
        assert re.fullmatch(r"[A-Z][a-z]{1,8}\.", state["answer"]), state.text()
        assert re.fullmatch(r"[a-z ]{0,12}", state["answer_reasoning_content"])
        assert "<think>" not in state.text() and state.messages()[-1]["content"] == state["answer"]
    with pytest.raises(ValueError, match="model_type"):
        rl.separate_reasoning(rl.gen("x"), "nope")
    backend.shutdown()
