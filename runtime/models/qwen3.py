"""Qwen3 and Qwen3-MoE: Llama layers with an RMSNorm of each head's q and k before the rotary
embedding and no qkv bias; Qwen3-MoE replaces the MLP of its sparse layers (`moe_layers`) with a
top-k mixture of experts (moe.py). Windowed layers (`use_sliding_window`) come from the config."""

from __future__ import annotations

import torch
from torch import nn

from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM, DecoderLayer, QKNormAttention
from radixlm.runtime.models.llama import LlamaMLP
from radixlm.runtime.models.moe import SparseMoE, is_sparse, moe_checkpoint_target


class Qwen3ForCausalLM(DecoderForCausalLM):
    def make_layer(
        self,
        config: ModelConfig,
        layer_id: int,
        fused: bool,
        max_positions: int,
        device: torch.device,
    ) -> nn.Module:
        attn = QKNormAttention(config, layer_id, fused=fused)
        mlp = SparseMoE(config) if is_sparse(config, layer_id) else LlamaMLP(config, fused)
        return DecoderLayer(config, attn, mlp, fused)

    def checkpoint_target(self, key: str) -> tuple[str, tuple[int, int] | None] | None:
        return moe_checkpoint_target(key, self.config)

    def mlp_weight_count(self, layer: int) -> int:
        if is_sparse(self.config, layer):
            return 1 + 3 * self.config.num_experts  # router + gate/up/down per expert
        return 3

    def extra_layer_weight_count(self) -> int:
        return 2  # q_norm, k_norm
