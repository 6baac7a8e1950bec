"""Tiny random-weight checkpoints of every registered architecture, built with transformers from
each real model's shape rules (GQA, several layers, windows shorter than the prompts, a few
experts) and saved as HF directories. Shared by the model tests (built once per session)."""

from __future__ import annotations

import os
from typing import Any

_BASE: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
WINDOW = 8  # shorter than the test prompts

TINY: dict[str, dict[str, Any]] = {
    "qwen3": {
        **_BASE,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "max_window_layers": 2,  # layers 0-1 global, 2-3 windowed
        "tie_word_embeddings": True,
    },
    "qwen3_moe": {
        **_BASE,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": False,
        "mlp_only_layers": [1],  # one dense layer among sparse ones
        "decoder_sparse_step": 1,
    },
    "qwen2_moe": {
        **_BASE,
        "model_type": "qwen2_moe",
        "architectures": ["Qwen2MoeForCausalLM"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "norm_topk_prob": False,
        "mlp_only_layers": [3],
        "decoder_sparse_step": 1,
        "qkv_bias": True,
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "max_window_layers": 3,  # transformers' rule: layers 0 and 2 windowed
    },
    "mixtral": {
        **_BASE,
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": WINDOW,
    },
    "gemma2": {
        **_BASE,
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        "head_dim": 32,
        "query_pre_attn_scalar": 24,
        "sliding_window": WINDOW,
        "attn_logit_softcapping": 5.0,  # small caps so that they bite on random weights
        "final_logit_softcapping": 3.0,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma3": {
        **_BASE,
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "num_hidden_layers": 6,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 3,  # 2 local : 1 global (the real one: 5 : 1)
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    },
    "phi3": {
        **_BASE,
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "original_max_position_embeddings": 64,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0 + 0.05 * i for i in range(8)],
            "long_factor": [1.5 + 0.25 * i for i in range(8)],
        },
        "sliding_window": None,
    },
    # Phi-4-mini: partial rotary (its 96 of 128 dims; here 12 of 16), LongRoPE over those dims
    "phi4_mini": {
        **_BASE,
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "partial_rotary_factor": 0.75,
        "original_max_position_embeddings": 64,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(6)],
            "long_factor": [1.5 + 0.25 * i for i in range(6)],
        },
        "sliding_window": None,
        "tie_word_embeddings": True,
    },
}


# Llama-family models whose configs enable a window (logits tests only).
WINDOWED: dict[str, dict[str, Any]] = {
    "mistral_window": {
        **_BASE,
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "sliding_window": WINDOW,
    },
    "qwen2_window": {
        **_BASE,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "max_window_layers": 1,
    },
}


# Llama-family checkpoints that GGUF files carry (tests/models/test_gguf_converter.py): a Llama, one
# tied with Llama 3's rope scaling (Llama 3.1+ / 3.2; short original context so that it bites), a
# Mistral and a Qwen2 (qkv biases, tied).
LLAMA_FAMILY: dict[str, dict[str, Any]] = {
    "llama": {**_BASE, "model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "llama3_rope": {
        **_BASE,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tie_word_embeddings": True,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "mistral": {**_BASE, "model_type": "mistral", "architectures": ["MistralForCausalLM"]},
    "qwen2": {
        **_BASE,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "tie_word_embeddings": True,
    },
}


def save_tiny(name: str, path: str, **overrides: Any) -> Any:
    """Build the tiny `name` model with transformers (seeded), perturb its norms (HF initialises
    them to a constant) and save it to `path`; returns the fp32 transformers model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = {**(TINY.get(name) or WINDOWED.get(name) or LLAMA_FAMILY[name]), **overrides}
    config = AutoConfig.for_model(**cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.add_(torch.randn_like(p) * 0.1)
            elif p.dim() >= 2:
                p.normal_(0.0, 0.08)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return model
