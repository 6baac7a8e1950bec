"""EAGLE-1/2 draft heads (`LlamaForCausalLMEagle`, the SafeAILab/EAGLE and SGLang checkpoint
format): Llama decoder layers over `fc(concat(embedding, target feature))`.

Checkpoint (safetensors + a Llama `config.json`, usually one layer): `fc.weight` [H, 2H] (and
`fc.bias` [H] where trained with one), `layers.N.*` with Llama's names except that layer 0 has no
`input_layernorm` (its input is `fc`'s output as is); no final norm. `embed_tokens.weight` and
`lm_head.weight`, where present, are ignored: the head runs on the target's token embedding and
LM head (`bind_target`). Names may carry a `model.` prefix.

Forward (row r at position p, a token x and the feature f of the row before it): for a row of a
target sequence, x = token p + 1 and f = the target's final (normed) hidden state at p; for a draft
step, f is the head's own output at the parent row. Output `o = h + residual` after the last layer
(no norm): the next-token logits are the target's LM head on `o`, and `o` is the next step's f.

Data flow: `batch.spec_features` [T, H] holds each row's f (None: zeros, for warm-up batches);
`forward` returns `o` of the rows `batch.logits_indices`; `split_output` gives (logit input, next
feature) of those rows, `compute_logits` the target-vocabulary logits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.linear import Linear
from radixlm.runtime.models.llama import LlamaDecoderLayer
from radixlm.runtime.models.rotary import RotaryEmbedding


class TargetParts:
    """The target model's token embedding and logits function, shared (not owned) by a head.
    NOTE: a plain object, not an nn.Module attribute: the head's `modules()` (weight loading, CPU
    kernel setup, FP8) must not walk into the target's weights."""

    def __init__(self, embed: nn.Module, logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.embed = embed
        self.logits = logits


class DraftHead(nn.Module, ABC):
    """What the draft worker needs of an EAGLE-style head (ModelRunner's model contract, plus):
    `feature_dim` (the width of a target feature row), `capture_layers` (the target layers whose
    input hidden states make a feature; `num_hidden_layers` of the target means its final normed
    output), `bind_target`, `split_output`, `to_target_ids`."""

    feature_dim: int  # the width of a target feature row (the catch-up rows)
    graph_feature_dim: int  # the width of a draft step's feature row (its own hidden size)
    target: TargetParts | None = None

    def bind_target(self, embed: nn.Module, logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.target = TargetParts(embed, logits)

    @abstractmethod
    def capture_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose inputs make a feature row (see the class docstring)."""

    @abstractmethod
    def split_output(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s rows -> (the LM head's input, the next draft step's feature)."""

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.target is None:
            raise RuntimeError("a draft head runs only after bind_target(...)")
        return self.target.embed(ids)

    def features(self, batch: ForwardBatch, width: int, dtype: torch.dtype) -> torch.Tensor:
        f = batch.spec_features
        if f is None:  # warm-up / capture batches
            return torch.zeros(batch.num_tokens, width, dtype=dtype, device=batch.input_ids.device)
        return f.to(dtype)

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids


def strip_names(
    weights: Iterable[tuple[str, torch.Tensor]], ignored: tuple[str, ...], seen: set[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint names without `model.`; names starting with `ignored` dropped; every name kept
    is added to `seen`."""
    for name, tensor in weights:
        key = name.removeprefix("model.")
        if key.startswith(ignored):
            continue
        seen.add(key)
        yield key, tensor


class EagleHead(DraftHead):
    def __init__(
        self, config: ModelConfig, max_positions: int, device: torch.device, fused_ops: bool = False
    ) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.feature_dim = self.graph_feature_dim = h
        # NOTE: the bias starts at zero, so a checkpoint trained without one loads as is.
        self.fc = Linear(2 * h, h, bias=True)
        nn.init.zeros_(self.fc.bias)
        self.layers = nn.ModuleList(
            [LlamaDecoderLayer(config, i, fused_ops) for i in range(config.num_hidden_layers)]
        )
        self.layers[0].input_layernorm = nn.Identity()
        self.rotary = RotaryEmbedding(config, max_positions, device, fused_ops)
        self.kv_scales: dict[int, list[float]] = {}
        self._names: set[str] = set()

    def capture_layers(self, target_layers: int) -> tuple[int, ...]:
        return (target_layers,)  # the target's final normed hidden state

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        emb = self.embed(batch.input_ids)
        feats = self.features(batch, self.feature_dim, emb.dtype)
        hidden = self.fc(torch.cat([emb, feats], dim=-1))
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, batch, self.rotary, attn)
        out = hidden + residual
        if batch.logits_indices is not None:
            out = out.index_select(0, batch.logits_indices)
        return out

    def split_output(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return out, out

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.target is None:
            raise RuntimeError("a draft head runs only after bind_target(...)")
        return self.target.logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        from radixlm.runtime.models.weights import load_hf_weights

        self._names = set()
        load_hf_weights(self, strip_names(weights, ("embed_tokens.", "lm_head."), self._names))

    def expected_weight_count(self) -> int:
        per_layer = 3 + 1 + 2 + 1 + 2  # q/k/v, o, gate/up, down, the two norms
        layers = self.config.num_hidden_layers * per_layer - 1  # layer 0: no input norm
        return layers + 1 + ("fc.bias" in self._names)
