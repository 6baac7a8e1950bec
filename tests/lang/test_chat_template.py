"""Deriving per-role prefixes/suffixes from real Jinja chat templates."""

from __future__ import annotations

import jinja2
import pytest

from radixlm.lang.chat_template import PLAIN_TEMPLATE, from_jinja, from_tokenizer

# SmolLM2-135M-Instruct's template, as stored in its GGUF (tokenizer.chat_template).
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

GEMMA_LIKE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}"
)


def test_smollm2_chatml_with_default_system_prompt():
    t = from_jinja(SMOLLM2, eos_token="<|im_end|>")
    assert t.role_prefix_and_suffix == {
        "system": ("<|im_start|>system\n", "<|im_end|>\n"),
        "user": ("<|im_start|>user\n", "<|im_end|>\n"),
        "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n"),
    }
    assert (
        t.default_system_prompt
        == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    )
    assert t.stop_str == ("<|im_end|>",)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ],
)
def test_get_prompt_matches_the_template_rendering(messages):
    t = from_jinja(SMOLLM2, eos_token="<|im_end|>")
    expected = jinja2.Environment().from_string(SMOLLM2).render(messages=messages)
    assert t.get_prompt(messages) == expected


def test_llama3_template_without_bos_and_without_default_system():
    t = from_jinja(LLAMA3, bos_token="", eos_token="<|eot_id|>")
    assert t.get_prefix_and_suffix("user") == (
        "<|start_header_id|>user<|end_header_id|>\n\n",
        "<|eot_id|>",
    )
    assert t.default_system_prompt is None
    assert t.stop_str == ("<|eot_id|>",)


def test_template_refusing_system_role_still_works():
    t = from_jinja(GEMMA_LIKE)
    assert t.get_prefix_and_suffix("assistant") == ("<start_of_turn>model\n", "<end_of_turn>\n")
    assert t.get_prefix_and_suffix("system") == ("", "\n\n")


class _Tok:
    def __init__(self, chat_template):
        self.chat_template = chat_template
        self.eos_token = "<|im_end|>"


def test_from_tokenizer_falls_back_to_plain():
    assert from_tokenizer(_Tok(None)) is PLAIN_TEMPLATE
    assert from_tokenizer(_Tok({"default": SMOLLM2})).default_system_prompt is not None
    with pytest.warns(UserWarning, match="plain chat template"):
        assert from_tokenizer(_Tok("{{ messages[0]['content'] }}")) is PLAIN_TEMPLATE
