"""The lock-step protocol between rank 0 (the leader: it runs the scheduler) and the other ranks
of a tensor-parallel group (followers: they hold their shard of the model, a KV pool and a
`req_to_token` table, and decide nothing).

Rank 0 broadcasts one message per model-runner call (leader.py sends, follower.py receives): a
header of `HEADER_LEN` int64 and the host-side ints (lengths, the journal's rows) over the gloo
control group (`ParallelState.cpu_group`: a follower reads them without waiting for its device),
then one flat int64 payload of device data (slots, input ids, decode inputs) over the group
itself (NCCL on GPU: the GPU-side decode inputs of the overlapped schedule are never read back).
On the CPU both go over the one gloo group.

    FORWARD  header (mode, B, T, L, J, S); host ints: the journal of rank 0's `req_to_token`
             writes since the last message that carried them (J rows, J starts, J lengths), then
               EXTEND: B prefix lens, B extend lens, L logits rows (L = -1: none, every row);
               DECODE: B seq lens;
             device payload: the batch, then the journal's S slots:
               EXTEND: B req_pool_indices, T input ids, T out_cache_loc;
               DECODE: the five decode input rows `[5, B]` (kernels/decode_inputs.py); the
                       follower then computes the logits of every row (a decode step's one
                       `compute_logits` call: rank 0 sends no LOGITS message for it).
    LOGITS   header (kind, a, b): logits of the last forward's rows [a, b) (kind RANGE) or of
             b row indices sent as the device payload (kind ROWS); the logits' all-gather is a
             collective every rank must join.
    VERIFY   a speculative tree verify step (runtime/speculative/tree.py): header (B, N, J, S);
             host ints: the journal (as FORWARD), then B prefix lens; device payload:
             B req_pool_indices, B*N input ids, B*N draft slots, B*N positions, the packed
             tree mask `[B, N, W]` (int32 words widened to int64), then the journal's S slots.
             The follower builds the same batch with `verify_forward_batch`; the logits follow
             as a LOGITS message (rank 0's acceptance decides alone: every accept / reject,
             every freed slot is rank 0's, and the commit's table writes reach the followers
             in the next message's journal).
    CAPTURE  header (on, K); host ints: K layer indices: `set_hidden_capture` (a draft head's
             target capture, or None when `on` is 0) on every rank, so that every rank runs
             the same layer path (the capturing path cuts no rows: the collectives' shapes
             must match).
    GATHER_VOCAB  every rank's vocabulary rows of the embedding and LM head, all-gathered to
             rank 0's draft head (head_parts.py); the followers drop theirs.
    IDLE     keep-alive while rank 0 has nothing to run (a follower's wait is a collective,
             bounded by the process group's timeout).
    CHECK    header (J, S); the journal (as FORWARD: a verify step's commit writes the table
             after its forward), replayed, then every rank's `table_digest`, all-gathered:
             rank 0 compares them.
Followers end with the group (group.py's watchdog): rank 0 stopping in order, or any failure.

# NOTE (the lock-step invariant): at every forward, a follower's `req_to_token` table equals
# rank 0's: rank 0's `JournaledReqToTokenPool` records every `write` in order and the next
# FORWARD replays them before the batch; the decode kernel's writes (`req_to_token[row, pos] =
# slot`) are replayed from the decode inputs. Slots and rows come from rank 0's allocators only:
# a follower allocates and frees nothing, so no KV accounting exists on it that could drift, and
# its KV pool holds its heads of exactly the tokens rank 0's pool holds, at the same slots.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import torch

HEADER_LEN = 8


class Op(IntEnum):
    FORWARD = 1
    LOGITS = 2
    IDLE = 3
    CHECK = 4
    VERIFY = 5
    CAPTURE = 6
    GATHER_VOCAB = 7


class LogitsKind(IntEnum):
    RANGE = 0
    ROWS = 1


class Journal(NamedTuple):
    """`req_to_token` writes: `table[rows[i], starts[i] : starts[i] + lens[i]] = slots[...]`, the
    slots of all writes concatenated in order."""

    rows: list[int]
    starts: list[int]
    lens: list[int]
    slots: list[torch.Tensor]

    @classmethod
    def empty(cls) -> Journal:
        return cls([], [], [], [])

    def replay(self, table: torch.Tensor, flat_slots: torch.Tensor) -> None:
        offset = 0
        for row, start, n in zip(self.rows, self.starts, self.lens):
            table[row, start : start + n] = flat_slots[offset : offset + n].to(table.dtype)
            offset += n


def header(op: Op, *fields: int) -> list[int]:
    values = [int(op), *fields]
    assert len(values) <= HEADER_LEN
    return values + [0] * (HEADER_LEN - len(values))


def table_digest(table: torch.Tensor) -> torch.Tensor:
    """A position-weighted checksum of a `req_to_token` table (int64 `[2]`): equal tables give
    equal digests; a slot moved to another cell changes them."""
    flat = table.reshape(-1).to(torch.int64)
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.int64, device=flat.device)
    return torch.stack([flat.sum(), (flat * weights).sum()])
