"""Tensor-parallel layers: what a rank's modules become at TP > 1 (runtime/models builds them only
when `parallel_state().is_parallel`; at TP=1 the plain `Linear` / `Embedding` are built instead).

- column-parallel (qkv, gate/up, experts' gate/up): a plain `Linear` with this rank's rows (the
  local config's shapes, sharding.py); no communication;
- `RowParallelLinear` (o, down): this rank's input columns, then ONE all-reduce of the output;
- `VocabParallelEmbedding`: this rank's vocabulary rows; ids outside them give zeros, then one
  all-reduce;
- `ParallelLMHead`: logits of this rank's vocabulary rows, then an all-gather to the full
  vocabulary on every rank (a tied head: `VocabParallelEmbedding.gather_logits`).

A MoE block sums its routed experts (each split along its intermediate size) and its shared
expert before ONE all-reduce (moe.py, qwen2_moe.py: `reduce=False` parts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.distributed.comm import all_gather, all_reduce
from radixlm.runtime.distributed.sharding import vocab_range, vocab_sizes
from radixlm.runtime.distributed.state import parallel_state
from radixlm.runtime.models.linear import Linear


def tp_active() -> bool:
    return parallel_state().is_parallel


class RowParallelLinear(Linear):
    """`y = all_reduce(x_r W_r^T)`: W_r this rank's input columns (no bias: it would be added
    tp times)."""

    def __init__(self, in_features: int, out_features: int, fused: bool = False) -> None:
        super().__init__(in_features, out_features, fused=fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(super().forward(x))

    def local_forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum (no communication: start-up kernel timing, gemm_select.py)."""
        return super().forward(x)


def row_linear(in_features: int, out_features: int, reduce: bool = True) -> Linear:
    """A row-parallel projection: `RowParallelLinear` at TP > 1, a plain `Linear` at TP=1 or
    with `reduce=False` (the caller all-reduces a sum of several partial outputs)."""
    if reduce and tp_active():
        return RowParallelLinear(in_features, out_features)
    return Linear(in_features, out_features)


class ParallelLMHead(Linear):
    """Logits of this rank's vocabulary rows, all-gathered to `[rows, vocab]` on every rank."""

    def __init__(self, hidden: int, vocab: int) -> None:
        state = parallel_state()
        start, end = vocab_range(vocab, state.tp_size, state.tp_rank)
        super().__init__(hidden, end - start, bias=False)
        self.vocab_start = start
        self.sizes = vocab_sizes(vocab, state.tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather(super().forward(x), -1, self.sizes)

    def local_forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class VocabParallelEmbedding(nn.Module):
    """This rank's rows `[vocab_start, vocab_end)` of the token embedding; `scale`: outputs times
    sqrt(hidden), rounded to the model dtype (Gemma)."""

    def __init__(self, vocab: int, dim: int, scale: bool = False) -> None:
        super().__init__()
        state = parallel_state()
        self.vocab_start, self.vocab_end = vocab_range(vocab, state.tp_size, state.tp_rank)
        self.sizes = vocab_sizes(vocab, state.tp_size)
        rows = self.vocab_end - self.vocab_start
        self.weight = nn.Parameter(torch.empty(rows, dim), requires_grad=False)
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        h = F.embedding(local.masked_fill(outside, 0), self.weight)
        h = all_reduce(h.masked_fill_(outside.unsqueeze(-1), 0))
        if self.scale:
            h = h * torch.tensor(self.weight.shape[1] ** 0.5, dtype=h.dtype)
        return h

    def gather_logits(self, local_logits: torch.Tensor) -> torch.Tensor:
        """A tied LM head: logits of this rank's rows -> the full vocabulary."""
        return all_gather(local_logits, -1, self.sizes)
