"""Gemma 2 and Gemma 3 (text): Llama-shaped decoders with

- embeddings multiplied by sqrt(hidden) (rounded to the model dtype, as transformers does);
- four `(1 + w)` RMSNorms per layer (fp32 math): before and after attention and before and after
  the MLP; the residual adds the post-norm outputs;
- a GeGLU MLP (tanh-approximated GELU of the gate times the up projection);
- per-layer attention (windows, the soft cap of the scores, `query_pre_attn_scalar`) applied by
  the attention backend from the config (`attention.base.layer_attention`);
- Gemma 2: final logits soft-capped; Gemma 3: a `(1 + w)` RMSNorm of each head's q and k, and
  windowed (local) layers rotated with their own base (`rope_local_theta`, no scaling).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.distributed.layers import VocabParallelEmbedding, row_linear, tp_active
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM, QKNormAttention
from radixlm.runtime.models.llama import Embedding, Linear, LlamaAttention, RMSNorm
from radixlm.runtime.models.rotary import RotaryEmbedding


class GemmaRMSNorm(RMSNorm):
    """`x / rms(x) * (1 + w)` in fp32, cast back to x's dtype; optionally adds the residual first
    (returns `(out, sum)` then, like `RMSNorm`). `fused`: the Triton kernel (`unit_offset`)."""

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.fused:
            from radixlm.kernels import rmsnorm

            if residual is None:
                return rmsnorm.rmsnorm(x, self.weight, self.eps, unit_offset=True)
            return rmsnorm.fused_add_rmsnorm(x, residual, self.weight, self.eps, unit_offset=True)
        if residual is not None:
            x = x + residual
            residual = x
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = (h * (1.0 + self.weight.float())).to(x.dtype)
        return out if residual is None else (out, residual)


class GemmaEmbedding(Embedding):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = F.embedding(ids, self.weight)
        return h * torch.tensor(self.weight.shape[1] ** 0.5, dtype=h.dtype)


class GemmaMLP(nn.Module):
    """`down(gelu_tanh(gate) * up)`: the activation runs in gate_up's GEMV epilogue or its fused
    kernel on GPU (`Linear`'s gated output)."""

    def __init__(self, config: ModelConfig, fused: bool = False) -> None:
        super().__init__()
        if config.hidden_act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            from radixlm.runtime.models.registry import UnsupportedModelError

            raise UnsupportedModelError(f"Gemma activation {config.hidden_act!r}")
        inter = config.intermediate_size
        self.gate_up_proj = Linear(
            config.hidden_size, inter, gated_output=True, fused=fused, activation="gelu_tanh"
        )  # [gate; up] rows
        self.down_proj = row_linear(inter, config.hidden_size)  # all-reduced at TP > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x))


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, self_attn: nn.Module, fused: bool = False) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = self_attn
        self.mlp = GemmaMLP(config, fused)
        self.input_layernorm = GemmaRMSNorm(h, eps, fused)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps, fused)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps, fused)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps, fused)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
        rotary: RotaryEmbedding,
        attn: AttentionBackend,
        rows_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's post-MLP-norm output, the residual stream before it): the next layer's
        (or the final) norm adds the two, as in `LlamaDecoderLayer`."""
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
        hidden = self.post_attention_layernorm(hidden)
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class GemmaForCausalLM(DecoderForCausalLM):
    """Gemma 2 (`Gemma2ForCausalLM`) and Gemma 3 text (`Gemma3ForCausalLM`)."""

    def make_embedding(self, config: ModelConfig) -> nn.Module:
        if tp_active():  # vocabulary rows split over the ranks, scaled after the all-reduce
            return VocabParallelEmbedding(config.vocab_size, config.hidden_size, scale=True)
        return GemmaEmbedding(config.vocab_size, config.hidden_size)

    def make_norm(self, config: ModelConfig, fused: bool) -> nn.Module:
        return GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, fused)

    def make_layer(
        self,
        config: ModelConfig,
        layer_id: int,
        fused: bool,
        max_positions: int,
        device: torch.device,
    ) -> nn.Module:
        if config.model_type == "gemma2":
            return GemmaDecoderLayer(config, LlamaAttention(config, layer_id), fused)
        rotary = None
        if config.layer_window(layer_id) is not None and config.rope_local_theta is not None:
            local = dataclasses.replace(
                config, rope_theta=config.rope_local_theta, rope_scaling=None
            )
            if self._local_rotary is None:
                self._local_rotary = RotaryEmbedding(local, max_positions, device, fused)
            rotary = self._local_rotary
        attn = QKNormAttention(config, layer_id, GemmaRMSNorm, fused, rotary=rotary)
        return GemmaDecoderLayer(config, attn, fused)

    def make_rotary(
        self, config: ModelConfig, max_positions: int, device: torch.device, fused: bool
    ) -> RotaryEmbedding:
        self._local_rotary: RotaryEmbedding | None = None  # Gemma 3's local layers (shared)
        return super().make_rotary(config, max_positions, device, fused)

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_text_decoder(weights))

    def extra_layer_weight_count(self) -> int:
        # pre/post feed-forward norms (+ q/k norms in Gemma 3)
        return 2 if self.config.model_type == "gemma2" else 4


_VISION = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.")
_TEXT_PREFIXES = (
    ("language_model.model.", "model."),  # transformers 4 image-text checkpoints
    ("model.language_model.", "model."),  # transformers 5
    ("language_model.lm_head.", "lm_head."),
)


def _text_decoder(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """A Gemma 3 image-text checkpoint's text decoder under causal-LM names (the vision tower
    and projector dropped); a text-only checkpoint passes unchanged."""
    for name, tensor in weights:
        if name.startswith(_VISION) or name.startswith("model.multi_modal_projector."):
            continue
        for old, new in _TEXT_PREFIXES:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        yield name, tensor
