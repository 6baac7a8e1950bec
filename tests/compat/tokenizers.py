"""The default model's tokenizer with the special tokens of other model families added (Qwen's
`<tool_call>`, Llama 3's `<|python_tag|>`, Mistral's `[TOOL_CALLS]`, the `<think>` tags), so a
format's markers are single tokens as on those models. Loaded once per test process."""

from __future__ import annotations

import functools
from typing import Any

SPECIAL = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<think>", "</think>"]


@functools.cache
def special_tokenizer() -> Any:
    from radixlm.runtime.frontend.tokenizer import load_tokenizer
    from radixlm.runtime.models.default_model import default_model_path

    tok = load_tokenizer(default_model_path())
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    return tok
