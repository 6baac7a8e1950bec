"""The `torch` attention backend: gathers each request's KV from the pool and runs SDPA.

Runs on CPU and GPU and is the correctness oracle for the Triton backend. Per forward it builds
the slot indices once (`init_forward_metadata`); every layer then gathers K/V with one
`index_select` per tensor.
  EXTEND: one SDPA call per request, causal with the cached prefix in front of the new tokens
          (the prefix read from the pool, the new tokens' K/V as computed, like the Triton kernel).
  DECODE: one batched SDPA over the padded batch `[B, kvH, Lmax, D]` with a key-padding mask;
          on CPU, where the C++ kernel runs (`kernels/cpu/attention.py`), that kernel instead:
          it reads K/V in place through `req_to_token` (no gather, no padding, no metadata).
Whatever is read from the pool is dequantised to q's dtype (an FP8 pool: `fp8 * scale`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.kernels.store_kv import dequantize_kv
from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.forward_batch import ForwardBatch


@dataclass
class _ExtendMeta:
    slots: list[torch.Tensor]  # per request: [prefix_b] KV slots of its cached prefix
    masks: list[torch.Tensor | None]  # per request: [n_b, L_b] bool (None: no prefix, causal)
    starts: list[int]
    lens: list[int]


@dataclass
class _DecodeMeta:
    slots: torch.Tensor  # [B * Lmax] int64, padded with slot 0
    max_len: int
    mask: torch.Tensor  # [B, 1, 1, Lmax] bool, True = attend


class TorchAttnBackend(AttentionBackend):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cpu_decode = False
        if self.req_to_token.device.type == "cpu":
            from radixlm.kernels.cpu import attention as cpu_attention

            shape = (self.num_heads, self.num_kv_heads, self.head_dim)
            self.cpu_decode = cpu_attention.supports(self.kv_pool.dtype, *shape)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        table = self.req_to_token
        rows = batch.req_pool_indices
        if batch.is_decode and self.cpu_decode:
            batch.attn_metadata = None  # NOTE: the C++ kernel reads req_to_token directly
            return
        if batch.is_decode:
            max_len = max(batch.seq_lens_cpu)
            slots = table[rows, :max_len].to(torch.int64)
            ar = torch.arange(max_len, device=slots.device)
            valid = ar[None, :] < batch.seq_lens[:, None]
            slots = slots.masked_fill(~valid, 0)
            batch.attn_metadata = _DecodeMeta(slots.view(-1), max_len, valid[:, None, None, :])
            return
        meta = _ExtendMeta([], [], [], [])
        start = 0
        rows_cpu = rows.tolist()
        for row, prefix, n in zip(
            rows_cpu, batch.extend_prefix_lens_cpu, batch.extend_seq_lens_cpu
        ):
            total = prefix + n
            meta.slots.append(table[row, :prefix].to(torch.int64))
            if prefix == 0:
                meta.masks.append(None)
            else:
                q_pos = torch.arange(prefix, total, device=table.device)
                k_pos = torch.arange(total, device=table.device)
                meta.masks.append(k_pos[None, :] <= q_pos[:, None])
            meta.starts.append(start)
            meta.lens.append(n)
            start += n
        batch.attn_metadata = meta

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        meta: _ExtendMeta = batch.attn_metadata
        k_buf, v_buf = self.kv_pool.k[layer], self.kv_pool.v[layer]
        k_scale, v_scale = self.kv_pool.k_scale[layer], self.kv_pool.v_scale[layer]
        out = torch.empty_like(q)
        for slots, mask, start, n in zip(meta.slots, meta.masks, meta.starts, meta.lens):
            qi = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            ki, vi = k[start : start + n], v[start : start + n]
            if mask is not None:  # the cached prefix in front of the new tokens
                ki = torch.cat([dequantize_kv(k_buf.index_select(0, slots), q.dtype, k_scale), ki])
                vi = torch.cat([dequantize_kv(v_buf.index_select(0, slots), q.dtype, v_scale), vi])
            ki = ki.to(q.dtype).transpose(0, 1).unsqueeze(0)  # [1, kvH, L, D]
            vi = vi.to(q.dtype).transpose(0, 1).unsqueeze(0)
            oi = F.scaled_dot_product_attention(
                qi,
                ki,
                vi,
                attn_mask=mask,
                is_causal=mask is None,
                scale=self.scale,
                enable_gqa=True,
            )
            out[start : start + n] = oi[0].transpose(0, 1)
        return out

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        if self.cpu_decode:
            from radixlm.kernels.cpu.attention import decode_attention

            k_pool, v_pool = self.kv_pool.k[layer], self.kv_pool.v[layer]
            o = decode_attention(
                q, k_pool, v_pool, self.req_to_token, batch.req_pool_indices, batch.seq_lens,
                self.scale,
            )  # fmt: skip
            assert o is not None  # NOTE: `supports` held at start-up
            return o.to(q.dtype)
        meta: _DecodeMeta = batch.attn_metadata
        bs = q.shape[0]
        shape = (bs, meta.max_len, self.num_kv_heads, self.head_dim)
        k = self.kv_pool.k[layer].index_select(0, meta.slots).view(shape).transpose(1, 2)
        v = self.kv_pool.v[layer].index_select(0, meta.slots).view(shape).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2),
            dequantize_kv(k, q.dtype, self.kv_pool.k_scale[layer]),
            dequantize_kv(v, q.dtype, self.kv_pool.v_scale[layer]),
            attn_mask=meta.mask,
            scale=self.scale,
            enable_gqa=True,
        )
        return o.squeeze(2)
