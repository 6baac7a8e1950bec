"""The catch-up forward of a draft model (draft_worker.py): each request's committed rows the draft
has not run yet, ending with its frontier row (whose output is the root's draft distribution).

Rows of request i sit at draft indices `prefix .. prefix + n - 1` of its main branch row (the
slots written there by the planner, draft_worker.py) at positions `first ..` (rotary); only the
last row of each request gives an output. One row per request can run as a DECODE batch (the
one-call CPU decode, the draft's CUDA graphs); an EAGLE head's rows carry target features.
"""

from __future__ import annotations

import itertools

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.speculative.draft_state import ReqDraftState


class CatchupRows:
    """One request's rows in the catch-up forward."""

    def __init__(
        self, index: int, state: ReqDraftState, tokens: list[int], feats: torch.Tensor | None
    ) -> None:
        self.index = index  # in the proposal's batch
        self.state = state
        self.tokens = tokens
        self.feats = feats
        self.first = state.next_position  # position of the first new row
        self.prefix = state.num_rows  # rows already held


def catchup_batch(work: list[CatchupRows], device: torch.device, decode: bool) -> ForwardBatch:
    """The batch of `work`'s rows (the new slots are each state's last `slots` entry); `decode`:
    every request has one row and no features."""
    lens = [len(w.tokens) for w in work]
    prefix = [w.prefix for w in work]
    seq = [p + n for p, n in zip(prefix, lens)]
    t = lambda v: torch.tensor(v, dtype=torch.int64, device=device)  # noqa: E731
    loc = torch.cat([w.state.slots[-1] for w in work]).to(device)
    rows = t([w.state.rows[0] for w in work])
    if decode:
        positions = t([w.first for w in work])
        return ForwardBatch(ForwardMode.DECODE, len(work), t([w.tokens[0] for w in work]),
                            positions, loc, rows, t(seq), seq)  # fmt: skip
    last = [end - 1 for end in itertools.accumulate(lens)]
    return ForwardBatch.extend(
        t([tok for w in work for tok in w.tokens]), loc, rows, prefix, lens, last,
        positions=t([w.first + j for w, n in zip(work, lens) for j in range(n)]),
        spec_features=None if work[0].feats is None else torch.cat([w.feats for w in work]),
    )  # fmt: skip
