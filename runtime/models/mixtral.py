"""Mixtral: Llama attention (sliding window where the config sets one) with a top-k mixture of
experts in every layer (moe.py; Mixtral always renormalises the top-k weights)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM, DecoderLayer
from radixlm.runtime.models.llama import LlamaAttention
from radixlm.runtime.models.moe import SparseMoE, moe_checkpoint_target


class MixtralForCausalLM(DecoderForCausalLM):
    def make_layer(
        self,
        config: ModelConfig,
        layer_id: int,
        fused: bool,
        max_positions: int,
        device: torch.device,
    ) -> nn.Module:
        moe_cfg = dataclasses.replace(config, norm_topk_prob=True)
        return DecoderLayer(config, LlamaAttention(config, layer_id), SparseMoE(moe_cfg), fused)

    def checkpoint_target(self, key: str) -> tuple[str, tuple[int, int] | None] | None:
        return moe_checkpoint_target(key, self.config)

    def mlp_weight_count(self, layer: int) -> int:
        return 1 + 3 * self.config.num_experts
