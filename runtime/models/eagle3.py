"""EAGLE-3 draft heads (`LlamaForCausalLMEagle3`, the SGLang / SpecForge checkpoint format): one
decoder layer whose attention reads `concat(norm(embedding), norm(feature))`, over a draft
vocabulary of its own.

Checkpoint (safetensors + a Llama `config.json` with `draft_vocab_size`, optionally
`target_hidden_size` and `eagle_config.eagle_aux_hidden_state_layer_ids`):
    `fc.weight` [H, 3 * Ht]: the three captured target hidden states -> H;
    `midlayer.self_attn.{q,k,v}_proj.weight` [*, 2H], `o_proj`, `midlayer.mlp.*`;
    `midlayer.input_layernorm` (of the embedding), `midlayer.hidden_norm` (of the feature),
    `midlayer.post_attention_layernorm`; `norm.weight`;
    `lm_head.weight` [Vd, H] over the draft vocabulary (absent: the target's LM head, Vd = V);
    `d2t` [Vd] int64: draft id d is target id `d + d2t[d]`; `t2d` [V] bool (unused here);
    `embed_tokens.weight` is ignored: the head embeds with the target's embedding (`bind_target`).

Forward of a row (token x, feature f): `g = fc(f)` when f is a target feature (3 * Ht wide; a
draft step's own feature is already H wide), `a = attn(concat(input_layernorm(emb(x)),
hidden_norm(g)))`, `h, r = post_attention_layernorm(a, g)` (residual add), `o = mlp(h)`; then
`norm(o + r)` feeds the LM head and `o + r` (pre-norm) is the next step's feature. `forward`
returns both, concatenated [rows, 2H]; `split_output` separates them.

Target features: the inputs of target layers (2, L // 2, L - 3) (hidden + residual), or of
layers `id + 1` for the config's `eagle_aux_hidden_state_layer_ids`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.models.config import ModelConfig, UnsupportedModelError
from radixlm.runtime.models.eagle import DraftHead, strip_names
from radixlm.runtime.models.linear import Linear
from radixlm.runtime.models.llama import LlamaAttention, LlamaMLP, RMSNorm
from radixlm.runtime.models.rotary import RotaryEmbedding


class Eagle3MidLayer(nn.Module):
    def __init__(self, config: ModelConfig, fused: bool) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, 0)
        self.self_attn.qkv_proj = Linear(2 * h, config.q_size + 2 * config.kv_size, bias=False)
        self.mlp = LlamaMLP(config, fused)
        self.input_layernorm = RMSNorm(h, eps, fused)
        self.hidden_norm = RMSNorm(h, eps, fused)
        self.post_attention_layernorm = RMSNorm(h, eps, fused)

    def forward(
        self,
        emb: torch.Tensor,
        hidden: torch.Tensor,
        batch: ForwardBatch,
        rotary: RotaryEmbedding,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)
        a = self.self_attn(x, batch, rotary, attn)
        h, residual = self.post_attention_layernorm(a, hidden)
        return self.mlp(h), residual


class Eagle3Head(DraftHead):
    def __init__(
        self, config: ModelConfig, max_positions: int, device: torch.device, fused_ops: bool = False
    ) -> None:
        super().__init__()
        if config.num_hidden_layers != 1:
            raise UnsupportedModelError(
                f"EAGLE-3 heads with {config.num_hidden_layers} layers are not supported (one)"
            )
        self.config = config
        hf = config.hf_config
        h = config.hidden_size
        target_h = int(hf.get("target_hidden_size") or h)
        self.feature_dim = 3 * target_h
        self.graph_feature_dim = h
        self.fc = Linear(3 * target_h, h, bias=bool(hf.get("bias", False)))
        self.midlayer = Eagle3MidLayer(config, fused_ops)
        self.norm = RMSNorm(h, config.rms_norm_eps, fused_ops)
        draft_vocab = hf.get("draft_vocab_size")
        self.draft_vocab = int(draft_vocab or config.vocab_size)
        # None: the target's LM head (a checkpoint without `lm_head.weight` / draft vocabulary)
        self.lm_head = Linear(h, self.draft_vocab, bias=False) if draft_vocab else None
        self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.int64))
        self.rotary = RotaryEmbedding(config, max_positions, device, fused_ops)
        self.kv_scales: dict[int, list[float]] = {}
        self._names: set[str] = set()

    def capture_layers(self, target_layers: int) -> tuple[int, ...]:
        eagle = self.config.hf_config.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        layers = [i + 1 for i in ids] if ids else [2, target_layers // 2, target_layers - 3]
        if len(layers) != 3 or not all(0 <= i < target_layers for i in layers):
            raise UnsupportedModelError(
                f"EAGLE-3 captures three target layers in 0..{target_layers - 1}, got {layers}"
            )
        return tuple(layers)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        emb = self.embed(batch.input_ids)
        h = self.config.hidden_size
        feats = batch.spec_features
        width = self.feature_dim if feats is None else feats.shape[-1]
        feats = self.features(batch, width, emb.dtype)
        if width != h:
            feats = self.fc(feats)
        out, residual = self.midlayer(emb, feats, batch, self.rotary, attn)
        pre = out + residual
        if batch.logits_indices is not None:
            pre = pre.index_select(0, batch.logits_indices)
        return torch.cat([self.norm(pre), pre], dim=-1)

    def split_output(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.config.hidden_size
        return out[:, :h], out[:, h:]

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary ([rows, Vd]; `to_target_ids` maps their ids)."""
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        if self.target is None:
            raise RuntimeError("a draft head runs only after bind_target(...)")
        return self.target.logits(hidden)

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.d2t[ids]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        from radixlm.runtime.models.weights import load_hf_weights

        self._names = set()
        ignored = ("embed_tokens.", "t2d") + (("lm_head.",) if self.lm_head is None else ())
        rest = []
        for key, tensor in strip_names(weights, ignored, self._names):
            if key == "d2t":
                if tensor.shape != self.d2t.shape:
                    raise ValueError(f"d2t: shape {tuple(tensor.shape)} != {tuple(self.d2t.shape)}")
                self.d2t.copy_(tensor.to(torch.int64))
            else:
                rest.append((key, tensor))
        if self.lm_head is not None and "d2t" not in self._names:
            raise ValueError("an EAGLE-3 checkpoint with a draft vocabulary needs its d2t tensor")
        load_hf_weights(self, rest)
        target_ids = self.to_target_ids(torch.arange(self.draft_vocab, device=self.d2t.device))
        if not bool(((target_ids >= 0) & (target_ids < self.config.vocab_size)).all()):
            raise ValueError("d2t maps a draft token outside the target vocabulary")

    def expected_weight_count(self) -> int:
        layer = 3 + 1 + 2 + 1 + 3  # q/k/v, o, gate/up, down, the three norms
        return layer + 1 + int(self.fc.bias is not None) + 1 + int(self.lm_head is not None)
