"""`BatchMask`: one step's grammar bitmask over a batch, each row filled only when it is read
(the `VocabMask` of sampling/vocab_mask.py).

- `dense()` fills every constrained row (unconstrained rows allow everything) and moves the mask
  to the device: what logprobs and the GPU read.
- `refused(ids)` is the CPU path's question: does each row's grammar allow the model's own
  choice (its argmax, or its draw from the unmasked distribution)? A grammar that can check one
  token without its mask (`Grammar.allows`: every backend, except where llguidance forces bytes)
  answers directly; otherwise the row's mask is filled and its bit read. `host_bits(rows)` then
  fills the refused rows. Most steps of a constrained request never compute a mask.

Ownership: built per step by `GrammarManager.build_mask` on the scheduler loop thread, into the
manager's reused host buffer; it is dead once the next step builds its own. Time spent filling
and checking goes into the manager's `mask_s` stat.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from radixlm.kernels.token_bitmask_cpu import refused_rows
from radixlm.runtime.constrained.base import Grammar


class BatchMask:
    def __init__(
        self,
        grammars: list[Grammar | None],
        buf: torch.Tensor,  # [B, W] int32 host buffer (pinned when the device is a GPU)
        device: torch.device,
        stats: dict,
    ) -> None:
        self.grammars = grammars
        self.buf = buf
        self.device = device
        self.stats = stats
        self.rows = [i for i, g in enumerate(grammars) if g is not None]
        self.filled = [False] * len(grammars)

    def _fill(self, rows: list[int]) -> None:
        for i in rows:
            if not self.filled[i]:
                self.grammars[i].fill_mask(self.buf[i])  # type: ignore[union-attr]
                self.filled[i] = True
                self.stats["mask_rows"] += 1

    def dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        start = time.perf_counter()
        self._fill(self.rows)
        for i, g in enumerate(self.grammars):
            if g is None:
                self.buf[i].fill_(-1)
        mask = self.buf
        indices = None
        if len(self.rows) != len(self.grammars):
            indices = torch.tensor(self.rows, dtype=torch.int64)
        if self.device.type != "cpu":
            mask = mask.to(self.device, non_blocking=True)
            indices = None if indices is None else indices.to(self.device, non_blocking=True)
        self.stats["mask_s"] += time.perf_counter() - start
        return mask, indices

    def constrained_rows(self) -> list[int]:
        return self.rows

    def refused(self, ids: np.ndarray) -> list[int]:
        start = time.perf_counter()
        out = []
        for i in self.rows:
            ok = self.grammars[i].allows(int(ids[i]))  # type: ignore[union-attr]
            if ok is None:  # no cheap check: this row's mask, then its bit
                self._fill([i])
                ok = not refused_rows(ids, self.buf, [i])
            if not ok:
                out.append(i)
        self.stats["mask_s"] += time.perf_counter() - start
        return out

    def host_bits(self, rows: list[int]) -> torch.Tensor:
        start = time.perf_counter()
        self._fill(rows)
        self.stats["mask_s"] += time.perf_counter() - start
        return self.buf
