"""Building blocks shared by the non-Llama architectures (registry.py): a Llama-shaped decoder
whose parts each architecture picks (`DecoderForCausalLM.make_*`), a decoder layer assembled from
given modules, and attention with per-head q/k RMSNorm (Qwen3, Gemma 3).

Forward, logits, FP8 and weight loading are `LlamaForCausalLM`'s; architectures add names of
their own through `checkpoint_target` / `expected_weight_count` (see weights.py).
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    RMSNorm,
    make_embedding,
    make_lm_head,
)
from radixlm.runtime.models.rotary import RotaryEmbedding


class QKNormAttention(LlamaAttention):
    """Llama attention with an RMSNorm over each head's q and k before the rotary embedding;
    `rotary` (if given) replaces the model's rotary embedding for this layer."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        norm: type[RMSNorm] = RMSNorm,
        fused: bool = False,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__(config, layer_id)
        self.q_norm = norm(config.head_dim, config.rms_norm_eps, fused)
        self.k_norm = norm(config.head_dim, config.rms_norm_eps, fused)
        self.rotary = rotary

    def forward(
        self,
        hidden: torch.Tensor,
        batch: ForwardBatch,
        rotary: RotaryEmbedding,
        attn: AttentionBackend,
        rows_only: bool = False,
    ) -> torch.Tensor:
        t, d = hidden.shape[0], self.head_dim
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, d)).view(t, self.num_heads, d)
        k = self.k_norm(k.reshape(-1, d)).view(t, self.num_kv_heads, d)
        o = attn.forward(
            q,
            k,
            v.reshape(t, self.num_kv_heads, d),
            self.layer_id,
            batch,
            self.rotary if self.rotary is not None else rotary,
            rows_only,
        )
        if o.shape[0] == 0:
            return hidden[:0]
        return self.o_proj(o.reshape(-1, self.q_size))


class DecoderLayer(LlamaDecoderLayer):
    """Pre-norm decoder layer (Llama's forward) over the given attention and MLP modules."""

    def __init__(self, config: ModelConfig, self_attn: nn.Module, mlp: nn.Module, fused: bool):
        nn.Module.__init__(self)
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, fused)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, fused)


class DecoderForCausalLM(LlamaForCausalLM):
    """`LlamaForCausalLM` whose embedding, layers, final norm and rotary embedding come from the
    `make_*` methods of a subclass."""

    def __init__(
        self, config: ModelConfig, max_positions: int, device: torch.device, fused_ops: bool = False
    ) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.rotary = self.make_rotary(config, max_positions, device, fused_ops)
        self.embed_tokens = self.make_embedding(config)
        self.layers = nn.ModuleList(
            [
                self.make_layer(config, i, fused_ops, max_positions, device)
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = self.make_norm(config, fused_ops)
        self.lm_head = make_lm_head(config)
        self.kv_scales: dict[int, list[float]] = {}

    def make_rotary(
        self, config: ModelConfig, max_positions: int, device: torch.device, fused: bool
    ) -> RotaryEmbedding:
        return RotaryEmbedding(config, max_positions, device, fused)

    def make_embedding(self, config: ModelConfig) -> nn.Module:
        return make_embedding(config)

    def make_norm(self, config: ModelConfig, fused: bool) -> nn.Module:
        return RMSNorm(config.hidden_size, config.rms_norm_eps, fused)

    def make_layer(
        self,
        config: ModelConfig,
        layer_id: int,
        fused: bool,
        max_positions: int,
        device: torch.device,
    ) -> nn.Module:
        mlp = LlamaMLP(config, fused)
        return DecoderLayer(config, LlamaAttention(config, layer_id), mlp, fused)

    # ---- weights -------------------------------------------------------------------------------
    def checkpoint_target(self, key: str) -> tuple[str, tuple[int, int] | None] | None:
        """Where a checkpoint tensor (`model.` dropped) goes when Llama's names do not say."""
        return None

    def expected_weight_count(self) -> int:
        """Distinct (target, row range) pieces a complete checkpoint fills."""
        cfg = self.config
        per_layer = 3 + (3 if cfg.attention_bias else 0) + 1 + 2  # q/k/v(+bias), o, norms
        total = sum(per_layer + self.mlp_weight_count(i) for i in range(cfg.num_hidden_layers))
        total += sum(self.extra_layer_weight_count() for _ in range(cfg.num_hidden_layers))
        return total + 2 + (0 if cfg.tie_word_embeddings else 1)

    def mlp_weight_count(self, layer: int) -> int:
        return 3  # gate, up, down

    def extra_layer_weight_count(self) -> int:
        return 0
