"""`DraftGate`: which requests get a draft verified this step (the others decode one token).

A verify row costs at least a decode row, and on CPU a verify forward (the extend path over
k + 1 rows) costs more than the fused decode step: a draft that is rarely accepted slows a
request down. Per request, a step whose draft had fewer than `min_accepted` tokens accepted
doubles its back-off (1, 2, 4, ... up to `MAX_BACKOFF` plain steps before the next draft); a step
with at least that many resets it. Deterministic (acceptance only, no timing), so a greedy run
takes the same path every time; exactness never depends on it (any subset of drafts is exact).

Ownership: the speculative step owns it; state per request id, dropped by `release`.
"""

from __future__ import annotations

MAX_BACKOFF = 32


class DraftGate:
    def __init__(self, min_accepted: int) -> None:
        self.min_accepted = min_accepted  # 0: every draft is verified
        self.backoff: dict[str, int] = {}  # rid -> plain steps after the last failed draft
        self.wait: dict[str, int] = {}  # rid -> plain steps left before the next draft

    def allows(self, rid: str) -> bool:
        """Whether `rid` may have a draft verified this step (counts a skipped step)."""
        left = self.wait.get(rid, 0)
        if left > 0:
            self.wait[rid] = left - 1
            return False
        return True

    def update(self, rid: str, drafted: int, accepted: int) -> None:
        """After a verify step in which `rid` had `drafted` draft tokens, `accepted` of them
        accepted."""
        if drafted == 0 or self.min_accepted == 0:
            return
        if accepted >= min(self.min_accepted, drafted):
            self.backoff.pop(rid, None)
            return
        back = min(2 * self.backoff.get(rid, 0) or 1, MAX_BACKOFF)
        self.backoff[rid] = back
        self.wait[rid] = back

    def release(self, rid: str) -> None:
        self.backoff.pop(rid, None)
        self.wait.pop(rid, None)
