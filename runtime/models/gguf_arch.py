"""GGUF files of the non-Llama architectures (registry.py): llama.cpp's metadata keys -> a
`config.json`-style dict, and llama.cpp's tensor names -> checkpoint (Hugging Face) names.

Metadata (`{arch}.` prefix): block_count, embedding_length, feed_forward_length,
attention.head_count(_kv), attention.key_length, attention.layer_norm_rms_epsilon,
rope.freq_base, rope.dimension_count (rotary dims below head_dim: partial rotary, Phi-4-mini),
the tensor `rope_freqs.weight` (Llama 3.1+'s rope scaling as per-dim frequency divisors),
context_length; MoE: expert_count, expert_used_count,
expert_feed_forward_length, expert_weights_norm (default: on, off for qwen2moe as in llama.cpp),
expert_shared_feed_forward_length (Qwen2-MoE's shared expert); windows: attention.sliding_window
(Gemma 2 without it: 4096, as llama.cpp),
attention.sliding_window_pattern (an int period or one bool per layer), rope.freq_base_swa;
Gemma 2: attn_logit_softcapping, final_logit_softcapping; rope.scaling.{type,factor,
original_context_length,attn_factor}; Phi-3's LongRoPE factors are the tensors
`rope_factors_{long,short}.weight`.
Mixtral comes as `general.architecture = llama` with `llama.expert_count` (and llama's q/k rows
interleaved for its rotary layout, undone here as for Llama).
Tensors: llama.cpp stores Gemma's norms as `1 + w` (its converter adds 1): they are read back as w;
experts as 3-D `ffn_{gate,up,down}_exps` `[E, rows, cols]`, yielded per expert (Qwen2-MoE's shared
expert: `ffn_{gate,up,down}_shexp`, its gate `ffn_gate_inp_shexp`); Phi-3's fused
`attn_qkv` and `ffn_up` (gate and up) as they are.
# NOTE: llama.cpp scales Gemma's queries by 1/sqrt(head_dim), except for the 27B models
# (Gemma 2: 46 layers, Gemma 3: 62 layers), whose `query_pre_attn_scalar` is hidden / heads; no
# GGUF key says so, so the layer count decides, as in llama.cpp.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.gguf_file import GGUFFile, unpermute_rows
from radixlm.runtime.models.registry import ARCHITECTURES, arch_from_gguf

_COMMON = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",  # Qwen2-MoE's shared expert
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_GEMMA = {
    **_COMMON,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}


def gguf_arch_config(gguf: GGUFFile) -> ModelConfig:
    arch = gguf.architecture
    md = gguf.metadata
    # NOTE: llama.cpp writes Mixtral as a `llama` with experts
    mixtral = arch == "llama" and bool(md.get("llama.expert_count"))
    name = "MixtralForCausalLM" if mixtral else arch_from_gguf(arch)

    def get(key: str, default: Any = None) -> Any:
        return md.get(f"{arch}.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    layers = int(get("block_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    vocab = get("vocab_size") or len(md.get("tokenizer.ggml.tokens", []))
    cfg: dict[str, Any] = {
        "architectures": [name],
        "model_type": ARCHITECTURES[name].model_type,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length", 0)),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
    }
    if get("expert_count"):
        cfg.update(
            num_experts=int(get("expert_count")),
            num_experts_per_tok=int(get("expert_used_count")),
            moe_intermediate_size=int(
                get("expert_feed_forward_length") or get("feed_forward_length")
            ),
            # NOTE: llama.cpp never renormalises qwen2moe's top-k weights (nor do its checkpoints)
            norm_topk_prob=bool(get("expert_weights_norm", arch != "qwen2moe")),
        )
        if get("expert_shared_feed_forward_length"):  # Qwen2-MoE
            cfg["shared_expert_intermediate_size"] = int(get("expert_shared_feed_forward_length"))
            cfg["qkv_bias"] = "blk.0.attn_q.bias" in gguf.tensors
        cfg["intermediate_size"] = cfg["intermediate_size"] or cfg["moe_intermediate_size"]
    # NOTE: llama.cpp's gemma2 defaults to a 4096-token window (files from before its converter
    # wrote the key); elsewhere no key (or 0, Phi-3's "none") means no window
    window = get("attention.sliding_window", 4096 if arch == "gemma2" else None)
    if window:
        cfg["sliding_window"] = int(window)
        cfg["layer_types"] = _layer_types(arch, layers, get("attention.sliding_window_pattern"))
    if arch in ("gemma2", "gemma3"):
        big = layers == (46 if arch == "gemma2" else 62)
        cfg["query_pre_attn_scalar"] = hidden // heads if big else head_dim
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        cfg["attn_logit_softcapping"] = get("attn_logit_softcapping")
        cfg["final_logit_softcapping"] = get("final_logit_softcapping")
        if arch == "gemma3":
            cfg["rope_local_base_freq"] = float(get("rope.freq_base_swa", 10000.0))
    rot = get("rope.dimension_count")
    if rot and int(rot) < head_dim:  # partial rotary embeddings (Phi-4-mini)
        factor = int(rot) / head_dim
        # NOTE: int(head_dim * factor) must give rot back (a float product may land just below)
        cfg["partial_rotary_factor"] = (
            factor if int(head_dim * factor) == int(rot) else ((int(rot) + 0.5) / head_dim)
        )
    cfg["rope_scaling"] = gguf_rope_scaling(gguf)
    if "rope_factors_long.weight" in gguf.tensors:  # Phi-3 LongRoPE
        original = int(get("rope.scaling.original_context_length", cfg["max_position_embeddings"]))
        cfg["original_max_position_embeddings"] = original
        cfg["rope_scaling"] = {
            "rope_type": "longrope",
            "long_factor": gguf.tensors["rope_factors_long.weight"].to_torch().tolist(),
            "short_factor": gguf.tensors["rope_factors_short.weight"].to_torch().tolist(),
            "original_max_position_embeddings": original,
        }
        if get("rope.scaling.attn_factor") is not None:
            cfg["rope_scaling"]["attention_factor"] = float(get("rope.scaling.attn_factor"))
    return ModelConfig.from_hf_dict(cfg)


def gguf_rope_scaling(gguf: GGUFFile) -> dict[str, Any] | None:
    """The rotary scaling of a GGUF (Phi-3's LongRoPE aside): `rope.scaling.type` linear with its
    `rope.scaling.factor`, and llama.cpp's `rope_freqs.weight` tensor, one divisor of the rotary
    frequency per pair of rotary dims: what its converter writes for Llama 3.1+'s "llama3"
    scaling (with no metadata key), and what llama.cpp applies on top of a linear factor."""
    arch = gguf.architecture
    linear = gguf.metadata.get(f"{arch}.rope.scaling.type") == "linear"
    factor = float(gguf.metadata[f"{arch}.rope.scaling.factor"]) if linear else 1.0
    if "rope_freqs.weight" in gguf.tensors:
        divisors = gguf.tensors["rope_freqs.weight"].to_torch().float() * factor
        return {"rope_type": "freq_factors", "freq_factors": divisors.tolist()}
    return {"rope_type": "linear", "factor": factor} if linear else None


def _layer_types(arch: str, layers: int, pattern: Any) -> list[str]:
    """Windowed layers from `sliding_window_pattern` (bools, or a period: every period-th layer
    global), else llama.cpp's defaults: Gemma 2 even layers, Gemma 3 period 6, others all."""
    if isinstance(pattern, list):
        sliding = [bool(p) for p in pattern]
    elif pattern or arch in ("gemma2", "gemma3"):
        period = int(pattern or (2 if arch == "gemma2" else 6))
        sliding = [(i + 1) % period != 0 for i in range(layers)]
    else:
        sliding = [True] * layers
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def iter_gguf_arch(gguf: GGUFFile, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    gemma = gguf.architecture in ("gemma2", "gemma3")
    names = _GEMMA if gemma else _COMMON
    phi3 = gguf.architecture == "phi3"
    permute = gguf.architecture == "llama"  # Mixtral: llama.cpp's interleaved q/k rows
    for name, tensor in gguf.tensors.items():
        if name.startswith("rope_"):
            continue
        data = tensor.to_torch()
        if gemma and name.endswith("norm.weight"):
            data = data.float() - 1.0  # NOTE: llama.cpp stores Gemma's norms as 1 + w
        if name == "token_embd.weight":
            yield "model.embed_tokens.weight", data
        elif name == "output_norm.weight":
            yield "model.norm.weight", data
        elif name == "output.weight":
            yield "lm_head.weight", data
        elif name.startswith("blk."):
            _, layer, part, kind = name.split(".", 3)
            prefix = f"model.layers.{layer}."
            if part in _EXPERTS:
                for e in range(data.shape[0]):
                    yield f"{prefix}mlp.experts.{e}.{_EXPERTS[part]}.{kind}", data[e]
            elif permute and part in ("attn_q", "attn_k") and kind == "weight":
                heads = cfg.num_attention_heads if part == "attn_q" else cfg.num_key_value_heads
                yield f"{prefix}{names[part]}.{kind}", unpermute_rows(data, heads)
            elif part == "ffn_gate_inp_shexp":  # [hidden] or [1, hidden] in llama.cpp's files
                yield f"{prefix}{names[part]}.{kind}", data.reshape(1, -1)
            elif phi3 and part == "ffn_up":  # gate and up fused
                yield f"{prefix}mlp.gate_up_proj.{kind}", data
            else:
                yield f"{prefix}{names[part]}.{kind}", data
        else:
            raise KeyError(f"unexpected GGUF tensor {name!r}")
