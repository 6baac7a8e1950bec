"""Which part of the model a tensor-parallel rank holds: head and size splits, the rank's local
model config, and the slice of every checkpoint tensor it loads.

Splits (rank r of tp):
- attention heads (`head_split`), regular GQA on every rank, so that the attention backends and
  the KV pool need no change: with num_kv_heads >= tp each rank holds whole KV groups (a KV head
  and its q heads), as evenly as possible; with num_kv_heads < tp the ranks are spread over the
  KV heads, each rank holds one KV head (replicated on the ranks sharing it) and a contiguous
  part of that head's q heads.
  # NOTE: uneven splits are allowed (SGLang requires divisibility): the default SmolLM2-135M has
  # 9 q heads and 3 KV heads; at TP=2 rank 0 holds KV heads 0-1 with q heads 0-5 and rank 1 KV
  # head 2 with q heads 6-8 (whole groups: a 5 + 4 q-head split would give a rank q heads of two
  # groups in unequal numbers, which no GQA kernel maps). At TP=3: one KV head, 3 q heads each.
- MLP / expert / shared-expert intermediate sizes (`even_range`), uneven allowed;
- the vocabulary (`vocab_range`): equal pieces of ceil(V / tp) rows (the last may be shorter), so
  that the logits' all-gather needs no per-rank sizes unless V % tp != 0.

`local_config(config, state)` is the config with this rank's head counts and intermediate sizes
(the vocabulary stays whole: the embedding and LM head shard it themselves); modules built from
it have local shapes, and the loader's row offsets into fused matrices follow. `checkpoint_shard`
says which rows / columns of a checkpoint tensor (by Hugging Face name) the rank loads.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

import torch

from radixlm.runtime.distributed.state import ParallelState
from radixlm.runtime.models.config import ModelConfig


class HeadSplit(NamedTuple):
    q_start: int
    q_heads: int
    kv_start: int
    kv_heads: int


class Shard(NamedTuple):
    """The rank's piece of a checkpoint tensor: `ranges` ((start, stop) along `dim`) concatenated."""

    dim: int
    ranges: tuple[tuple[int, int], ...]

    def shape(self, full: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
        out = list(full)
        out[self.dim] = sum(b - a for a, b in self.ranges)
        return tuple(out)

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        """This piece of a full tensor, as a new contiguous tensor (the full one can be freed)."""
        parts = [tensor.narrow(self.dim, a, b - a) for a, b in self.ranges]
        return (parts[0] if len(parts) == 1 else torch.cat(parts, self.dim)).contiguous().clone()


def even_range(n: int, tp: int, rank: int) -> tuple[int, int]:
    """Rank `rank`'s (start, stop) of n items split into tp contiguous parts differing by <= 1."""
    base, extra = divmod(n, tp)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def vocab_range(vocab: int, tp: int, rank: int) -> tuple[int, int]:
    per = -(-vocab // tp)
    return min(rank * per, vocab), min((rank + 1) * per, vocab)


def vocab_sizes(vocab: int, tp: int) -> list[int] | None:
    """Each rank's vocabulary rows, or None when they are all equal."""
    sizes = [b - a for a, b in (vocab_range(vocab, tp, r) for r in range(tp))]
    return None if len(set(sizes)) == 1 else sizes


def head_split(num_heads: int, num_kv_heads: int, tp: int, rank: int) -> HeadSplit:
    """This rank's q and KV heads (see the module docstring); raises ValueError where a rank
    would get no q head."""
    group = num_heads // num_kv_heads
    if num_heads % num_kv_heads or tp > num_heads:
        raise ValueError(
            f"tensor parallelism over {tp} ranks cannot split {num_heads} attention heads "
            f"({num_kv_heads} KV heads)"
        )
    if num_kv_heads >= tp:
        k0, k1 = even_range(num_kv_heads, tp, rank)
        return HeadSplit(k0 * group, (k1 - k0) * group, k0, k1 - k0)
    # fewer KV heads than ranks: KV head k is held by the ranks even_range(tp, kv, k) covers
    kv = next(k for k in range(num_kv_heads) if rank < even_range(tp, num_kv_heads, k)[1])
    r0, r1 = even_range(tp, num_kv_heads, kv)
    # NOTE: r1 - r0 <= ceil(tp / kv) <= group, as tp <= num_heads: every rank gets a q head
    q0, q1 = even_range(group, r1 - r0, rank - r0)
    return HeadSplit(kv * group + q0, q1 - q0, kv, 1)


def check_tp_size(config: ModelConfig, tp: int) -> None:
    """Raise ValueError (naming the model's heads) unless every one of `tp` ranks gets a regular
    share of the attention heads: for the launcher, before any rank starts."""
    for rank in range(tp):
        head_split(config.num_attention_heads, config.num_key_value_heads, tp, rank)


def local_config(config: ModelConfig, state: ParallelState) -> ModelConfig:
    """`config` with this rank's head counts and intermediate sizes (itself at TP=1)."""
    if not state.is_parallel:
        return config
    tp, r = state.tp_size, state.tp_rank
    heads = head_split(config.num_attention_heads, config.num_key_value_heads, tp, r)

    def size(n: int) -> int:
        a, b = even_range(n, tp, r)
        return b - a

    return dataclasses.replace(
        config,
        num_attention_heads=heads.q_heads,
        num_key_value_heads=heads.kv_heads,
        intermediate_size=size(config.intermediate_size),
        moe_intermediate_size=size(config.moe_intermediate_size),
        shared_expert_intermediate_size=size(config.shared_expert_intermediate_size),
    )


# ---- checkpoint tensors ------------------------------------------------------------------------
# (pattern on the name's end, what it is); `weight_scale` (FP8) follows its weight's rows.
_TENSOR = r"\.(?P<attr>weight|bias|weight_scale)$"
_RULES = [
    (re.compile(p + _TENSOR), kind)
    for p, kind in (
        (r"self_attn\.q_proj", "q"),
        (r"self_attn\.(?:k_proj|v_proj)", "kv"),
        (r"self_attn\.qkv_proj", "qkv"),  # fused in the checkpoint (Phi-3)
        (r"self_attn\.o_proj", "o"),
        (r"(?:experts\.\d+\.(?:gate_proj|up_proj|w1|w3))", "moe_col"),
        (r"(?:experts\.\d+\.(?:down_proj|w2))", "moe_row"),
        (r"shared_expert\.(?:gate_proj|up_proj)", "shared_col"),
        (r"shared_expert\.down_proj", "shared_row"),
        (r"mlp\.(?:gate_proj|up_proj)", "mlp_col"),
        (r"mlp\.gate_up_proj", "mlp_fused"),  # fused in the checkpoint (Phi-3)
        (r"mlp\.down_proj", "mlp_row"),
        (r"(?:embed_tokens|lm_head)", "vocab"),
    )
]
_SKIP = ("vision_tower.", "multi_modal_projector.")  # image-text checkpoints: dropped at load


def checkpoint_shard(
    name: str, shape: tuple[int, ...], config: ModelConfig, state: ParallelState
) -> Shard | None:
    """The piece of checkpoint tensor `name` (of `shape`, `config` the FULL model's) that this
    rank loads; None: the whole tensor (replicated: norms, routers, scalar scales, ...)."""
    if not state.is_parallel or len(shape) == 0 or any(s in name for s in _SKIP):
        return None
    kind, attr = None, ""
    for pattern, k in _RULES:
        m = pattern.search(name)
        if m is not None:
            kind, attr = k, m["attr"]
            break
    if kind is None or (attr == "weight_scale" and (len(shape) == 0 or shape[0] == 1)):
        return None  # replicated, or a per-tensor FP8 scale
    tp, r = state.tp_size, state.tp_rank
    heads = head_split(config.num_attention_heads, config.num_key_value_heads, tp, r)
    d = config.head_dim
    q = (heads.q_start * d, (heads.q_start + heads.q_heads) * d)
    kv = (heads.kv_start * d, (heads.kv_start + heads.kv_heads) * d)
    rows_only = attr != "weight"  # biases and per-row scales of column-parallel weights
    if kind == "vocab":
        return Shard(0, (vocab_range(config.vocab_size, tp, r),))
    if kind == "q":
        return Shard(0, (q,))
    if kind == "kv":
        return Shard(0, (kv,))
    if kind == "qkv":
        qs, ks = config.q_size, config.kv_size
        return Shard(0, (q, (qs + kv[0], qs + kv[1]), (qs + ks + kv[0], qs + ks + kv[1])))
    sizes = {
        "mlp": config.intermediate_size,
        "moe": config.moe_intermediate_size,
        "shared": config.shared_expert_intermediate_size,
    }
    if kind == "o":
        return None if rows_only else Shard(1, (q,))
    group, _, part = kind.partition("_")
    a, b = even_range(sizes[group], tp, r)
    if part == "row":  # row-parallel (input columns split); its rows, scales included, whole
        return None if rows_only else Shard(1, ((a, b),))
    if part == "fused":  # [gate; up] stacked
        n = sizes[group]
        return Shard(0, ((a, b), (n + a, n + b)))
    return Shard(0, ((a, b),))
