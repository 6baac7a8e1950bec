"""A dense, pure-torch Llama forward (gpt-fast style): the test oracle of the paged runtime.

No KV pool, no batching: `reference_logits(weights, config, token_ids)` recomputes the whole
sequence with plain causal attention from Hugging Face-named weights. It shares no code with
`llama.py` beyond the rotary table, so a bug in the runtime's model does not hide here.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.rotary import rope_inv_freq


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@torch.no_grad()
def reference_logits(
    weights: Mapping[str, torch.Tensor], config: ModelConfig, token_ids: list[int]
) -> torch.Tensor:
    """float32 logits `[len(token_ids), vocab]`; position i predicts token i + 1."""
    x = reference_hidden_states(weights, config, token_ids)[-1]
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    return F.linear(x, head).float()


def reference_hidden_states(
    weights: Mapping[str, torch.Tensor], config: ModelConfig, token_ids: list[int]
) -> list[torch.Tensor]:
    """`[n, hidden]` per layer: the input of layer i (the embedding for layer 0), then the final
    normed hidden state (index `num_hidden_layers`): what a draft head's capture reads."""
    cfg = config
    assert cfg.rotary_dim == cfg.head_dim, "the oracle rotates whole heads"
    w = weights
    n = len(token_ids)
    h_dim, heads, kv_heads = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    x = w["model.embed_tokens.weight"][torch.tensor(token_ids)]
    dtype = x.dtype
    pos = torch.arange(n).float()
    freqs = pos[:, None] * rope_inv_freq(cfg)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    states = []
    for layer in range(cfg.num_hidden_layers):
        states.append(x)
        p = f"model.layers.{layer}."
        h = _rms(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)

        def proj(name: str, inp: torch.Tensor, p: str = p) -> torch.Tensor:
            return F.linear(inp, w[p + name + ".weight"], w.get(p + name + ".bias"))

        q = proj("self_attn.q_proj", h).view(n, heads, h_dim)
        k = proj("self_attn.k_proj", h).view(n, kv_heads, h_dim)
        v = proj("self_attn.v_proj", h).view(n, kv_heads, h_dim)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        group = heads // kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * h_dim**-0.5
        scores = scores.masked_fill(~mask, float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float()).to(dtype)
        x = x + proj("self_attn.o_proj", attn.reshape(n, heads * h_dim))
        h = _rms(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        act = F.silu(proj("mlp.gate_proj", h)) * proj("mlp.up_proj", h)
        x = x + proj("mlp.down_proj", act)
    return [*states, _rms(x, w["model.norm.weight"], cfg.rms_norm_eps)]


@torch.no_grad()
def reference_greedy(
    weights: Mapping[str, torch.Tensor],
    config: ModelConfig,
    token_ids: list[int],
    max_new_tokens: int,
) -> list[int]:
    """Greedy continuation by full recomputation (slow; tiny models only)."""
    ids = list(token_ids)
    for _ in range(max_new_tokens):
        ids.append(int(reference_logits(weights, config, ids)[-1].argmax()))
    return ids[len(token_ids) :]
