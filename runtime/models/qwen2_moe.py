"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2 attention (qkv bias, `qkv_bias`) with a
mixture of experts whose output is added to a *shared expert*'s, the shared expert scaled per token
by a sigmoid gate:

    mlp(x) = sum_k w_k * expert_{e_k}(x) + sigmoid(x . g) * shared_expert(x)

The routed part is moe.py's `SparseMoE` (softmax top-k, renormalised only with `norm_topk_prob`,
which Qwen2-MoE checkpoints leave off); the shared expert is a gated MLP of
`shared_expert_intermediate_size`. Layers in `mlp_only_layers` (or off the `decoder_sparse_step`
grid) are dense MLPs of `intermediate_size`.

Checkpoint names (`model.layers.N.mlp.`): `gate` (router), `experts.E.{gate,up,down}_proj`,
`shared_expert.{gate,up,down}_proj` (gate and up fill `shared_expert.gate_up_proj`'s rows) and
`shared_expert_gate` (`[1, hidden]`).
"""

from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.distributed.comm import all_reduce
from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM, DecoderLayer
from radixlm.runtime.models.llama import LlamaAttention, LlamaMLP
from radixlm.runtime.models.moe import SparseMoE, is_sparse, moe_checkpoint_target

_SHARED = re.compile(
    r"^(?P<layer>layers\.\d+)\.mlp\.shared_expert\.(?P<proj>gate_proj|up_proj)\.weight$"
)


class GateVector(nn.Module):
    """`x @ weight^T` with a `[1, hidden]` weight: the shared expert's gate logit per token.
    # NOTE: deliberately not a `Linear`: a one-row output is no candidate for the decode GEMV
    # selection (gemm_select.py) nor for the CPU linear kernels."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, hidden), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class SharedExpertMoE(SparseMoE):
    """`SparseMoE` plus the sigmoid-gated shared expert (see the module docstring)."""

    def __init__(self, config: ModelConfig, fused: bool) -> None:
        super().__init__(config)
        shared = dataclasses.replace(
            config, intermediate_size=config.shared_expert_intermediate_size
        )
        # NOTE: TP > 1: the shared expert's partial sum joins the routed one, one all-reduce
        self.shared_expert = LlamaMLP(shared, fused, reduce=False)
        self.shared_expert_gate = GateVector(config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed = self.routed(x)
        shared = self.shared_expert(x)
        out = routed + torch.sigmoid(self.shared_expert_gate(x)) * shared
        return all_reduce(out) if self.tp else out


class Qwen2MoeForCausalLM(DecoderForCausalLM):
    def make_layer(
        self,
        config: ModelConfig,
        layer_id: int,
        fused: bool,
        max_positions: int,
        device: torch.device,
    ) -> nn.Module:
        sparse = is_sparse(config, layer_id)
        mlp = SharedExpertMoE(config, fused) if sparse else LlamaMLP(config, fused)
        return DecoderLayer(config, LlamaAttention(config, layer_id), mlp, fused)

    def checkpoint_target(self, key: str) -> tuple[str, tuple[int, int] | None] | None:
        m = _SHARED.match(key)
        if m is not None:
            size = self.config.shared_expert_intermediate_size
            part = 0 if m["proj"] == "gate_proj" else 1
            return f"{m['layer']}.mlp.shared_expert.gate_up_proj.weight", (part * size, size)
        return moe_checkpoint_target(key, self.config)

    def mlp_weight_count(self, layer: int) -> int:
        if is_sparse(self.config, layer):
            # router, gate/up/down per expert, the shared expert's gate, up, down and its gate
            return 1 + 3 * self.config.num_experts + 4
        return 3
