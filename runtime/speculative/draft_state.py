"""What a draft-model proposer keeps per request: its rows in the draft's `req_to_token`, the
draft KV it holds, and (EAGLE) the target features not yet run through the head.

Draft rows: row p (a draft KV slot) is the draft model's forward at sequence position p. Its input
token is `fill_ids[p + shift]`: shift 0 for a STANDALONE draft (a causal LM over the same tokens),
1 for an EAGLE head, whose row p pairs the target's feature at p with the token after it. The draft
holds rows `start .. start + n - 1` (`start` > 0 when an EAGLE head got no features for a cached
prefix: those positions are outside its context); index i of its `req_to_token` rows is position
`start + i`, and the rotary position is the true one.

`rows`: `topk` rows of the draft's `req_to_token` (one per branch of a tree draft); each holds the
committed slots at indices `0 .. n - 1`, and a draft step writes its branch's tree nodes after them.
Ownership: the proposer (draft_worker.py) allocates and frees everything here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ReqDraftState:
    start: int  # the position of draft row 0
    rows: list[int] = field(default_factory=list)  # draft req_to_token rows (empty: none yet)
    tokens: list[int] = field(default_factory=list)  # the input token of each held row
    slots: list[torch.Tensor] = field(default_factory=list)  # their draft KV slots, in order
    features: list[torch.Tensor] = field(default_factory=list)  # EAGLE: target rows, not yet run
    # STANDALONE, between a proposal and its verify step: tree node -> (draft slot, token) of the
    # proposed nodes whose draft KV was computed (kept if the node is accepted, else freed)
    held: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return len(self.tokens)

    @property
    def next_position(self) -> int:
        """The position of the first row not held."""
        return self.start + len(self.tokens)

    @property
    def num_features(self) -> int:
        return sum(int(f.shape[0]) for f in self.features)

    def take_features(self, n: int) -> torch.Tensor:
        """The first `n` pending target features, removed from the queue."""
        feats = torch.cat(self.features) if len(self.features) > 1 else self.features[0]
        rest = feats[n:]
        self.features = [rest] if rest.shape[0] else []
        return feats[:n]

    def take_held(self) -> list[int]:
        """The held nodes' slots, no longer held (to free)."""
        slots = [slot for slot, _ in self.held.values()]
        self.held = {}
        return slots

    def all_slots(self) -> torch.Tensor:
        if not self.slots:
            return torch.empty(0, dtype=torch.int64)
        return torch.cat(self.slots) if len(self.slots) > 1 else self.slots[0]

    def truncate(self, keep: int) -> torch.Tensor:
        """Keep the first `keep` rows; returns the slots of the dropped ones (to free)."""
        slots = self.all_slots()
        self.tokens = self.tokens[:keep]
        self.slots = [slots[:keep]] if keep else []
        return slots[keep:]
