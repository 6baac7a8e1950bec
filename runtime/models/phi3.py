"""Phi-3 / Phi-4: the Llama decoder, with q/k/v and gate/up already fused in the checkpoint
(`qkv_proj`, `gate_up_proj`: loaded as they are) and LongRoPE scaling; Phi-4-mini rotates only the
first `partial_rotary_factor` (0.75) of each head's dims (rotary.py).

LongRoPE: rotary frequencies divided per dimension by `short_factor` for positions below
`original_max_position_embeddings` and by `long_factor` from there on, cos/sin multiplied by
`attention_factor` (default sqrt(1 + ln(factor) / ln(original)), factor = max / original).
# NOTE: transformers switches the whole sequence (cached keys included) to the long factors once
# it grows past the original length; radixlm picks the factor by each token's own position (as
# vLLM does), so a cached key never changes. The two agree while sequences stay below the original
# length.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from radixlm.runtime.models.config import ModelConfig, UnsupportedModelError
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.rotary import RotaryEmbedding


class LongRoPE(RotaryEmbedding):
    def __init__(
        self, config: ModelConfig, max_positions: int, device: torch.device, fused: bool = False
    ) -> None:
        nn.Module.__init__(self)
        self.head_dim = config.head_dim
        self.rotary_dim = config.rotary_dim
        self.fused = fused
        scaling = config.rope_scaling or {}
        hf = config.hf_config
        original = int(
            scaling.get("original_max_position_embeddings")
            or hf.get("original_max_position_embeddings")
            or config.max_position_embeddings
        )
        factor = scaling.get("factor") or config.max_position_embeddings / original
        attn_factor = scaling.get("attention_factor")
        if attn_factor is None:
            attn_factor = (
                1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
            )
        dim = config.rotary_dim  # Phi-4-mini: 96 of 128 (`partial_rotary_factor`)
        for key in ("short_factor", "long_factor"):
            if len(scaling[key]) != dim // 2:
                raise UnsupportedModelError(
                    f"LongRoPE {key} has {len(scaling[key])} entries; rotary_dim {dim} needs "
                    f"{dim // 2}"
                )
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        pos = torch.arange(max_positions, dtype=torch.int64).float()
        tables = []
        for key, rows in (("short_factor", pos[:original]), ("long_factor", pos[original:])):
            ext = torch.tensor(scaling[key], dtype=torch.float32)
            inv_freq = 1.0 / (ext * config.rope_theta**shape)
            tables.append(rows[:, None] * inv_freq[None, :])
        freqs = torch.cat(tables).to(device)
        self.register_buffer("cos", freqs.cos() * attn_factor, persistent=False)
        self.register_buffer("sin", freqs.sin() * attn_factor, persistent=False)
        if fused:
            self.register_buffer(
                "cos_sin", torch.cat([self.cos, self.sin], dim=-1), persistent=False
            )


class Phi3ForCausalLM(DecoderForCausalLM):
    def make_rotary(
        self, config: ModelConfig, max_positions: int, device: torch.device, fused: bool
    ) -> RotaryEmbedding:
        scaling = config.rope_scaling or {}
        if scaling.get("rope_type", scaling.get("type")) == "longrope":
            return LongRoPE(config, max_positions, device, fused)
        return RotaryEmbedding(config, max_positions, device, fused)

    def expected_weight_count(self) -> int:
        cfg = self.config
        per_layer = 6  # qkv_proj, o_proj, gate_up_proj, down_proj, 2 norms
        return cfg.num_hidden_layers * per_layer + 2 + (0 if cfg.tie_word_embeddings else 1)
