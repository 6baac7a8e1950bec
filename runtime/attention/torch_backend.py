"""The `torch` attention backend: gathers each request's KV from the pool and runs SDPA.

Runs on CPU and GPU and is the correctness oracle for the Triton backend. Per forward it builds
the slot indices once per distinct window (`init_forward_metadata`); every layer then gathers K/V
with one `index_select` per tensor.
  EXTEND: one attention call per request, causal with the cached prefix in front of the new tokens
          (the prefix read from the pool, the new tokens' K/V as computed, like the Triton kernel);
          on CPU, where the C++ decode kernel runs, plain layers instead run every new token as a
          decode query over its causal prefix in the pool: bitwise what a decode step computes
          (batch invariance: caching, chunking, retraction and speculative decoding then cannot
          change a greedy output), for ~1.1-1.9x the time of SDPA's attention on long prompts.
  DECODE: one batched call over the padded batch `[B, kvH, Lmax, D]` with a key-padding mask;
          on CPU, where the C++ kernel runs (`kernels/cpu/attention.py`), that kernel instead for
          plain layers (no window, no soft cap): it reads K/V in place through `req_to_token`.
  VERIFY (`batch.tree_mask` set): one batched call over `[B, H, N, D]` queries and each request's
          prefix (padded) plus its N tree nodes, read from the pool, under the tree mask.
A windowed layer gathers only the slots its queries can see (positions > first query - window):
older slots are never read. A soft-capped layer runs the attention in plain torch ops (SDPA has
no soft cap), the way transformers' eager Gemma 2 does.
Whatever is read from the pool is dequantised to q's dtype (an FP8 pool: `fp8 * scale`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from radixlm.kernels.store_kv import dequantize_kv
from radixlm.kernels.verify_attention_ref import unpack_tree_mask
from radixlm.runtime.attention.base import AttentionBackend, LayerAttention
from radixlm.runtime.executor.forward_batch import ForwardBatch


@dataclass
class _ExtendMeta:
    slots: list[torch.Tensor]  # per request: [prefix_b] KV slots of its cached prefix (in window)
    masks: list[torch.Tensor | None]  # per request: [n_b, L_b] bool (None: no prefix, causal)
    starts: list[int]
    lens: list[int]
    windowed: dict[int, _ExtendMeta] = field(default_factory=dict)  # window -> its own meta
    # CPU, no window: per new token, its request's req_to_token row and its causal length
    token_rows: torch.Tensor | None = None
    token_lens: torch.Tensor | None = None


@dataclass
class _DecodeMeta:
    slots: torch.Tensor  # [B * Lmax] int64, padded with slot 0
    max_len: int
    mask: torch.Tensor  # [B, 1, 1, Lmax] bool, True = attend
    windowed: dict[int, _DecodeMeta] = field(default_factory=dict)


@dataclass
class _VerifyMeta:
    slots: torch.Tensor  # [B * (Lmax + N)] int64: each request's prefix (padded, slot 0), its nodes
    mask: torch.Tensor  # [B, 1, N, Lmax + N] bool, True = attend
    seen: torch.Tensor  # [B, 1, N, 1] bool: the row attends to some key (else its output is 0)
    windowed: dict[int, _VerifyMeta] = field(default_factory=dict)
    # CPU, no window: per node, the slots a decode step reads once its path is committed
    node_table: torch.Tensor | None = None  # [B * N, Lmax + N] int32
    node_lens: torch.Tensor | None = None  # [B * N] int64


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    spec: LayerAttention,
) -> torch.Tensor:
    """q `[B, H, n, D]`, k/v `[B, kvH, L, D]`, mask broadcastable to `[B, H, n, L]` (True =
    attend; None: causal) -> `[B, H, n, D]`."""
    if spec.softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=spec.scale, enable_gqa=True
        )
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * spec.scale
    s = torch.tanh(s / spec.softcap) * spec.softcap
    if mask is None:
        n, length = q.shape[2], k.shape[2]
        mask = torch.ones(n, length, dtype=torch.bool, device=q.device).tril(length - n)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


class TorchAttnBackend(AttentionBackend):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cpu_decode = False
        if self.req_to_token.device.type == "cpu":
            from radixlm.kernels.cpu import attention as cpu_attention

            shape = (self.num_heads, self.num_kv_heads, self.head_dim)
            self.cpu_decode = cpu_attention.supports(self.kv_pool.dtype, *shape)

    def layers_plain(self) -> bool:
        return self.layers is None or self.plain

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        windows = sorted({s.window for s in self.layers or () if s.window is not None})
        if batch.tree_mask is not None:
            if self.cpu_decode and self.layers_plain():
                # NOTE: every layer runs its nodes as decode queries (`forward_verify`, or the
                # one-call C++ step): the per-node table only, no SDPA mask.
                table, lens = self._verify_node_rows(batch)
                none = torch.empty(0)
                batch.attn_metadata = _VerifyMeta(none, none, none, {}, table, lens)
                return
            meta = self._verify_meta(batch, None)
            meta.windowed = {w: self._verify_meta(batch, w) for w in windows}
            if self.cpu_decode:
                meta.node_table, meta.node_lens = self._verify_node_rows(batch)
            batch.attn_metadata = meta
            return
        if batch.is_decode and self.cpu_decode and self.layers_plain():
            batch.attn_metadata = None  # NOTE: the C++ kernel reads req_to_token directly
            return
        if batch.is_decode:
            meta = self._decode_meta(batch, None)
            meta.windowed = {w: self._decode_meta(batch, w) for w in windows}
        else:
            meta = self._extend_meta(batch, None)
            meta.windowed = {w: self._extend_meta(batch, w) for w in windows}
        batch.attn_metadata = meta

    def _decode_meta(self, batch: ForwardBatch, window: int | None) -> _DecodeMeta:
        table = self.req_to_token
        lens = batch.seq_lens
        seen = (
            batch.seq_lens_cpu if window is None else [min(n, window) for n in batch.seq_lens_cpu]
        )
        max_len = max(seen)
        ar = torch.arange(max_len, device=table.device)
        # NOTE: a windowed request reads positions [len - window, len): the last `window` ones.
        first = lens - lens.clamp(max=window) if window is not None else torch.zeros_like(lens)
        cols = (first[:, None] + ar[None, :]).clamp(max=table.shape[1] - 1)
        valid = ar[None, :] < (lens - first)[:, None]
        slots = table[batch.req_pool_indices[:, None], cols].to(torch.int64)
        slots = slots.masked_fill(~valid, 0)
        return _DecodeMeta(slots.view(-1), max_len, valid[:, None, None, :])

    def _verify_meta(self, batch: ForwardBatch, window: int | None) -> _VerifyMeta:
        assert batch.tree_mask is not None and batch.extend_prefix_lens is not None
        table = self.req_to_token
        bsz, nodes = batch.tree_mask.shape[:2]
        prefix = batch.extend_prefix_lens.to(torch.int64)
        # NOTE: a windowed layer reads the prefix positions the root can see, > prefix - window;
        # deeper nodes see fewer of them (masked below).
        lo = (prefix - (window - 1)).clamp(min=0) if window is not None else prefix * 0
        spans = [p if window is None else min(p, window - 1) for p in batch.extend_prefix_lens_cpu]
        ar = torch.arange(max(spans), device=table.device)
        cols = lo[:, None] + ar[None, :]
        valid = ar[None, :] < (prefix - lo)[:, None]
        rows = batch.req_pool_indices[:, None]
        prefix_slots = table[rows, cols.clamp(max=table.shape[1] - 1)].to(torch.int64)
        draft_loc = batch.out_cache_loc.view(bsz, nodes).to(torch.int64)
        slots = torch.cat([prefix_slots.masked_fill(~valid, 0), draft_loc], 1)
        see = torch.cat(
            [valid[:, None, :].expand(-1, nodes, -1), unpack_tree_mask(batch.tree_mask, nodes)], 2
        )
        if window is not None:
            q_pos = batch.positions.view(bsz, nodes)
            k_pos = torch.cat([cols, q_pos], 1)
            see &= k_pos[:, None, :] > q_pos[:, :, None] - window
        see = see[:, None]
        return _VerifyMeta(slots.view(-1), see, see.any(-1, keepdim=True))

    def _verify_node_rows(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per tree node, the K/V slots a decode step would read once the node's path is
        committed: the request's prefix, then the path's nodes root first (parents precede
        children, so node-index order is path order). A padding node sees the prefix only."""
        assert batch.tree_mask is not None
        bsz, nodes = batch.tree_mask.shape[:2]
        see = unpack_tree_mask(batch.tree_mask, nodes)  # [B, N, N]
        draft_loc = batch.out_cache_loc.view(bsz, nodes).to(torch.int32)
        prefixes = batch.extend_prefix_lens_cpu
        table = torch.zeros(bsz * nodes, max(prefixes) + nodes, dtype=torch.int32)
        lens = torch.empty(bsz * nodes, dtype=torch.int64)
        ar = torch.arange(nodes, device=see.device)
        # per node, the nodes it sees first (in index order = path order), then the others
        order = torch.where(see, ar, ar + nodes).argsort(dim=-1)  # [B, N, N]
        count = see.sum(-1)  # [B, N]: path lengths
        for i, (row, prefix) in enumerate(zip(batch.req_pool_indices.tolist(), prefixes)):
            rows = slice(i * nodes, (i + 1) * nodes)
            table[rows, :prefix] = self.req_to_token[row, :prefix]
            path = draft_loc[i][order[i]]
            table[rows, prefix : prefix + nodes] = torch.where(ar < count[i, :, None], path, 0)
            lens[rows] = prefix + count[i]
        return table, lens

    def _extend_meta(self, batch: ForwardBatch, window: int | None) -> _ExtendMeta:
        table = self.req_to_token
        meta = _ExtendMeta([], [], [], [])
        start = 0
        rows_cpu = batch.req_pool_indices.tolist()
        for row, prefix, n in zip(
            rows_cpu, batch.extend_prefix_lens_cpu, batch.extend_seq_lens_cpu
        ):
            total = prefix + n
            lo = 0 if window is None else max(0, prefix - window + 1)
            meta.slots.append(table[row, lo:prefix].to(torch.int64))
            if prefix == 0 and window is None:
                meta.masks.append(None)
            else:
                q_pos = torch.arange(prefix, total, device=table.device)
                k_pos = torch.arange(lo, total, device=table.device)
                mask = k_pos[None, :] <= q_pos[:, None]
                if window is not None:
                    mask &= k_pos[None, :] > q_pos[:, None] - window
                meta.masks.append(mask)
            meta.starts.append(start)
            meta.lens.append(n)
            start += n
        if self.cpu_decode and window is None:
            counts = torch.tensor(batch.extend_seq_lens_cpu)
            token_rows = torch.tensor(rows_cpu).repeat_interleave(counts)
            firsts = torch.tensor(batch.extend_prefix_lens_cpu) - (counts.cumsum(0) - counts)
            token_lens = torch.arange(1, start + 1) + firsts.repeat_interleave(counts)
            # NOTE: only where req_to_token already holds the new tokens' slots (the scheduler
            # writes them before the forward; a batch built otherwise keeps SDPA)
            if torch.equal(table[token_rows, token_lens - 1].long(), batch.out_cache_loc.long()):
                meta.token_rows, meta.token_lens = token_rows, token_lens
        return meta

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        spec = self.layer(layer)
        meta: _ExtendMeta = batch.attn_metadata
        if spec.window is None and spec.softcap is None and meta.token_rows is not None:
            # NOTE: each new token as a decode query over its causal prefix (the K/V are in the
            # pool): bitwise a decode step's attention, so an extend and decode steps over the
            # same tokens agree (the C++ kernel's output depends only on the query's slots).
            return self._cpu_attention(q, layer, self.req_to_token, meta.token_rows,
                                       meta.token_lens)  # fmt: skip
        if spec.window is not None:
            meta = meta.windowed[spec.window]
        k_buf, v_buf = self.kv_pool.k[layer], self.kv_pool.v[layer]
        k_scale, v_scale = self.kv_pool.k_scale[layer], self.kv_pool.v_scale[layer]
        out = torch.empty_like(q)
        for slots, mask, start, n in zip(meta.slots, meta.masks, meta.starts, meta.lens):
            qi = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            ki, vi = k[start : start + n], v[start : start + n]
            if slots.numel():  # the cached prefix (its visible part) in front of the new tokens
                ki = torch.cat([dequantize_kv(k_buf.index_select(0, slots), q.dtype, k_scale), ki])
                vi = torch.cat([dequantize_kv(v_buf.index_select(0, slots), q.dtype, v_scale), vi])
            ki = ki.to(q.dtype).transpose(0, 1).unsqueeze(0)  # [1, kvH, L, D]
            vi = vi.to(q.dtype).transpose(0, 1).unsqueeze(0)
            oi = attend(qi, ki, vi, mask, spec)
            out[start : start + n] = oi[0].transpose(0, 1)
        return out

    def _cpu_attention(
        self,
        q: torch.Tensor,
        layer: int,
        table: torch.Tensor,
        rows: torch.Tensor,
        lens: torch.Tensor,
    ) -> torch.Tensor:
        """The C++ decode kernel: query i over `table[rows[i], :lens[i]]`'s slots, in order."""
        from radixlm.kernels.cpu.attention import decode_attention

        k_pool, v_pool = self.kv_pool.k[layer], self.kv_pool.v[layer]
        o = decode_attention(q, k_pool, v_pool, table, rows, lens, self.layer(layer).scale)
        assert o is not None  # NOTE: `supports` held at start-up
        return o.to(q.dtype)

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        spec = self.layer(layer)
        if self.cpu_decode and spec.window is None and spec.softcap is None:
            return self._cpu_attention(q, layer, self.req_to_token, batch.req_pool_indices,
                                       batch.seq_lens)  # fmt: skip
        meta: _DecodeMeta = batch.attn_metadata
        if spec.window is not None:
            meta = meta.windowed[spec.window]
        bs = q.shape[0]
        shape = (bs, meta.max_len, self.num_kv_heads, self.head_dim)
        k = self.kv_pool.k[layer].index_select(0, meta.slots).view(shape).transpose(1, 2)
        v = self.kv_pool.v[layer].index_select(0, meta.slots).view(shape).transpose(1, 2)
        o = attend(
            q.unsqueeze(2),
            dequantize_kv(k, q.dtype, self.kv_pool.k_scale[layer]),
            dequantize_kv(v, q.dtype, self.kv_pool.v_scale[layer]),
            meta.mask,
            spec,
        )
        return o.squeeze(2)

    def forward_verify(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        spec = self.layer(layer)
        meta: _VerifyMeta = batch.attn_metadata
        if meta.node_table is not None and spec.window is None and spec.softcap is None:
            # NOTE: each node as a decode query over its committed path: bitwise the attention a
            # decode step computes for that token (the C++ kernel's output depends only on the
            # query's slots), so speculation on and off agree on CPU.
            rows = torch.arange(meta.node_lens.numel())
            q = q.reshape(-1, self.num_heads, self.head_dim)
            return self._cpu_attention(q, layer, meta.node_table, rows, meta.node_lens)
        if spec.window is not None:
            meta = meta.windowed[spec.window]
        bsz, _, nodes, length = meta.mask.shape
        shape = (bsz, length, self.num_kv_heads, self.head_dim)
        k = self.kv_pool.k[layer].index_select(0, meta.slots).view(shape).transpose(1, 2)
        v = self.kv_pool.v[layer].index_select(0, meta.slots).view(shape).transpose(1, 2)
        o = attend(
            q.view(bsz, nodes, self.num_heads, self.head_dim).transpose(1, 2),
            dequantize_kv(k, q.dtype, self.kv_pool.k_scale[layer]),
            dequantize_kv(v, q.dtype, self.kv_pool.v_scale[layer]),
            meta.mask,
            spec,
        )
        o = torch.where(meta.seen, o, 0.0)  # NOTE: a row with no key: NaN from the softmax
        return o.transpose(1, 2).reshape(bsz * nodes, self.num_heads, self.head_dim)
