"""Mixture-of-experts MLP (Qwen3-MoE, Mixtral): a softmax router picks the top-k experts of each
token, each expert is a gated MLP, their outputs are summed with the routing weights.

Tensor parallelism: every rank holds every expert, each cut along its intermediate size (the
local config's `moe_intermediate_size`; gate/up rows and down columns, sharding.py), and the
router whole; the block's output is all-reduced once.

Storage: all experts' gate/up rows stacked in one matrix `w13` `[E * 2I, H]` (expert e's gate at
rows `e*2I`, its up at `e*2I + I`) and their down projections in `w2` `[E * H, I]`, so the loader
fills row ranges (weights.py) and the kernels see `[E, 2I, H]` / `[E, H, I]` views.
`fused_moe_torch` is the reference (CPU path); `kernels.fused_moe` runs it as grouped GEMMs on GPU.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.distributed.comm import all_reduce
from radixlm.runtime.distributed.layers import tp_active
from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.llama import Linear

logger = logging.getLogger(__name__)
MOE_BUCKETS = (1, 4, 16, 256, 4096)  # token counts timed at start-up (each config serves <= m)


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights `[T, k]` in `dtype`, expert ids `[T, k]` int64): softmax in fp32, top-k, and
    with `renormalize` the k weights rescaled to sum to 1."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(dtype), ids


def fused_moe_torch(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Reference: x `[T, H]`, w13 `[E, 2I, H]`, w2 `[E, H, I]` -> `[T, H]` =
    sum_k weight[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with e = ids[t, k]."""
    out = torch.zeros_like(x)
    for e in topk_ids.unique().tolist():
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        gate, up = F.linear(x[tok], w13[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[e])
        out.index_add_(0, tok, y * topk_weights[tok, slot, None])
    return out


class SparseMoE(nn.Module):
    """Router (`gate`, `[E, H]`) plus stacked experts; see the module docstring."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.hidden, self.inter = e, h, i
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.gate = Linear(h, e)
        self.w13 = nn.Parameter(torch.empty(e * 2 * i, h), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(e * h, i), requires_grad=False)
        # (max tokens, Triton launch config) by batch bucket, timed at start-up on GPU
        # (`select_moe_kernel_configs`); None: `kernels.fused_moe.moe_config`'s defaults
        self.kernel_cfgs: list[tuple[int, Any]] | None = None
        self.tp = tp_active()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.routed(x)
        # NOTE: at TP > 1 each rank holds every expert's slice of the intermediate size: its
        # output is a partial sum, all-reduced once here (a no-op at TP=1).
        return all_reduce(out) if self.tp else out

    def routed(self, x: torch.Tensor) -> torch.Tensor:
        """The routed experts' output; this rank's partial sum at TP > 1."""
        weights, ids = route(self.gate(x), self.top_k, self.renormalize, x.dtype)
        w13 = self.w13.view(self.num_experts, 2 * self.inter, self.hidden)
        w2 = self.w2.view(self.num_experts, self.hidden, self.inter)
        if x.is_cuda:
            from radixlm.kernels.fused_moe import fused_moe

            cfg = None
            if self.kernel_cfgs is not None:
                cfg = next((c for m, c in self.kernel_cfgs if x.shape[0] <= m), None)
            return fused_moe(x, w13, w2, weights, ids, cfg)
        return fused_moe_torch(x, w13, w2, weights, ids)


# checkpoint names of one expert's projections -> (stacked matrix, part)
_EXPERT = re.compile(
    r"^(?P<layer>layers\.\d+)\.(?:mlp|block_sparse_moe)\.experts\.(?P<e>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$"
)
_ROUTER = re.compile(r"^(?P<layer>layers\.\d+)\.block_sparse_moe\.gate\.weight$")
_PART = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1, "down_proj": 2, "w2": 2}


def is_sparse(config: ModelConfig, layer: int) -> bool:
    """Whether decoder layer `layer` has a mixture-of-experts MLP (else a dense one)."""
    return config.num_experts > 0 and config.moe_layers[layer]


def moe_checkpoint_target(
    key: str, config: ModelConfig
) -> tuple[str, tuple[int, int] | None] | None:
    """Stacked-expert target of a per-expert checkpoint tensor (Qwen3-MoE `mlp.experts.E.
    {gate,up,down}_proj`, Mixtral `block_sparse_moe.experts.E.w{1,3,2}`; Mixtral's router
    `block_sparse_moe.gate`); None for any other name."""
    m = _EXPERT.match(key)
    if m is not None:
        e, part = int(m["e"]), _PART[m["proj"]]
        i, h = config.moe_intermediate_size, config.hidden_size
        if part == 2:
            return f"{m['layer']}.mlp.w2", (e * h, h)
        return f"{m['layer']}.mlp.w13", (e * 2 * i + part * i, i)
    m = _ROUTER.match(key)
    if m is not None:
        return f"{m['layer']}.mlp.gate.weight", None
    return None


def select_moe_kernel_configs(model: nn.Module, dtype: torch.dtype) -> int:
    """GPU start-up: time the fused-MoE kernel's candidate configs once per distinct expert
    shape and token bucket (`MOE_BUCKETS`), and give every SparseMoE layer its picks; returns the
    number of MoE layers configured."""
    from radixlm.kernels.fused_moe import select_moe_config

    picked: dict[tuple[int, int, int, int], list[tuple[int, Any]]] = {}
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    for layer in layers:
        shape = (layer.hidden, layer.inter, layer.num_experts, layer.top_k)
        if shape not in picked:
            picked[shape] = [
                (m, select_moe_config(*shape, tokens=m, dtype=dtype)) for m in MOE_BUCKETS
            ]
            logger.info("fused MoE %s: configs by tokens %s", shape, picked[shape])
        layer.kernel_cfgs = picked[shape] + [(1 << 62, picked[shape][-1][1])]
    return len(layers)
