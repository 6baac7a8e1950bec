"""Our own GGUF writer for the tiny checkpoints of the new architectures (tests/models/test_gguf.py):
the `gguf` package, laid out the way we believe llama.cpp's converter lays them out (its
tensor-name map, 3-D expert tensors, Gemma norms stored as 1 + w, Phi-3's fused projections and
LongRoPE factor tensors, its metadata keys).

tests/models/test_gguf_converter.py checks that belief against llama.cpp's converter itself: on the
configs both can express, the tensors (names, shapes, values) and the metadata agree, but for
`EXTRA_KEYS`: keys llama.cpp reads and its converter leaves out, written here so that the files
carry what the tiny configs use. Beyond those configs this writer also puts a window on Mixtral's
and Qwen3's layers (radixlm reads it; llama.cpp's llama and qwen3 have no windows)."""

from __future__ import annotations

import math

import gguf
import numpy as np

# written here, not by llama.cpp's converter: `vocab_size` (these files have no tokenizer),
# `attention.sliding_window_pattern` (Gemma 2/3 periods other than llama.cpp's defaults),
# `attention.{key,value}_length` (Phi-3: llama.cpp takes hidden / heads), `rope.freq_base`
# (Gemma 2: llama.cpp's default, 10000)
EXTRA_KEYS = (
    "vocab_size",
    "attention.sliding_window_pattern",
    "attention.key_length",
    "attention.value_length",
    "rope.freq_base",
)
# written by the converter, not here: Mixtral's `rope.dimension_count` (head_dim, the default)
MISSING_KEYS = ("rope.dimension_count",)

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


def write_gguf(model, name: str, path: str) -> None:
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
        # NOTE: no `expert_weights_norm`: llama.cpp's qwen3moe always renormalises (and its
        # converter writes no such key; tests/models/test_gguf_converter.py)
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
        original = rope["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(original)
        scale = cfg.max_position_embeddings / original  # LongRoPE's attention factor
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        w.add_sliding_window(0)  # llama.cpp's converter: 0 = no window
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
