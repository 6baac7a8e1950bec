"""Ranks 1..N-1 of a tensor-parallel group: replay rank 0's runner calls (lockstep.py) on this
rank's `ModelRunner` for as long as the group runs.

A follower owns its runner (its shard of the model, its KV pool, its `req_to_token` table) and
nothing else: no scheduler, allocator decisions, sampler or sockets. It writes its table only
as rank 0's messages say (the journal, the decode inputs): see lockstep.py's invariant.
"""

from __future__ import annotations

import torch

from radixlm.runtime.distributed.comm import all_gather, broadcast, broadcast_host
from radixlm.runtime.distributed.head_parts import gather_vocab_weights
from radixlm.runtime.distributed.lockstep import (
    HEADER_LEN,
    Journal,
    LogitsKind,
    Op,
    table_digest,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.speculative.tree import TreeLayout, mask_words, verify_forward_batch


class Follower:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.device = runner.device
        self.table = runner.req_to_token.table
        self.hidden: torch.Tensor | None = None  # the last forward's output rows

    def recv_host(self, n: int) -> list[int]:
        if n == 0:
            return []
        return broadcast_host(torch.empty(n, dtype=torch.int64)).tolist()

    def recv_device(self, n: int) -> torch.Tensor:
        out = torch.empty(n, dtype=torch.int64, device=self.device)
        return broadcast(out) if n else out

    @torch.inference_mode()
    def run(self) -> None:
        """Follow rank 0 until the process ends (group.py's watchdog ends it when the group
        stops); raises on a broken message or a failed collective."""
        head = torch.empty(HEADER_LEN, dtype=torch.int64)
        while True:
            op, *fields = broadcast_host(head).tolist()
            if op == Op.FORWARD:
                self.forward(*fields[:6])
            elif op == Op.VERIFY:
                self.verify(*fields[:4])
            elif op == Op.CAPTURE:
                on, k = fields[:2]
                layers = self.recv_host(k)
                self.runner.set_hidden_capture(tuple(layers) if on else None)
            elif op == Op.GATHER_VOCAB:
                gather_vocab_weights(self.runner.model)
            elif op == Op.LOGITS:
                kind, a, b = fields[:3]
                rows = slice(a, b) if kind == LogitsKind.RANGE else self.recv_device(b)
                assert self.hidden is not None
                self.runner.compute_logits(self.hidden, rows)
            elif op == Op.CHECK:
                j, s = fields[:2]
                host = self.recv_host(3 * j)
                self.replay(host, self.recv_device(s))
                all_gather(table_digest(self.table).view(1, 2), dim=0)
            elif op != Op.IDLE:
                raise RuntimeError(f"tensor parallelism: unknown message {op} from rank 0")

    def forward(self, mode: int, b: int, t: int, n_logits: int, j: int, s: int) -> None:
        # NOTE: nothing here waits for the device: the host ints come over the control group,
        # so a GPU follower launches its step as soon as rank 0 has sent it.
        decode = mode == ForwardMode.DECODE
        host = self.recv_host(3 * j + (b if decode else 2 * b + max(n_logits, 0)))
        body_n = 5 * b if decode else b + 2 * t
        payload = self.recv_device(body_n + s)
        self.replay(host[: 3 * j], payload[body_n:])
        lists = host[3 * j :]
        body = payload[:body_n]
        if decode:
            self.hidden = self.run_forward(self.decode_batch(body.view(5, b), lists))
            self.runner.compute_logits(self.hidden)  # the decode step's implicit LOGITS
            return
        self.hidden = self.run_forward(
            self.extend_batch(body, lists[:b], lists[b : 2 * b], lists[2 * b :], n_logits >= 0)
        )

    def run_forward(self, batch: ForwardBatch) -> torch.Tensor:
        hidden = self.runner.forward(batch)
        # NOTE: with a draft head's capture on (CAPTURE), only rank 0's head reads the rows
        self.runner.take_hidden()
        return hidden

    def replay(self, host: list[int], slots: torch.Tensor) -> None:
        """Rank 0's `req_to_token` writes: `host` its J rows, J starts and J lengths."""
        j = len(host) // 3
        Journal(host[:j], host[j : 2 * j], host[2 * j :], []).replay(self.table, slots)

    def verify(self, b: int, n: int, j: int, s: int) -> None:
        """A tree verify step (lockstep.py's VERIFY), built by the function that built rank 0's."""
        host = self.recv_host(3 * j + b)
        w = mask_words(n)
        body_n = b + 3 * b * n + b * n * w
        payload = self.recv_device(body_n + s)
        self.replay(host[: 3 * j], payload[body_n:])
        rows, ids, loc, pos, mask = payload[:body_n].split([b, b * n, b * n, b * n, b * n * w])
        # NOTE: `verify_forward_batch` reads the layout's mask and positions only (not depths)
        layout = TreeLayout(mask.view(b, n, w).to(torch.int32), pos.view(b, n), pos.view(b, n))
        batch = verify_forward_batch(ids, rows, host[3 * j :], loc.view(b, n), layout)
        self.hidden = self.run_forward(batch)

    def decode_batch(self, cols: torch.Tensor, seq_lens: list[int]) -> ForwardBatch:
        """The decode inputs in this runner's input buffer (a CUDA graph's static inputs), and
        the decode kernel's table writes (`req_to_token[row, pos] = slot`)."""
        b = cols.shape[1]
        inputs = self.runner.decode_input_buffer(b)
        inputs.copy_(cols)
        ids, pos, loc, rows, lens = inputs[:, :b]
        self.table[rows, pos] = loc.to(self.table.dtype)
        return ForwardBatch(ForwardMode.DECODE, b, ids, pos, loc, rows, lens, seq_lens)

    def extend_batch(
        self,
        body: torch.Tensor,
        prefix_lens: list[int],
        extend_lens: list[int],
        logits_rows: list[int],
        has_logits_rows: bool,
    ) -> ForwardBatch:
        b = len(prefix_lens)
        t = (body.numel() - b) // 2
        return ForwardBatch.extend(
            body[b : b + t], body[b + t :], body[:b], prefix_lens, extend_lens,
            logits_rows if has_logits_rows else None,
        )  # fmt: skip
