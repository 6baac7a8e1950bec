"""`StepCosts`: what a decode step costs, plain or verifying, as a function of its rows (the
speculative step's cost model; gate.py decides with it).

The runner's steps are timed online (wall time of the whole step: drafting, forward, acceptance,
commit), so the model fits whatever device runs them: on a CPU a verify row costs almost a decode
row (compute-bound at small batch), on a GPU almost nothing (bandwidth-bound). Per kind of step
(plain, verify) and row count, a moving average of the measured seconds; a row count not measured
yet (the first step of each is not kept: one-time costs) is estimated from the measured ones (a least-squares line through the verify points; before
two distinct counts are measured, priors relative to the plain step: `PRIOR_ROW` per extra row,
and a verify step of r rows costing a plain step of r rows: optimistic, so that a first verify
step runs and is measured).

Without `measure` (tensor-parallel ranks, which must all take the same decisions) nothing is
recorded and the priors alone decide: deterministic.

Ownership: the draft gate owns it; scheduler thread only.
"""

from __future__ import annotations

EMA = 0.2  # weight of the newest measurement
PRIOR_PLAIN = 1.0  # the unit before any step is timed
PRIOR_ROW = 0.2  # a verify step's cost per extra row, in plain steps


class StepCosts:
    def __init__(self, measure: bool = True) -> None:
        self.measure = measure
        self.seconds: dict[tuple[bool, int], float] = {}  # (verify?, rows) -> moving average
        self.seen: set[tuple[bool, int]] = set()  # shapes stepped once (their first not kept)

    def record(self, verify: bool, rows: int, seconds: float) -> None:
        """A step of `rows` rows (plain: one per request; verify: the real tree nodes) took
        `seconds`."""
        if not self.measure:
            return
        key = (verify, rows)
        if key not in self.seen:  # NOTE: a first step of a shape pays one-time costs (scratch)
            self.seen.add(key)
            return
        old = self.seconds.get(key)
        self.seconds[key] = seconds if old is None else old + EMA * (seconds - old)

    def plain(self, rows: int) -> float:
        """Seconds of a plain decode step of `rows` requests."""
        got = self.seconds.get((False, rows))
        if got is not None:
            return got
        points = [(r, s) for (v, r), s in self.seconds.items() if not v]
        if not points:
            return PRIOR_PLAIN * (1.0 + PRIOR_ROW * (rows - 1))
        r0, s0 = min(points, key=lambda p: abs(p[0] - rows))
        return s0 * (1.0 + PRIOR_ROW * (rows - 1)) / (1.0 + PRIOR_ROW * (r0 - 1))

    def verify(self, rows: int) -> float:
        """Seconds of a verify step over `rows` real tree nodes (roots included)."""
        got = self.seconds.get((True, rows))
        if got is not None:
            return got
        points = sorted((r, s) for (v, r), s in self.seconds.items() if v)
        unit = self.plain(1)
        if len(points) >= 2:
            slope, icpt = _line(points)
            return max(icpt + max(slope, 0.0) * rows, unit * 0.5)
        if len(points) == 1:
            r0, s0 = points[0]
            return max(s0 + PRIOR_ROW * unit * (rows - r0), unit * 0.5)
        return self.plain(rows)


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of seconds over rows."""
    n = len(points)
    mx = sum(r for r, _ in points) / n
    my = sum(s for _, s in points) / n
    var = sum((r - mx) ** 2 for r, _ in points)
    slope = sum((r - mx) * (s - my) for r, s in points) / var if var > 0 else 0.0
    return slope, my - slope * mx
