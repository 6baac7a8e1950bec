"""The `AttentionBackend` seam: how a layer's attention reads and writes the paged KV pool.

Call order per forward: `init_forward_metadata(batch)` once (index tensors, masks, workspaces), then
`forward(q, k, v, layer, batch, rotary)` for every layer; `forward` applies the rotary embedding,
stores the new K/V at `batch.out_cache_loc` and attends over the request's whole sequence. A
prefill's last layer may ask for its logits rows only (`rows_only`): the same store, then
attention for those rows through `forward_decode`, with metadata of their own.

CUDA graphs: `init_graph_state(max_bs)` allocates static metadata buffers once;
`prepare_capture(bs, batch)` points the metadata at them before a capture; `prepare_replay(batch)`
refreshes their contents in place before each replay. Backends that cannot be captured raise.
Verify graphs (executor/verify_graphs.py): `init_verify_graph_state(max_bs, node_counts)`, then
`prepare_capture(bs, batch)` with a verify batch (`tree_mask` set) of one of those node counts.

Tree verify (speculative decoding): a batch with `tree_mask` set (runtime/speculative/tree.py,
`verify_forward_batch`: B requests x N draft nodes, row i * N + j = node j) stores every node's
K/V at `out_cache_loc` like any batch, then `forward_verify`: row (i, j) attends to request i's
prefix (`extend_prefix_lens[i]` tokens in the pool) and to the nodes its mask row names (itself
and its ancestors), all read from the pool (kernels/verify_attention.py).

Per-layer attention (`LayerAttention`, from the model config: `layer_attention(config)`): a
sliding window (the query at position p attends to keys at positions > p - window, and the backend
never reads older slots), attention-logit soft-capping (`cap * tanh(s / cap)`) and the score scale.

Ownership: a backend belongs to one ModelRunner (one scheduler thread); it never owns the pool.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem.kv_pool import KVPool, ReqToTokenPool
from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.rotary import RotaryEmbedding


class LayerAttention(NamedTuple):
    window: int | None  # sliding window, None: global
    softcap: float | None  # attention-logit soft cap, None: none
    scale: float  # applied to q . k


def layer_attention(config: ModelConfig) -> list[LayerAttention]:
    """Every layer's attention settings."""
    scale = config.attn_scale if config.attn_scale is not None else config.head_dim**-0.5
    return [
        LayerAttention(config.layer_window(i), config.attn_logit_softcap, scale)
        for i in range(config.num_hidden_layers)
    ]


class AttentionBackend(ABC):
    def __init__(
        self,
        kv_pool: KVPool,
        req_to_token: ReqToTokenPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token.table
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.layers: list[LayerAttention] | None = None  # None: global, scale head_dim**-0.5

    def set_layer_attention(self, layers: list[LayerAttention]) -> None:
        """Per-layer windows / soft caps / scales (before the first forward)."""
        self.layers = layers
        plain = LayerAttention(None, None, self.scale)
        self.plain = all(spec == plain for spec in layers)

    def layer(self, layer: int) -> LayerAttention:
        return LayerAttention(None, None, self.scale) if self.layers is None else self.layers[layer]

    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None: ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        batch: ForwardBatch,
        rotary: RotaryEmbedding | None = None,
        rows_only: bool = False,
    ) -> torch.Tensor:
        """q `[T, H, D]`, k/v `[T, kvH, D]` -> attention output `[T, H, D]`; `rotary` (if given)
        first rotates q and k at `batch.positions`.

        `rows_only` (EXTEND): the output `[R, H, D]` of the batch's R logits rows only
        (`batch.logits_indices`, in order): every row's K/V is stored, then those rows attend as
        decode queries over the pool (`ForwardBatch.logits_rows_batch`)."""
        q, k = self.rotate_and_store(q, k, v, layer, batch, rotary)
        if batch.tree_mask is not None:
            o = self.forward_verify(q, layer, batch)
            return o.index_select(0, batch.logits_indices) if rows_only else o
        if rows_only:
            rows = batch.logits_rows_batch()
            if rows.batch_size == 0:
                return q[:0]
            self.init_forward_metadata(rows)
            return self.forward_decode(q.index_select(0, batch.logits_indices), layer, rows)
        if batch.is_decode:
            return self.forward_decode(q, layer, batch)
        return self.forward_extend(q, k, v, layer, batch)

    def rotate_and_store(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        batch: ForwardBatch,
        rotary: RotaryEmbedding | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary embedding of q and k, then the new K/V into the pool at `batch.out_cache_loc`;
        returns the rotated (q, k)."""
        if rotary is not None:
            q, k = rotary(batch.positions, q, k)
        self.kv_pool.store(layer, batch.out_cache_loc, k, v)
        return q, k

    @abstractmethod
    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor: ...

    def forward_verify(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Tree verify attention of q `[B * N, H, D]` (the K/V already stored) -> `[B * N, H, D]`;
        a row that sees no key (a padding node of a request without prefix) outputs zeros."""
        raise NotImplementedError(f"{type(self).__name__} has no tree verify attention")

    # ---- CUDA-graph hooks ------------------------------------------------------------------------
    def init_graph_state(self, max_bs: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def init_verify_graph_state(self, max_bs: int, node_counts: Sequence[int]) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no CUDA graphs for verify steps")

    def prepare_capture(self, bs: int, batch: ForwardBatch) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_replay(self, batch: ForwardBatch) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")
