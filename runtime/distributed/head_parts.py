"""Whole-vocabulary copies of the target's token embedding and LM head on rank 0, for a draft head
(EAGLE / EAGLE3) at tp_size > 1.

A draft head reads the target's embedding and logits (runtime/models/eagle.py `TargetParts`); at
TP > 1 each rank holds only its vocabulary rows of both (layers.py). The head runs on rank 0 alone
(runtime/speculative/draft_setup.py), so rank 0 gathers the rows of every rank ONCE at start-up
(`gather_vocab_weights`: every rank calls it, lockstep.py's GATHER_VOCAB message) and binds the
head to plain copies that make no collective call. The copies cost rank 0 `vocab x hidden` per
matrix (the target's pool leaves room for them on every rank, draft_memory.py).

Only targets whose logits are `LlamaForCausalLM`'s rule (the head's rows times the embedding or
LM head, no scale or soft cap) in the model dtype are supported (`check_head_target`, which rank
0 runs before it sends anything); any other is refused by name at start-up.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.distributed.comm import all_gather
from radixlm.runtime.distributed.layers import ParallelLMHead, VocabParallelEmbedding
from radixlm.runtime.errors import InvalidRequestError


def check_head_target(model: nn.Module) -> None:
    """Raise InvalidRequestError (field `speculative_algorithm`) unless a draft head can read
    whole-vocabulary copies of `model`'s embedding and LM head (module docstring)."""
    from radixlm.runtime.models.llama import LlamaForCausalLM

    embed, head = getattr(model, "embed_tokens", None), getattr(model, "lm_head", None)
    ok = (
        getattr(type(model), "compute_logits", None) is LlamaForCausalLM.compute_logits
        and isinstance(embed, VocabParallelEmbedding)
        and not embed.scale
        and (head is None or (isinstance(head, ParallelLMHead) and not head.fp8))
    )
    if not ok:
        raise InvalidRequestError(
            f"a draft head at tp_size > 1 needs a Llama-style target (plain embedding and "
            f"LM head); {type(model).__name__} is not one",
            "speculative_algorithm",
        )


def gather_vocab_weights(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The whole embedding `[V, H]` and untied LM head `[V, H]` (None: tied), from every rank's
    rows: a collective every rank of the group makes."""
    embed = model.embed_tokens
    weight = all_gather(embed.weight.data, 0, embed.sizes)
    head = model.lm_head
    return weight, None if head is None else all_gather(head.weight.data, 0, head.sizes)


def head_parts(
    weights: tuple[torch.Tensor, torch.Tensor | None],
) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """A plain embedding module and a logits function over the gathered weights."""
    from radixlm.runtime.models.llama import Embedding

    embed_w, head_w = weights
    embed = Embedding(0, embed_w.shape[1])
    embed.weight.data = embed_w  # NOTE: no second [V, H] allocation
    out_w = embed_w if head_w is None else head_w

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, out_w).float()

    return embed, logits
