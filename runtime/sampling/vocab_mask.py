"""The grammar mask a `SamplingBatch` carries (`VocabMask`), read two ways by the sampler:

- `dense()`: the whole packed bitmask on the logits' device, where every constrained row is read
  (logprobs, the GPU's sampling);
- `refused(ids)` then `host_bits(rows)`: the CPU path takes each row's argmax or draw first and
  masks only the rows whose choice the grammar refuses (sampler.py `_sample_host`: the same
  tokens for greedy rows, the same distribution for sampled ones).

`DenseMask` is a bitmask that is already built (speculative verify rows); the scheduler's own is
`constrained/batch_mask.py`, which fills a row only when it is read.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch


class VocabMask(Protocol):
    def dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([B, W] int32 bitmask on the logits' device, the rows it applies to; None: all)."""
        ...

    def constrained_rows(self) -> list[int]:
        """The rows the mask applies to."""
        ...

    def refused(self, ids: np.ndarray) -> list[int]:
        """The constrained rows whose token `ids[i]` the mask refuses."""
        ...

    def host_bits(self, rows: list[int]) -> torch.Tensor:
        """A `[B, W]` int32 CPU bitmask whose `rows` are filled."""
        ...


class DenseMask:
    """A bitmask that is already built: `bits [B, W]` int32, applied to `rows` (None: all)."""

    def __init__(self, bits: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        self.bits = bits
        self.rows = rows

    def dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.bits, self.rows

    def constrained_rows(self) -> list[int]:
        return list(range(self.bits.shape[0])) if self.rows is None else self.rows.tolist()

    def refused(self, ids: np.ndarray) -> list[int]:
        from radixlm.kernels.token_bitmask_cpu import refused_rows

        return refused_rows(ids, self.bits, self.constrained_rows())

    def host_bits(self, rows: list[int]) -> torch.Tensor:
        return self.bits
