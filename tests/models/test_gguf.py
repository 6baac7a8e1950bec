"""GGUF files of the new architectures, written with the `gguf` package from the tiny
transformers models the way llama.cpp's converter lays them out (its tensor-name map, 3-D expert
tensors, Gemma norms stored as 1 + w, Phi-3's fused projections and LongRoPE factor tensors, its
metadata keys), load into radixlm and give transformers' logits."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from tiny_models import TINY, save_tiny

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

IDS = [1, 5, 17, 250, 3, 99, 42, 7, 7, 7, 128, 64, 11, 2, 3, 255, 0, 9, 31, 200]
ARCH = {
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE,
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gemma3": gguf.MODEL_ARCH.GEMMA3,
    "phi3": gguf.MODEL_ARCH.PHI3,
    "phi4_mini": gguf.MODEL_ARCH.PHI3,  # partial rotary: rope.dimension_count < head_dim
    "mixtral": gguf.MODEL_ARCH.LLAMA,  # llama.cpp: a llama with experts
}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves a llama's q/k rows (its rotary layout)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _write_gguf(model, name: str, path: str) -> None:
    cfg = model.config
    arch = ARCH[name]
    layers = cfg.num_hidden_layers
    tmap = gguf.get_tensor_name_map(arch, layers)
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    w.add_block_count(layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    rope = cfg.rope_parameters
    rope = rope.get("full_attention", rope)
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    types = getattr(cfg, "layer_types", None)
    if getattr(cfg, "sliding_window", None) and (not types or "sliding_attention" in types):
        w.add_sliding_window(cfg.sliding_window)  # without a pattern: every layer (Mixtral)
        if types:
            w.add_sliding_window_pattern([t == "sliding_attention" for t in types])
    if name == "mixtral":
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    if name == "qwen3_moe":
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_weights_norm(cfg.norm_topk_prob)
    if name == "qwen2_moe":
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if name == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if name == "gemma3":
        w.add_rope_freq_base_swa(cfg.rope_parameters["sliding_attention"]["rope_theta"])
    if name.startswith("phi"):
        w.add_rope_dimension_count(int(cfg.head_dim * rope.get("partial_rotary_factor", 1.0)))
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    state = model.state_dict()
    experts: dict[str, np.ndarray] = {}
    for key, t in state.items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = t.float().numpy()
        if name.startswith("gemma") and key.endswith("norm.weight"):
            data = data + 1.0  # llama.cpp's Gemma converter stores 1 + w
        if ".mlp.experts." in key:  # transformers 5: [E, 2I, H] gate_up and [E, H, I] down
            layer = key.split(".mlp.experts.")[0] + ".mlp.experts."
            if key.endswith("gate_up_proj"):
                gate, up = np.split(data, 2, axis=1)
                experts[layer + "gate_proj"], experts[layer + "up_proj"] = gate, up
            else:
                experts[layer + "down_proj"] = data
            continue
        if name == "mixtral" and key.endswith(("q_proj.weight", "k_proj.weight")):
            data = _permute(
                data, cfg.num_attention_heads if "q_proj" in key else cfg.num_key_value_heads
            )
        w.add_tensor(tmap.get_name(key, try_suffixes=(".weight", ".bias")), data)
    for key, data in experts.items():  # llama.cpp's 3-D ffn_{gate,up,down}_exps
        w.add_tensor(tmap.get_name(key) + ".weight", np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name", list(ARCH))
def test_gguf_matches_transformers(tmp_path, name) -> None:
    # llama.cpp's qwen3moe / qwen2moe have no dense layers (nor do the released models), and
    # its qwen2moe no sliding windows
    extra: dict = {"mlp_only_layers": []} if name in ("qwen3_moe", "qwen2_moe") else {}
    if name == "qwen2_moe":
        extra["use_sliding_window"] = False
    if name.startswith("gemma"):  # llama.cpp: 1/sqrt(head_dim) below 27B (no GGUF key)
        extra["query_pre_attn_scalar"] = TINY[name]["head_dim"]
    hf = save_tiny(name, str(tmp_path / "hf"), **extra)
    path = str(tmp_path / f"{name}.gguf")
    _write_gguf(hf, name, path)
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
