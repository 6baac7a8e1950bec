"""What a draft model will hold on the device (speculative decoding's STANDALONE / EAGLE / EAGLE3),
which the target's KV pool leaves room for. Read by `ModelRunner._init_memory` before any draft is
built, so it imports no runner (runtime/speculative/draft_setup.py builds the draft itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from radixlm.runtime.mem.kv_pool import KVPool
from radixlm.runtime.models.loader import resolve_model

if TYPE_CHECKING:
    from radixlm.runtime.models.config import ModelConfig
    from radixlm.runtime.server_args import ServerArgs

DRAFT_ALGORITHMS = ("STANDALONE", "EAGLE", "EAGLE3")


class DraftMemory(NamedTuple):
    weight_bytes: int  # the draft's weights in the model dtype (estimated from its config)
    kv_bytes_per_token: int  # its KV per token over all its layers


def draft_memory(
    args: ServerArgs, dtype: torch.dtype, kv_dtype: torch.dtype, target: ModelConfig | None = None
) -> DraftMemory | None:
    """What the draft of `args` will hold on the device, which the target's KV pool leaves room
    for (ModelRunner._init_memory on GPU); None without a draft model. A head shares the target's
    embedding (and, for EAGLE, its LM head); at tp_size > 1 rank 0 holds whole copies of them
    (runtime/distributed/head_parts.py): counted from `target`'s config, the full model's."""
    algo = args.speculative_algorithm
    if algo not in DRAFT_ALGORITHMS or not args.speculative_draft_model_path:
        return None
    dummy = args.load_format == "dummy" and algo == "STANDALONE"
    cfg = resolve_model(args.speculative_draft_model_path, "dummy" if dummy else "auto").config
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    attn_in = 2 * h if algo == "EAGLE3" else h
    per_layer = (
        attn_in * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h + 3 * h * cfg.intermediate_size
    )
    params = layers * per_layer
    if algo == "STANDALONE":
        params += cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    elif algo == "EAGLE":
        params += 2 * h * h
    else:
        params += 3 * int(cfg.hf_config.get("target_hidden_size") or h) * h
        params += int(cfg.hf_config.get("draft_vocab_size") or 0) * h
    if algo != "STANDALONE" and args.tp_size > 1 and target is not None:
        params += target.vocab_size * target.hidden_size * (1 + (not target.tie_word_embeddings))
    kv = KVPool.bytes_per_token(layers, cfg.num_key_value_heads, cfg.head_dim, kv_dtype)
    return DraftMemory(params * torch.finfo(dtype).bits // 8, kv)
