"""Greedy token parity with transformers for every registered architecture's tiny model, through
the real Engine: the radix cache on (a second round reuses prefixes longer than the window),
chunked prefill (8-token chunks) and a KV pool small enough that decoding retracts requests.
The torch attention backend for every architecture; the Triton kernels (Triton's interpreter on
CPU) for the windowed / soft-capped / MoE ones."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY, WINDOW, save_tiny

from radixlm.runtime.models.hf_reference import HFReference
from tests_helpers import get_engine, release_engine

MAX_NEW = 16
_SHARED = [1, 17, 42, 99, 7, 7, 250, 3, 64, 128, 11, 31, 200, 5, 77, 150, 9, 21]  # > WINDOW
PROMPTS = [
    [*_SHARED, 4, 8, 15],
    [*_SHARED, 16, 23, 42, 108, 3],
    [*_SHARED, 201, 202],
    [9, 8, 7, 6, 5, 4, 3, 2, 1, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110],
]
assert len(_SHARED) > WINDOW
ENGINE_ARGS = {
    "skip_tokenizer_init": True,
    "dtype": "float32",
    "chunked_prefill_size": 8,
    "max_total_tokens": 64,  # 48 prompt + 4 x 16 new tokens do not fit: decoding retracts
    "max_running_requests": 4,
    "random_seed": 0,
}
CASES = [(name, "torch") for name in TINY] + [
    ("gemma2", "triton"),
    ("gemma3", "triton"),
    ("qwen3_moe", "triton"),
]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, tuple[str, list[list[int]]]]:
    """name -> (checkpoint dir, transformers' greedy tokens for each prompt)."""
    out = {}
    for name in {n for n, _ in CASES}:
        path = str(tmp_path_factory.mktemp(name))
        ref = HFReference(save_tiny(name, path), None, {}, None)
        out[name] = (path, [ref.greedy(p, MAX_NEW) for p in PROMPTS])
    return out


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_greedy_parity(tiny_models, name, backend) -> None:
    path, expected = tiny_models[name]
    kwargs = {"model_path": path, "attention_backend": backend, **ENGINE_ARGS}
    engine = get_engine(**kwargs)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
    try:
        first = engine.generate(input_ids=PROMPTS[0], sampling_params=params)
        assert first["output_ids"] == expected[0]
        outs = engine.generate(input_ids=PROMPTS, sampling_params=[params] * len(PROMPTS))
        assert [o["output_ids"] for o in outs] == expected
        cached = [o["meta_info"]["cached_tokens"] for o in outs]
        assert max(cached) > WINDOW, cached  # a reused prefix the windowed layers cut
        assert engine.get_server_info()["retracted"] > 0
    finally:
        release_engine(**kwargs)


def test_windows_change_the_tokens(tiny_models) -> None:
    """The window matters on these prompts: without it transformers decodes other tokens."""
    import tiny_models as tm
    from transformers import AutoModelForCausalLM

    path, expected = tiny_models["qwen3"]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.config.layer_types = ["full_attention"] * tm.TINY["qwen3"]["num_hidden_layers"]
    for layer in model.model.layers:
        layer.self_attn.sliding_window = None
        layer.attention_type = "full_attention"
    model.model.has_sliding_layers = False
    ref = HFReference(model, None, {}, None)
    assert [ref.greedy(p, MAX_NEW) for p in PROMPTS] != expected
