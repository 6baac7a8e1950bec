"""Pure-torch reference of tree verify attention (kernels/verify_attention.py): the correctness
oracle of the Triton kernel, with the same layouts (see that module's docstring)."""

from __future__ import annotations

import math

import torch

from radixlm.kernels.store_kv import dequantize_kv


def unpack_tree_mask(mask: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """[B, N, W] int32 packed tree mask -> [B, N, N] bool: [i, j, t] = row j sees node t."""
    t = torch.arange(num_nodes, device=mask.device)
    words = mask.to(torch.int64)[..., t // 32]
    return ((words >> (t % 32)) & 1).bool()


def verify_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    draft_loc: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Per request: gather the prefix and the tree nodes' K/V from the pool (dequantised), build
    the boolean mask [N, prefix + N] (every prefix key, the tree part from `tree_mask`; with
    `window` only keys at positions > the query's - window) and run a dense fp32 softmax. A row
    that sees no key (a padding node of a request with no prefix) outputs zeros, like the kernel."""
    bsz, nodes = draft_loc.shape
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_buffer.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    bits = unpack_tree_mask(tree_mask, nodes)
    pos = positions.reshape(bsz, nodes).to(torch.int64)
    out = torch.zeros_like(q)
    for i in range(bsz):
        prefix = int(prefix_lens[i])
        row = int(req_pool_indices[i])
        slots = torch.cat([req_to_token[row, :prefix].long(), draft_loc[i].long()])
        see = torch.cat([torch.ones(nodes, prefix, dtype=torch.bool, device=q.device), bits[i]], 1)
        if window is not None:
            k_pos = torch.cat([torch.arange(prefix, device=q.device), pos[i]])
            see &= k_pos[None, :] > pos[i][:, None] - window
        used = see.any(0)  # NOTE: keys nobody sees may sit in unwritten slots (NaN in tests)
        k = dequantize_kv(k_buffer[slots], torch.float32, k_scale)
        v = dequantize_kv(v_buffer[slots], torch.float32, v_scale)
        k = k.masked_fill(~used[:, None, None], 0).repeat_interleave(group, dim=1)  # [S, H, D]
        v = v.masked_fill(~used[:, None, None], 0).repeat_interleave(group, dim=1)
        qi = q[i * nodes : (i + 1) * nodes].float()  # [N, H, D]
        scores = torch.einsum("nhd,shd->hns", qi, k) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~see[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all -inf rows: zeros
        out[i * nodes : (i + 1) * nodes] = torch.einsum("hns,shd->nhd", probs, v).to(q.dtype)
    return out
