"""`ForwardBatch`: the tensors of one model forward, built by the scheduler from its requests.

Tokens of all requests are flattened into one dimension T (no padding). For EXTEND, request b owns
rows `extend_start_loc[b] : extend_start_loc[b] + extend_seq_lens[b]` and already has
`extend_prefix_lens[b]` tokens in the KV pool; for DECODE every request owns exactly one row.
"""

from __future__ import annotations

import bisect
import itertools
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
    # Rows of the hidden states whose logits are computed, in order (None: every row), and the
    # same on the host (EXTEND).
    logits_indices: torch.Tensor | None = None
    logits_indices_cpu: list[int] | None = None
    # A speculative tree verify step (runtime/speculative/tree.py, `verify_forward_batch`): an
    # EXTEND batch of B requests x N draft nodes whose rows attend to the prefix plus their
    # ancestors only: the packed mask [B, N, ceil(N / 32)] int32 (None: an ordinary batch).
    tree_mask: torch.Tensor | None = None
    # A draft head's input features (runtime/models/eagle.py): one row per token (None: none).
    spec_features: torch.Tensor | None = None
    # Filled by the attention backend in `init_forward_metadata` (backend-specific).
    attn_metadata: Any = None

    @classmethod
    def extend(
        cls,
        input_ids: torch.Tensor,
        out_cache_loc: torch.Tensor,
        req_pool_indices: torch.Tensor,
        prefix_lens: list[int],
        extend_lens: list[int],
        logits_rows: list[int] | None,
        positions: torch.Tensor | None = None,
        spec_features: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """An EXTEND batch: request b adds `extend_lens[b]` tokens after the `prefix_lens[b]` it
        holds; `positions` default to `prefix_lens[b] + j` (the rotary positions of the new
        tokens); `logits_rows` None computes logits of every row."""
        device = input_ids.device

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens, strict=True)]
        if positions is None:
            positions = t([p + j for p, n in zip(prefix_lens, extend_lens) for j in range(n)])
        return cls(
            mode=ForwardMode.EXTEND,
            batch_size=len(prefix_lens),
            input_ids=input_ids,
            positions=positions,
            out_cache_loc=out_cache_loc,
            req_pool_indices=req_pool_indices,
            seq_lens=t(seq_lens),
            seq_lens_cpu=seq_lens,
            extend_prefix_lens_cpu=prefix_lens,
            extend_seq_lens_cpu=extend_lens,
            extend_prefix_lens=t(prefix_lens),
            extend_seq_lens=t(extend_lens),
            extend_start_loc=t(list(itertools.accumulate(extend_lens, initial=0))[:-1]),
            logits_indices=None if logits_rows is None else t(logits_rows),
            logits_indices_cpu=logits_rows,
            spec_features=spec_features,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return self.mode == ForwardMode.DECODE

    @property
    def last_layer_rows_only(self) -> bool:
        """An EXTEND batch with at most one logits row per request (no input logprobs): the last
        layer attends and runs its MLP for those rows only; every other row just stores its K/V
        (nothing downstream reads its output)."""
        rows = self.logits_indices_cpu
        return not self.is_decode and rows is not None and len(rows) <= self.batch_size

    def logits_rows_batch(self) -> ForwardBatch:
        """The EXTEND batch's logits rows as a DECODE batch: one query token each, of its own
        request, attending to its sequence up to and including itself (K/V already stored)."""
        assert self.logits_indices is not None and self.logits_indices_cpu is not None
        ends = list(itertools.accumulate(self.extend_seq_lens_cpu))
        owners, seq_lens = [], []
        for row in self.logits_indices_cpu:
            b = bisect.bisect_right(ends, row)
            start = ends[b] - self.extend_seq_lens_cpu[b]
            owners.append(b)
            seq_lens.append(self.extend_prefix_lens_cpu[b] + row - start + 1)
        device = self.input_ids.device
        seq = torch.tensor(seq_lens, dtype=torch.int64, device=device)
        rows = self.logits_indices
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            batch_size=len(seq_lens),
            input_ids=self.input_ids.index_select(0, rows),
            positions=seq - 1,
            out_cache_loc=self.out_cache_loc.index_select(0, rows),
            req_pool_indices=self.req_pool_indices.index_select(
                0, torch.tensor(owners, dtype=torch.int64, device=device)
            ),
            seq_lens=seq,
            seq_lens_cpu=seq_lens,
        )
