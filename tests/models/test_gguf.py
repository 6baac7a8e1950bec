"""GGUF files of the new architectures, written by our own writer (tests/gguf_writer.py: the way
we believe llama.cpp's converter lays them out, checked against that converter in
tests/models/test_gguf_converter.py) from the tiny transformers models, load into radixlm and give
transformers' logits."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf_writer import ARCH, write_gguf
from tiny_models import TINY, save_tiny

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

IDS = [1, 5, 17, 250, 3, 99, 42, 7, 7, 7, 128, 64, 11, 2, 3, 255, 0, 9, 31, 200]


@pytest.mark.parametrize("name", list(ARCH))
def test_gguf_matches_transformers(tmp_path, name) -> None:
    # llama.cpp's qwen3moe / qwen2moe have no dense layers (nor do the released models), and
    # its qwen2moe no sliding windows
    extra: dict = {"mlp_only_layers": []} if name in ("qwen3_moe", "qwen2_moe") else {}
    if name == "qwen3_moe":  # llama.cpp's qwen3moe always renormalises the top-k weights
        extra["norm_topk_prob"] = True
    if name == "qwen2_moe":
        extra["use_sliding_window"] = False
    if name.startswith("gemma"):  # llama.cpp: 1/sqrt(head_dim) below 27B (no GGUF key)
        extra["query_pre_attn_scalar"] = TINY[name]["head_dim"]
    hf = save_tiny(name, str(tmp_path / "hf"), **extra)
    path = str(tmp_path / f"{name}.gguf")
    write_gguf(hf, name, path)
    source = resolve_model(path)
    assert source.config.architecture == TINY[name]["architectures"][0]
    args = ServerArgs(model_path=path, max_total_tokens=256, max_running_requests=2)
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]
    ours = runner_logits(ModelRunner(args, source), IDS)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_dequantize_matches_llama_cpps_reference(qtype) -> None:
    """radixlm's own (torch) de-quantizer of the 32-value block types against `gguf.quants`
    (llama.cpp's Python reference): the default model's Q4_1 / Q8_0 also pass through
    transformers' loader in tests/e2e/test_gguf_oracle.py; Q4_0 has only this check."""
    from gguf.quants import dequantize as reference
    from gguf.quants import quantize

    from radixlm.runtime.models.gguf_file import dequantize

    kind = gguf.GGMLQuantizationType[qtype]
    shape = (48, 96)
    values = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3
    raw = quantize(values, kind)
    expected = reference(raw, kind).reshape(shape)
    got = dequantize(raw.reshape(-1), int(kind), shape)
    assert got.dtype == torch.float32
    assert np.array_equal(got.numpy(), expected), np.abs(got.numpy() - expected).max()
    assert np.abs(expected - values).max() < 1.0  # the reference itself round-trips the values


def test_gemma2_without_a_window_key_gets_llama_cpps_default(tmp_path) -> None:
    """Gemma 2 files from before llama.cpp's converter wrote `gemma2.attention.sliding_window`
    (2024) run, in llama.cpp, with its default window of 4096 tokens on the even layers."""
    path = str(tmp_path / "gemma2.gguf")
    w = gguf.GGUFWriter(path, "gemma2")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(16)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(256)
    w.add_tensor("token_embd.weight", np.zeros((256, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    config = resolve_model(path).config
    assert (config.sliding_window, config.layer_windows) == (4096, (4096, None))
