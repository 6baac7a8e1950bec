"""The `triton` attention backend (default on GPU): paged extend and split-KV decode kernels.

  EXTEND: `store_kv` writes the new K/V into the pool (with the model's fused rotary embedding,
          `rotary_store_kv` rotates q/k and stores in one kernel), then `extend_attention` reads
          the cached prefix from the pool and the new tokens from the contiguous k/v (causal
          among them).
  DECODE: the same store, then `decode_attention_fwd`: per KV split, one program reads each KV head
          once for its whole GQA group; the last split program of each head block to finish
          merges the splits (one kernel; `arrivals` counts them and is left zeroed).
  VERIFY (`batch.tree_mask` set): the same store, then `verify_attention_fwd`: split-KV over
          each request's prefix (read once for all its draft nodes) plus the masked tree part,
          merged by a second kernel; its workspace is the decode layout for B * N rows.
Per-layer sliding windows, soft caps and scales (`AttentionBackend.layer`) go to both kernels.
An FP8 pool's per-layer scales (`kv_pool.k_scale[layer]`, python floats) go to every kernel: the
stores quantise with them, the attention kernels dequantise (CUDA graphs bake them in at capture).
Verify graphs (`init_verify_graph_state(max_bs, node_counts)`, then `prepare_capture` with a
verify batch) get a workspace of their own, sized the same way for B * N rows, for the largest
(B, N) of any captured node count N (graphs of every N carve it from the start: they never run
at the same time).
The decode workspace `(mid_o, mid_lse)` is carved from one fp32 buffer: sized per batch in eager
mode, and once for the largest captured batch under CUDA graphs (each graph batch size keeps the
split count it was captured with; the kernels derive each request's effective splits from its
seq_len, so padded lanes with seq_len 0 read nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.kernels.decode_attention import decode_attention_fwd
from radixlm.kernels.decode_workspace import (
    alloc_decode_workspace,
    choose_num_kv_splits,
    decode_workspace_numel,
)
from radixlm.kernels.extend_attention import extend_attention
from radixlm.kernels.rotary import rotary_store_kv
from radixlm.kernels.store_kv import store_kv
from radixlm.kernels.verify_attention import verify_attention_fwd, verify_num_kv_splits
from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.mem.kv_pool import KVPool, ReqToTokenPool
from radixlm.runtime.models.rotary import RotaryEmbedding


@dataclass
class _DecodeMeta:
    mid_o: torch.Tensor
    mid_lse: torch.Tensor


class TritonAttnBackend(AttentionBackend):
    def __init__(
        self,
        kv_pool: KVPool,
        req_to_token: ReqToTokenPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        super().__init__(kv_pool, req_to_token, num_heads, num_kv_heads, head_dim)
        self.max_context = req_to_token.max_context
        self._eager_buffer = torch.empty(0, dtype=torch.float32, device=kv_pool.device)
        self._graph_buffer: torch.Tensor | None = None
        self._verify_buffer: torch.Tensor | None = None  # verify graphs (init_verify_graph_state)
        self._verify_nodes: tuple[int, ...] = ()
        # NOTE: one set of counters serves eager and graph launches: both run on one stream and
        # every launch leaves them zero. A decode batch (padded or not) never exceeds the pool.
        self._arrivals = torch.zeros(
            req_to_token.size * num_heads, dtype=torch.int32, device=kv_pool.device
        )

    def _splits(self, bs: int, max_len: int) -> int:
        return choose_num_kv_splits(bs, max_len, self.num_kv_heads)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.tree_mask is not None:
            bs, nodes = batch.tree_mask.shape[:2]
            max_prefix = max(batch.extend_prefix_lens_cpu)
            heads = (self.num_heads, self.num_kv_heads)
            splits = verify_num_kv_splits(bs, nodes, *heads, max_prefix)
            batch.attn_metadata = self._eager_workspace(bs * nodes, splits)
            return
        if not batch.is_decode:
            batch.attn_metadata = max(batch.extend_seq_lens_cpu)
            return
        bs = batch.batch_size
        batch.attn_metadata = self._eager_workspace(bs, self._splits(bs, max(batch.seq_lens_cpu)))

    def _eager_workspace(self, bs: int, splits: int) -> _DecodeMeta:
        numel = decode_workspace_numel(bs, self.num_heads, self.head_dim, splits)
        if self._eager_buffer.numel() < numel:
            self._eager_buffer = torch.empty(
                max(numel, 2 * self._eager_buffer.numel()),
                dtype=torch.float32,
                device=self.kv_pool.device,
            )
        ws = alloc_decode_workspace(
            bs, self.num_heads, self.head_dim, splits, buffer=self._eager_buffer
        )
        return _DecodeMeta(*ws)

    def rotate_and_store(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        batch: ForwardBatch,
        rotary: RotaryEmbedding | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k_buf, v_buf, loc = self.kv_pool.k[layer], self.kv_pool.v[layer], batch.out_cache_loc
        scales = self.kv_pool.k_scale[layer], self.kv_pool.v_scale[layer]
        if rotary is not None and rotary.fused:  # rotary and the K/V store in one kernel
            rotary_store_kv(batch.positions, q, k, v, rotary.cos_sin, k_buf, v_buf, loc, *scales)
            return q, k
        if rotary is not None:
            q, k = rotary(batch.positions, q, k)
        store_kv(k_buf, v_buf, loc, k, v, *scales)
        return q, k

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        assert batch.extend_prefix_lens is not None and batch.extend_seq_lens is not None
        assert batch.extend_start_loc is not None
        spec = self.layer(layer)
        return extend_attention(
            q,
            k,
            v,
            self.kv_pool.k[layer],
            self.kv_pool.v[layer],
            self.req_to_token,
            batch.req_pool_indices,
            batch.extend_prefix_lens,
            batch.extend_seq_lens,
            batch.extend_start_loc,
            batch.attn_metadata,
            spec.scale,
            k_scale=self.kv_pool.k_scale[layer],
            v_scale=self.kv_pool.v_scale[layer],
            window=spec.window,
            softcap=spec.softcap,
        )

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        meta: _DecodeMeta = batch.attn_metadata
        spec = self.layer(layer)
        out = torch.empty_like(q)
        return decode_attention_fwd(
            q,
            self.kv_pool.k[layer],
            self.kv_pool.v[layer],
            self.req_to_token,
            batch.req_pool_indices,
            batch.seq_lens,
            out,
            meta.mid_o,
            meta.mid_lse,
            spec.scale,
            arrivals=self._arrivals,
            k_scale=self.kv_pool.k_scale[layer],
            v_scale=self.kv_pool.v_scale[layer],
            window=spec.window,
            softcap=spec.softcap,
        )

    def forward_verify(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        assert batch.tree_mask is not None and batch.extend_prefix_lens is not None
        meta: _DecodeMeta = batch.attn_metadata
        spec = self.layer(layer)
        bs, nodes = batch.tree_mask.shape[:2]
        return verify_attention_fwd(
            q,
            self.kv_pool.k[layer],
            self.kv_pool.v[layer],
            self.req_to_token,
            batch.req_pool_indices,
            batch.extend_prefix_lens,
            batch.out_cache_loc.view(bs, nodes),
            batch.tree_mask,
            batch.positions,
            torch.empty_like(q),
            meta.mid_o,
            meta.mid_lse,
            spec.scale,
            k_scale=self.kv_pool.k_scale[layer],
            v_scale=self.kv_pool.v_scale[layer],
            window=spec.window,
            softcap=spec.softcap,
        )

    # ---- CUDA graphs ---------------------------------------------------------------------------
    def init_graph_state(self, max_bs: int) -> None:
        numel = max(
            decode_workspace_numel(
                bs, self.num_heads, self.head_dim, self._splits(bs, self.max_context)
            )
            for bs in range(1, max_bs + 1)
        )
        self._graph_buffer = torch.empty(numel, dtype=torch.float32, device=self.kv_pool.device)

    def init_verify_graph_state(self, max_bs: int, node_counts: Sequence[int]) -> None:
        """The static workspace of verify graphs of up to `max_bs` requests x N nodes, for each N
        of `node_counts` (each graph size keeps the split count for the longest prefix, like
        decode); then `prepare_capture` with a verify batch (`tree_mask` set) carves from it."""
        self._verify_nodes = tuple(node_counts)
        numel = max(
            decode_workspace_numel(
                bs * nodes, self.num_heads, self.head_dim, self._verify_splits(bs, nodes)
            )
            for bs in range(1, max_bs + 1)
            for nodes in self._verify_nodes
        )
        self._verify_buffer = torch.empty(numel, dtype=torch.float32, device=self.kv_pool.device)

    def _verify_splits(self, bs: int, nodes: int) -> int:
        heads = (self.num_heads, self.num_kv_heads)
        return verify_num_kv_splits(bs, nodes, *heads, self.max_context)

    def prepare_capture(self, bs: int, batch: ForwardBatch) -> None:
        if batch.tree_mask is not None:
            nodes = batch.tree_mask.shape[1]
            assert self._verify_buffer is not None and nodes in self._verify_nodes, (
                "init_verify_graph_state(max_bs, node_counts) first"
            )
            ws = alloc_decode_workspace(
                bs * nodes,
                self.num_heads,
                self.head_dim,
                self._verify_splits(bs, nodes),
                buffer=self._verify_buffer,
            )
            batch.attn_metadata = _DecodeMeta(*ws)
            return
        assert self._graph_buffer is not None, "init_graph_state first"
        splits = self._splits(bs, self.max_context)
        ws = alloc_decode_workspace(
            bs, self.num_heads, self.head_dim, splits, buffer=self._graph_buffer
        )
        batch.attn_metadata = _DecodeMeta(*ws)

    def prepare_replay(self, batch: ForwardBatch) -> None:
        pass  # every input lives in the graph's static buffers; the workspace is fixed
