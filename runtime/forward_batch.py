"""`ForwardBatch`: the tensors of one model forward, built by the scheduler from its requests.

Tokens of all requests are flattened into one dimension T (no padding). For EXTEND, request b owns
rows `extend_start_loc[b] : extend_start_loc[b] + extend_seq_lens[b]` and already has
`extend_prefix_lens[b]` tokens in the KV pool; for DECODE every request owns exactly one row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch


class ForwardMode(IntEnum):
    EXTEND = 1
    DECODE = 2


@dataclass
class ForwardBatch:
    mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64: KV slots receiving the new tokens
    req_pool_indices: torch.Tensor  # [B] int64: rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64: tokens in the pool after this forward
    seq_lens_cpu: list[int]
    # EXTEND only (empty for DECODE)
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_seq_lens_cpu: list[int] = field(default_factory=list)
    extend_prefix_lens: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_start_loc: torch.Tensor | None = None
    # Rows of the hidden states whose logits are computed, in order.
    logits_indices: torch.Tensor | None = None
    # Filled by the attention backend in `init_forward_metadata` (backend-specific).
    attn_metadata: Any = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return self.mode == ForwardMode.DECODE
