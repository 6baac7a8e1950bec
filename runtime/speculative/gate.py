"""`DraftGate`: which requests get a draft verified this step (the others decode one token).

A verify row costs at least a decode row, and on CPU a verify forward (the extend path over
k + 1 rows) costs more than the fused decode step: a draft that is rarely accepted slows a
request down. Per request, a step whose draft had fewer than `min_accepted` tokens accepted
doubles its back-off (1, 2, 4, ... up to `MAX_BACKOFF` plain steps before the next draft); a step
with at least that many resets it. With `adaptive`, `min_accepted` follows the measured cost of a
verify step over a plain one (moving averages of their wall times: a draft must add at least
the extra steps' worth of tokens). Exactness never depends on the gate (any subset of drafts is
exact); without `adaptive` the path taken is deterministic too.

Ownership: the speculative step owns it; state per request id, dropped by `release`.
"""

from __future__ import annotations

import math

MAX_BACKOFF = 32
EMA = 0.1  # weight of the newest step time in the moving averages


class DraftGate:
    def __init__(self, min_accepted: int, adaptive: bool = False) -> None:
        self.min_accepted = min_accepted  # 0: every draft is verified
        self.adaptive = adaptive
        self.seconds: dict[bool, float] = {}  # verify? -> moving average of a step's wall time
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

    def record(self, verify: bool, seconds: float) -> None:
        """A plain (False) or verify (True) step took `seconds`; with `adaptive`, re-derive
        `min_accepted` = ceil(verify / plain - 1), at least 1."""
        old = self.seconds.get(verify)
        self.seconds[verify] = seconds if old is None else old + EMA * (seconds - old)
        if self.adaptive and len(self.seconds) == 2:
            ratio = self.seconds[True] / max(self.seconds[False], 1e-9)
            self.min_accepted = max(1, math.ceil(ratio - 1.0))

    def release(self, rid: str) -> None:
        self.backoff.pop(rid, None)
        self.wait.pop(rid, None)
