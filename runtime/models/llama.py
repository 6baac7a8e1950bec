"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM) over a flattened token batch.

Shapes: tokens of all requests are one dimension T; attention goes through the batch's
`AttentionBackend`, which reads/writes the paged KV pool. q/k/v and gate/up projections are merged
into one matmul each; weights load from Hugging Face names (see `load_weights`, weights.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.distributed.layers import (
    ParallelLMHead,
    VocabParallelEmbedding,
    row_linear,
    tp_active,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.linear import Linear
from radixlm.runtime.models.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from radixlm.runtime.models.cpu_decode import CpuDecode


class RMSNorm(nn.Module):
    """HF Llama's RMSNorm (fp32 statistics, weight applied in the input dtype), optionally fused
    with the residual add that precedes it. `fused` runs the Triton kernel (GPU); on CPU, fp32
    inputs run the C++ kernel (`kernels/cpu/norm.py`) where it is available."""

    def __init__(self, size: int, eps: float, fused: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps
        self.fused = fused

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.fused:
            from radixlm.kernels import rmsnorm

            if residual is None:
                return rmsnorm.rmsnorm(x, self.weight, self.eps)
            return rmsnorm.fused_add_rmsnorm(x, residual, self.weight, self.eps)
        if x.device.type == "cpu" and x.dtype == torch.float32:
            from radixlm.kernels.cpu.norm import rmsnorm as cpu_rmsnorm

            out = cpu_rmsnorm(x, residual, self.weight, self.eps)  # one C++ call (None: torch)
            if out is not None:
                return out
        if residual is not None:
            x = x + residual
            residual = x
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(x.dtype)
        return out if residual is None else (out, residual)


class Embedding(nn.Module):
    def __init__(self, num: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


def make_embedding(config: ModelConfig) -> nn.Module:
    """The token embedding: vocabulary rows split over the ranks at TP > 1."""
    if tp_active():
        return VocabParallelEmbedding(config.vocab_size, config.hidden_size)
    return Embedding(config.vocab_size, config.hidden_size)


def make_lm_head(config: ModelConfig) -> Linear | None:
    """The untied LM head (None when tied): vocabulary rows split at TP > 1, logits gathered."""
    if config.tie_word_embeddings:
        return None
    if tp_active():
        return ParallelLMHead(config.hidden_size, config.vocab_size)
    return Linear(config.hidden_size, config.vocab_size, bias=False)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = row_linear(self.q_size, config.hidden_size)  # all-reduced at TP > 1

    def forward(
        self,
        hidden: torch.Tensor,
        batch: ForwardBatch,
        rotary: RotaryEmbedding,
        attn: AttentionBackend,
        rows_only: bool = False,
    ) -> torch.Tensor:
        """Output of every row, or with `rows_only` of `batch.logits_indices`'s rows only (every
        row's K/V is stored either way)."""
        t = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        o = attn.forward(
            q.view(t, self.num_heads, self.head_dim),
            k.view(t, self.num_kv_heads, self.head_dim),
            v.view(t, self.num_kv_heads, self.head_dim),
            self.layer_id,
            batch,
            rotary,
            rows_only,
        )
        if o.shape[0] == 0:  # no logits rows
            return hidden[:0]
        return self.o_proj(o.reshape(-1, self.q_size))


class LlamaMLP(nn.Module):
    """`reduce=False` (TP > 1): the output is this rank's partial sum, left to the caller to
    all-reduce (a shared expert added to routed experts first, qwen2_moe.py)."""

    def __init__(self, config: ModelConfig, fused: bool, reduce: bool = True) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, inter, gated_output=True, fused=fused)
        self.down_proj = row_linear(inter, config.hidden_size, reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, fused: bool) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id)
        self.mlp = LlamaMLP(config, fused)
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, fused)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, fused)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
        rotary: RotaryEmbedding,
        attn: AttentionBackend,
        rows_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`rows_only`: the rest of the layer after the K/V store runs for the rows
        `batch.logits_indices` only, and so do the outputs."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, batch, rotary, attn, rows_only)
        if rows_only:
            if hidden.shape[0] == 0:
                return hidden, hidden
            residual = residual.index_select(0, batch.logits_indices)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    # NOTE: set on CPU after loading (runtime/models/cpu_decode.py): runs a decode batch's whole
    # forward (or a CPU verify step's tree nodes, `CpuDecode.verify`) in one C++ call, or returns
    # None to leave it to the layers below.
    cpu_decode: CpuDecode | None = None
    # NOTE: opt-in hidden-state capture for draft heads (EAGLE / EAGLE-3; set through
    # `ModelRunner.set_hidden_capture`): the layer indices whose INPUT (hidden + residual) is kept,
    # `num_hidden_layers` meaning the final normed output. With it on, every forward stores
    # `captured` [T, len(capture) * H] for all of the batch's rows (in capture order), runs the
    # layer path (no one-call CPU decode, no last-layer row cut); off (None) it costs one check.
    capture: tuple[int, ...] | None = None
    captured: torch.Tensor | None = None

    def __init__(
        self, config: ModelConfig, max_positions: int, device: torch.device, fused_ops: bool = False
    ) -> None:
        """`fused_ops`: RMSNorm, rotary embeddings and the MLP activation run as Triton kernels (GPU
        only)."""
        super().__init__()
        self.config = config
        self.embed_tokens = make_embedding(config)
        self.layers = nn.ModuleList(
            [LlamaDecoderLayer(config, i, fused_ops) for i in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, fused_ops)
        self.lm_head = make_lm_head(config)
        self.rotary = RotaryEmbedding(config, max_positions, device, fused_ops)
        self.kv_scales: dict[int, list[float]] = {}  # layer -> [k_scale, v_scale] (checkpoint)

    def quantize_fp8(self) -> int:
        """Online FP8 weights for every decoder Linear not already FP8 (the LM head keeps the
        model dtype); returns how many layers were quantised."""
        from radixlm.runtime.models.fp8 import quantize_linears_fp8

        skip = () if self.lm_head is None else (self.lm_head,)
        return quantize_linears_fp8(self, Linear, skip)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Final hidden states of the rows `batch.logits_indices` (every row when None).

        # NOTE: a prefill needs the last layer's output only where logits are computed (usually
        # each prompt's last token); the other rows need just their K/V in the pool. So when a
        # batch has at most one logits row per request (`last_layer_rows_only`), the last
        # layer's attention, MLP and the final norm run for those rows only: ~3 % of a 32-layer
        # prefill's FLOPs saved, the same math.
        """
        capture = self.capture
        if capture is not None:
            return self._forward_capturing(batch, attn, capture)
        if batch.is_decode and self.cpu_decode is not None:
            out = self.cpu_decode(batch, attn)  # the whole step in one C++ call (CPU)
            if out is not None:
                return out
        if batch.tree_mask is not None and self.cpu_decode is not None:
            out = self.cpu_decode.verify(batch, attn)  # a verify step's nodes as decode rows
            if out is not None:
                return out
        hidden = self.embed_tokens(batch.input_ids)
        residual = None
        rows_only = batch.last_layer_rows_only
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(
                hidden, residual, batch, self.rotary, attn, rows_only and i == last
            )
        if hidden.shape[0] == 0:
            return hidden
        hidden, _ = self.norm(hidden, residual)
        if batch.logits_indices is not None and not rows_only:
            hidden = hidden.index_select(0, batch.logits_indices)
        return hidden

    def _forward_capturing(
        self, batch: ForwardBatch, attn: AttentionBackend, capture: tuple[int, ...]
    ) -> torch.Tensor:
        """`forward` keeping the hidden states `capture` names (see its NOTE) in `captured`."""
        parts: dict[int, torch.Tensor] = {}
        hidden = self.embed_tokens(batch.input_ids)
        residual = None
        for i, layer in enumerate(self.layers):
            if i in capture:
                parts[i] = hidden.clone() if residual is None else hidden + residual
            hidden, residual = layer(hidden, residual, batch, self.rotary, attn)
        hidden, _ = self.norm(hidden, residual)
        parts[len(self.layers)] = hidden
        self.captured = torch.cat([parts[i] for i in capture], dim=-1)
        if batch.logits_indices is not None:
            hidden = hidden.index_select(0, batch.logits_indices)
        return hidden

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        if isinstance(self.embed_tokens, VocabParallelEmbedding):  # TP > 1: tied, sharded
            return self.embed_tokens.gather_logits(
                F.linear(hidden, self.embed_tokens.weight)
            ).float()
        return F.linear(hidden, self.embed_tokens.weight).float()

    # ---- weights -------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors (`runtime/models/weights.py`), merging q/k/v and
        gate/up into their fused matrices; an FP8 checkpoint's KV-cache scales go to
        `self.kv_scales`."""
        from radixlm.runtime.models.weights import load_hf_weights

        self.kv_scales = load_hf_weights(self, weights)
