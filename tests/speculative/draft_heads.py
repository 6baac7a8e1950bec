"""Random EAGLE / EAGLE-3 draft heads saved in their Hugging Face formats, and a pure-torch
reference of their forward written from those formats (not from runtime/models): the oracle the
heads' tests compare against.

`save_llama` writes the target they go with (hidden 64, 2 layers, vocabulary 512, tied
embeddings) and smaller random drafts with its vocabulary: random weights of a scale that makes
the next token depend on the context (the preset `dummy` weights mostly repeat the last token).
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

H, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 64, 4, 2, 16, 96, 512
DRAFT_VOCAB = 128
TARGET_SEED = 0  # the target's weights (conftest.py `paths`)
EPS, THETA = 1e-5, 10000.0
# EAGLE-3 captures the inputs of target layers id + 1: layer 0 (the embedding), and layer 1 twice
AUX_LAYER_IDS = [-1, 0, 0]


def head_config(kind: str, vocab: int = VOCAB, theta: float = THETA) -> dict:
    cfg = {
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": INTER,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": vocab,
        "rms_norm_eps": EPS,
        "rope_theta": theta,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if kind == "EAGLE":
        return {**cfg, "architectures": ["LlamaForCausalLMEagle"]}
    return {
        **cfg,
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": H,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS},
    }


def head_tensors(kind: str, seed: int, vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lin = lambda o, i: torch.randn(o, i, generator=g) * (0.5 / i**0.5)  # noqa: E731
    norm = lambda: 1.0 + 0.1 * torch.randn(H, generator=g)  # noqa: E731
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    attn_in = H if kind == "EAGLE" else 2 * H
    pre = "layers.0." if kind == "EAGLE" else "midlayer."
    t = {
        f"{pre}self_attn.q_proj.weight": lin(q, attn_in),
        f"{pre}self_attn.k_proj.weight": lin(kv, attn_in),
        f"{pre}self_attn.v_proj.weight": lin(kv, attn_in),
        f"{pre}self_attn.o_proj.weight": lin(H, q),
        f"{pre}mlp.gate_proj.weight": lin(INTER, H),
        f"{pre}mlp.up_proj.weight": lin(INTER, H),
        f"{pre}mlp.down_proj.weight": lin(H, INTER),
        f"{pre}post_attention_layernorm.weight": norm(),
        "embed_tokens.weight": torch.randn(vocab, H, generator=g),  # ignored: the target's is used
    }
    if kind == "EAGLE":
        t["fc.weight"] = lin(H, 2 * H)
        t["fc.bias"] = 0.1 * torch.randn(H, generator=g)
        return t
    hot = torch.randperm(vocab, generator=g)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    t.update({
        "fc.weight": lin(H, 3 * H),
        f"{pre}input_layernorm.weight": norm(),
        f"{pre}hidden_norm.weight": norm(),
        "norm.weight": norm(),
        "lm_head.weight": lin(DRAFT_VOCAB, H) * 8,
        "d2t": hot - torch.arange(DRAFT_VOCAB),
        "t2d": t2d,
    })  # fmt: skip
    return t


def save_head(
    path: str,
    kind: str,
    seed: int = 0,
    drop: str | None = None,
    vocab: int = VOCAB,
    theta: float = THETA,
) -> dict:
    """Write config.json + model.safetensors (without tensor `drop`) of a head for a target of
    `vocab` tokens and rope `theta`; returns the tensors."""
    os.makedirs(path, exist_ok=True)
    tensors = head_tensors(kind, seed, vocab)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(head_config(kind, vocab, theta), f)
    kept = {k: v.contiguous() for k, v in tensors.items() if k != drop}
    save_file(kept, os.path.join(path, "model.safetensors"))
    return tensors


def save_llama(
    path: str, seed: int, hidden: int = H, layers: int = 2, heads: int = HEADS, vocab: int = VOCAB
) -> dict[str, torch.Tensor]:
    """A random Llama checkpoint (config.json + model.safetensors) with the heads' vocabulary and
    an untied LM head (tied random embeddings make the last token its own best successor);
    returns the tensors."""
    os.makedirs(path, exist_ok=True)
    kv_heads, head_dim, inter = max(1, heads // 2), hidden // heads, 2 * hidden
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "rms_norm_eps": EPS, "rope_theta": THETA, "max_position_embeddings": 2048,
        "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1,
        "eos_token_id": 2,
    }  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    lin = lambda o, i: torch.randn(o, i, generator=g) * (1.0 / i**0.5)  # noqa: E731
    t = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g),
         "model.norm.weight": torch.ones(hidden), "lm_head.weight": lin(vocab, hidden) * 4}  # fmt: skip
    q, kv = heads * head_dim, kv_heads * head_dim
    for i in range(layers):
        pre = f"model.layers.{i}."
        t.update({
            f"{pre}self_attn.q_proj.weight": lin(q, hidden),
            f"{pre}self_attn.k_proj.weight": lin(kv, hidden),
            f"{pre}self_attn.v_proj.weight": lin(kv, hidden),
            f"{pre}self_attn.o_proj.weight": lin(hidden, q),
            f"{pre}mlp.gate_proj.weight": lin(inter, hidden),
            f"{pre}mlp.up_proj.weight": lin(inter, hidden),
            f"{pre}mlp.down_proj.weight": lin(hidden, inter),
            f"{pre}input_layernorm.weight": torch.ones(hidden),
            f"{pre}post_attention_layernorm.weight": torch.ones(hidden),
        })  # fmt: skip
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(t, os.path.join(path, "model.safetensors"))
    return t


# ---- the reference -------------------------------------------------------------------------------
def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    inv = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    ang = pos.float()[:, None] * inv[None]
    cos, sin = (
        torch.cat([ang.cos(), ang.cos()], -1)[:, None],
        torch.cat([ang.sin()] * 2, -1)[:, None],
    )
    half = HEAD_DIM // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def _attention(x: torch.Tensor, pos: torch.Tensor, t: dict, pre: str) -> torch.Tensor:
    n = x.shape[0]
    q = (x @ t[f"{pre}self_attn.q_proj.weight"].T).view(n, HEADS, HEAD_DIM)
    k = (x @ t[f"{pre}self_attn.k_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM)
    v = (x @ t[f"{pre}self_attn.v_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM)
    q, k = _rope(q, pos), _rope(k, pos)
    rep = HEADS // KV_HEADS
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / HEAD_DIM**0.5
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    o = torch.einsum("hqk,khd->qhd", probs, v).reshape(n, HEADS * HEAD_DIM)
    return o @ t[f"{pre}self_attn.o_proj.weight"].T


def _mlp(x: torch.Tensor, t: dict, pre: str) -> torch.Tensor:
    gate = torch.nn.functional.silu(x @ t[f"{pre}mlp.gate_proj.weight"].T)
    return (gate * (x @ t[f"{pre}mlp.up_proj.weight"].T)) @ t[f"{pre}mlp.down_proj.weight"].T


def reference_head(
    kind: str, t: dict, target: dict, ids: torch.Tensor, feats: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of rows at positions 0.. (causal) with the `target` checkpoint's embedding
    (and, for EAGLE, LM head): (logits [T, vocab of the head]: target ids for EAGLE, draft ids
    for EAGLE-3; the next features [T, H])."""
    embed = target["model.embed_tokens.weight"]
    pos = torch.arange(ids.shape[0])
    emb = embed[ids]
    if kind == "EAGLE":
        pre = "layers.0."
        h = torch.cat([emb, feats], -1) @ t["fc.weight"].T + t["fc.bias"]
        s = _attention(h, pos, t, pre) + h  # layer 0: no input norm
        out = _mlp(_rms(s, t[f"{pre}post_attention_layernorm.weight"]), t, pre) + s
        return out @ target["lm_head.weight"].T, out  # the target's LM head, no final norm
    pre = "midlayer."
    g = feats @ t["fc.weight"].T if feats.shape[-1] != H else feats
    x = torch.cat(
        [_rms(emb, t[f"{pre}input_layernorm.weight"]), _rms(g, t[f"{pre}hidden_norm.weight"])], -1
    )
    s = _attention(x, pos, t, pre) + g
    out = _mlp(_rms(s, t[f"{pre}post_attention_layernorm.weight"]), t, pre) + s
    return _rms(out, t["norm.weight"]) @ t["lm_head.weight"].T, out
