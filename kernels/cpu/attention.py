"""Decode attention over the paged KV pool on CPU (`attention.cpp`), and its torch reference.

`decode_attention(q, k_pool, v_pool, table, rows, seq_lens, scale)`: one query token per request
(q `[B, H, D]`), keys/values read in place from the pool (`[S, KVH, D]`, fp32/fp16/bf16) through
the request's `req_to_token` row (`table[rows[b], :seq_lens[b]]`, int32); returns `[B, H, D]`
fp32, or None where the kernel cannot run (library unavailable, an FP8 pool, an unsupported head
size), so that the caller keeps its torch path.
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu.linear import _WTYPES, _lib


def supports(kv_dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether `decode_attention` runs for this pool dtype and head shape on this machine."""
    lib = _lib()
    if lib is None or kv_dtype not in _WTYPES or num_heads % num_kv_heads:
        return False
    width = lib.rl_simd_width()
    return head_dim % width == 0 and head_dim <= 16 * width


def decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor | None:
    lib = _lib()
    if lib is None or k_pool.dtype not in _WTYPES or table.dtype != torch.int32:
        return None
    b, h, d = q.shape
    qf = q.float().contiguous()
    rows = rows.to(torch.int64).contiguous()
    seq_lens = seq_lens.to(torch.int64).contiguous()
    out = torch.empty(b, h, d, dtype=torch.float32)
    rc = lib.rl_decode_attention(
        qf.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), _WTYPES[k_pool.dtype],
        table.data_ptr(), table.stride(0), rows.data_ptr(), seq_lens.data_ptr(),
        b, h, k_pool.shape[1], d, scale, out.data_ptr(),
    )  # fmt: skip
    return out if rc == 0 else None


def decode_attention_ref(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Per request: gather its K/V rows, softmax(q K^T * scale) V with GQA, in fp32."""
    h, kvh = q.shape[1], k_pool.shape[1]
    outs = []
    for i in range(q.shape[0]):
        slots = table[int(rows[i]), : int(seq_lens[i])].long()
        k = k_pool[slots].float().repeat_interleave(h // kvh, dim=1)  # [L, H, D]
        v = v_pool[slots].float().repeat_interleave(h // kvh, dim=1)
        p = torch.einsum("hd,lhd->hl", q[i].float(), k).mul(scale).softmax(-1)
        outs.append(torch.einsum("hl,lhd->hd", p, v))
    return torch.stack(outs)
