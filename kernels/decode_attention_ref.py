"""Pure-torch reference of decode attention (kernels/decode_attention.py): the correctness oracle
of the Triton kernels, with the same layouts."""

from __future__ import annotations

import math

import torch

from radixlm.kernels.store_kv import dequantize_kv


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Pure-torch reference: per request, gather K/V (dequantised from an FP8 pool) and run a
    dense fp32 softmax. `window`: only the last `window` positions; `softcap`: scores ->
    softcap * tanh(scores / softcap).

    A padding lane (seq_len == 0) outputs zeros, like the kernel.
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_buffer.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        seq_len = int(seq_lens[b])
        if seq_len == 0:
            continue
        lo = 0 if window is None else max(0, seq_len - window)
        slots = req_to_token[int(req_pool_indices[b]), lo:seq_len].long()
        k = dequantize_kv(k_buffer[slots], torch.float32, k_scale)
        v = dequantize_kv(v_buffer[slots], torch.float32, v_scale)
        k = k.repeat_interleave(group, dim=1)  # [S, H, D]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,shd->hs", q[b].float(), k) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hs,shd->hd", probs, v).to(q.dtype)
    return out
