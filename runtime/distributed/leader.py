"""Rank 0 of a tensor-parallel group: a `ModelRunner` whose calls are broadcast to the followers
(the protocol and its invariant: lockstep.py).

The scheduler drives `LeaderModelRunner` exactly as it drives a plain runner; each `forward` and
`compute_logits` first sends the followers what they need to make the same call (the batch, the
journal of `req_to_token` writes, the logits rows). Only built at TP > 1: a TP=1 runner is the
plain `ModelRunner`, whose step path has no broadcast, no journal and no extra synchronisation.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from radixlm.runtime.distributed.comm import all_gather, broadcast, broadcast_host
from radixlm.runtime.distributed.head_parts import (
    check_head_target,
    gather_vocab_weights,
    head_parts,
)
from radixlm.runtime.distributed.lockstep import (
    Journal,
    LogitsKind,
    Op,
    header,
    table_digest,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.mem.kv_pool import ReqToTokenPool
from radixlm.runtime.models.loader import ModelSource
from radixlm.runtime.server_args import ServerArgs

IDLE_INTERVAL_S = 0.5  # keep-alives while idle, at most this often


class JournaledReqToTokenPool(ReqToTokenPool):
    """A `ReqToTokenPool` that records its writes until `take_journal` (rank 0 at TP > 1)."""

    def __init__(self, max_requests: int, max_context: int, device: torch.device | str) -> None:
        super().__init__(max_requests, max_context, device)
        self.journal = Journal.empty()

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        super().write(row, start, slots)
        j = self.journal
        j.rows.append(row)
        j.starts.append(start)
        j.lens.append(slots.numel())
        j.slots.append(slots.reshape(-1).to(torch.int64))

    def take_journal(self) -> Journal:
        journal, self.journal = self.journal, Journal.empty()
        return journal


class LeaderModelRunner(ModelRunner):
    req_to_token_cls = JournaledReqToTokenPool
    req_to_token: JournaledReqToTokenPool

    def __init__(self, args: ServerArgs, source: ModelSource) -> None:
        # NOTE: construction (CUDA graph capture, extend warm-up) runs the same forwards on
        # every rank by itself: nothing is broadcast until it is done.
        self._leading = False
        super().__init__(args, source)
        self._leading = True
        self.req_to_token.take_journal()  # start-up writes (warm-up) ran on every rank alike
        self._logits_all_pending = False  # a decode forward's implicit LOGITS of every row
        self._last_idle = 0.0

    # ---- sending -------------------------------------------------------------------------------
    def _send(
        self,
        head: list[int],
        host: list[int] | None = None,
        device: list[torch.Tensor] | None = None,
    ) -> None:
        """The header, then (when the header implies them) the host ints over the control group
        and the device tensors, concatenated, over the group (lockstep.py)."""
        broadcast_host(torch.tensor(head, dtype=torch.int64))
        if host:
            broadcast_host(torch.tensor(host, dtype=torch.int64))
        if device and sum(t.numel() for t in device):
            broadcast(torch.cat(device) if len(device) > 1 else device[0].contiguous())

    def _check_no_pending(self) -> None:
        if self._logits_all_pending:
            raise RuntimeError(
                "tensor parallelism: a decode forward must be followed by compute_logits of "
                "every row before any other runner call (the followers make that call)"
            )

    # ---- the runner's calls --------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if not self._leading:
            return super().forward(batch)
        self._check_no_pending()
        journal = self.req_to_token.take_journal()
        if batch.tree_mask is not None:
            self._send_verify(batch, journal)
            return super().forward(batch)
        b, t = batch.batch_size, batch.num_tokens
        host = [*journal.rows, *journal.starts, *journal.lens]
        if batch.mode == ForwardMode.DECODE:
            cols = [batch.input_ids, batch.positions, batch.out_cache_loc,
                    batch.req_pool_indices, batch.seq_lens]  # fmt: skip
            host += batch.seq_lens_cpu
            body = [torch.stack(cols).reshape(-1)]
            n_logits = -1
            self._logits_all_pending = True
        else:
            rows = batch.logits_indices_cpu
            n_logits = -1 if rows is None else len(rows)
            host += [*batch.extend_prefix_lens_cpu, *batch.extend_seq_lens_cpu, *(rows or [])]
            body = [batch.req_pool_indices, batch.input_ids, batch.out_cache_loc]
        head = header(Op.FORWARD, int(batch.mode), b, t, n_logits, len(journal.rows),
                      sum(journal.lens))  # fmt: skip
        self._send(head, host, [*body, *journal.slots])
        return super().forward(batch)

    def _send_verify(self, batch: ForwardBatch, journal: Journal) -> None:
        """A tree verify step (lockstep.py's VERIFY): the followers rebuild the same batch."""
        assert batch.tree_mask is not None
        b, n = batch.tree_mask.shape[:2]
        host = [*journal.rows, *journal.starts, *journal.lens, *batch.extend_prefix_lens_cpu]
        body = [batch.req_pool_indices, batch.input_ids, batch.out_cache_loc, batch.positions,
                batch.tree_mask.reshape(-1).to(torch.int64)]  # fmt: skip
        head = header(Op.VERIFY, b, n, len(journal.rows), sum(journal.lens))
        self._send(head, host, [*body, *journal.slots])

    @torch.inference_mode()
    def compute_logits(
        self, hidden: torch.Tensor, rows: slice | torch.Tensor | None = None
    ) -> torch.Tensor:
        if self._leading:
            self._announce_logits(hidden, rows)
        return super().compute_logits(hidden, rows)

    def _announce_logits(self, hidden: torch.Tensor, rows: slice | torch.Tensor | None) -> None:
        if self._logits_all_pending and rows is None:
            self._logits_all_pending = False  # the followers make this call by themselves
            return
        self._check_no_pending()
        if isinstance(rows, slice):
            start, stop, _ = rows.indices(hidden.shape[0])
            self._send(header(Op.LOGITS, LogitsKind.RANGE, start, stop))
        elif rows is None:
            self._send(header(Op.LOGITS, LogitsKind.RANGE, 0, hidden.shape[0]))
        else:
            self._send(header(Op.LOGITS, LogitsKind.ROWS, 0, rows.numel()), device=[rows])

    def set_hidden_capture(self, layers: tuple[int, ...] | None) -> None:
        """Every rank alike (lockstep.py's CAPTURE): the capturing path cuts no rows, so the
        layers' collectives keep their shapes only if every rank takes it."""
        if self._leading:
            self._check_no_pending()
        super().set_hidden_capture(layers)  # NOTE: raises before anything is sent
        if self._leading:
            on = layers is not None
            self._send(header(Op.CAPTURE, int(on), len(layers or ())), list(layers or ()))

    def whole_vocab_parts(self) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
        """Rank-0-local copies of the whole embedding and logits for a draft head
        (head_parts.py); raises InvalidRequestError, sending nothing, for a target it cannot
        serve."""
        check_head_target(self.model)
        self._check_no_pending()
        self._send(header(Op.GATHER_VOCAB))
        return head_parts(gather_vocab_weights(self.model))

    # ---- control -------------------------------------------------------------------------------
    def keep_alive(self) -> None:
        """Called by the scheduler loop when it has nothing to run."""
        now = time.monotonic()
        if now - self._last_idle >= IDLE_INTERVAL_S:
            self._last_idle = now
            self._send(header(Op.IDLE))

    def check_followers(self) -> None:
        """Raise AssertionError unless every rank's `req_to_token` table equals this one's."""
        self._check_no_pending()
        # NOTE: a verify step's commit writes the table after its forward: the journal goes too
        journal = self.req_to_token.take_journal()
        self._send(header(Op.CHECK, len(journal.rows), sum(journal.lens)),
                   [*journal.rows, *journal.starts, *journal.lens], journal.slots)  # fmt: skip
        digests = all_gather(table_digest(self.req_to_token.table).view(1, 2), dim=0)
        mine = digests[0]
        for rank, other in enumerate(digests.tolist()):
            if other != mine.tolist():
                raise AssertionError(
                    f"tensor-parallel rank {rank}'s req_to_token table differs from rank 0's"
                )
