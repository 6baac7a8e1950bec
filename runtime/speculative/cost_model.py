"""`StepCosts`: what a decode step costs, plain or verifying, as a function of its rows (the
speculative step's cost model; gate.py decides with it).

The runner's steps are timed online (wall time of the whole step: drafting, forward, acceptance,
commit), so the model fits whatever device runs them: on a CPU a verify row costs almost a decode
row (compute-bound at small batch), on a GPU almost nothing (bandwidth-bound). Per kind of step
(plain, verify) and row count, a moving average of the measured seconds (the first step of each
shape is not kept: one-time costs; it falls fast and rises slowly, since a shared machine's
noise only adds time, and a spike moves it at most 2x); verify steps are kept in units
of the plain step of one row as it was measured then, so that a machine whose load changes (the
plain steps keep being measured, the verify steps only when chosen) keeps their ratio. A verify step of any row count
is read off the least-squares line through the measured verify shapes, weighted by their samples
(it smooths a noisy machine's figures); before two shapes are measured, priors relative to the
plain step: `PRIOR_ROW` per extra row, and a verify step of r rows costing a plain step of r rows
(optimistic, so that a first verify step runs and is measured).

A verify shape is measured only when the gate chooses it, so a figure taken in a spike (another
process ran) could keep its shape from being chosen, hence measured, for good: a shape's first
kept figure is capped at `FIRST_CAP` times its prior, and a figure not measured for `STALE` plain
steps moves back towards its prior (when above it), so that the gate tries the shape again.

Without `measure` nothing is recorded and the priors alone decide: deterministic. (At tp_size
> 1 the gate runs on rank 0 alone, which decides for every rank: it measures as at TP=1.)

Ownership: the draft gate owns it; scheduler thread only.
"""

from __future__ import annotations

EMA = 0.2  # weight of the newest measurement when it is below the average
EMA_UP = 0.05  # ... above it (another process ran: a verify step measured in a spike would keep
# the gate from choosing, hence from measuring, that shape again)
MAX_WEIGHT = 20  # samples a shape counts for at most in the verify line's fit
PRIOR_PLAIN = 1.0  # the unit before any step is timed
PRIOR_ROW = 0.2  # a verify step's cost per extra row, in plain steps
FIRST_CAP = 2.0  # a shape's first kept verify figure: at most this many times its prior
STALE = 64  # plain steps after which a verify shape not measured again is stale
FORGET = 0.15  # ... and moves this fraction of the way to its prior (every FORGET_EVERY steps)
FORGET_EVERY = 16


class StepCosts:
    def __init__(self, measure: bool = True) -> None:
        self.measure = measure
        # (verify?, rows) -> moving average: plain steps in seconds, verify steps in plain steps
        # of one row measured at the time (a loaded machine slows both alike)
        self.seconds: dict[tuple[bool, int], float] = {}
        self.seen: set[tuple[bool, int]] = set()  # shapes stepped once (their first not kept)
        self.count: dict[tuple[bool, int], int] = {}  # samples kept per shape
        self._line: tuple[float, float] | None = None  # the verify line's fit, until a record
        self.plain_steps = 0  # plain steps recorded (the clock of `last`)
        self.last: dict[int, int] = {}  # verify rows -> `plain_steps` at its last record

    def record(self, verify: bool, rows: int, seconds: float) -> None:
        """A step of `rows` rows (plain: one per request; verify: the real tree nodes) took
        `seconds`."""
        if not self.measure:
            return
        key = (verify, rows)
        if key not in self.seen:  # NOTE: a first step of a shape pays one-time costs (scratch)
            self.seen.add(key)
            return
        if verify:
            if not any(not v for v, _ in self.seconds):
                return  # NOTE: no plain step measured yet: no unit
            seconds /= self.plain(1)
            self._line = None
            self.last[rows] = self.plain_steps
            if key not in self.seconds:  # NOTE: one spike must not keep a shape dear for good
                seconds = min(seconds, FIRST_CAP * _prior(rows))
        else:
            self.plain_steps += 1
            if self.plain_steps % FORGET_EVERY == 0:
                self.forget()
        old = self.seconds.get(key)
        if old is not None:  # NOTE: noise only adds time: falls fast, rises slowly, at most 2x
            weight = EMA if seconds < old else EMA_UP
            seconds = old + weight * (min(seconds, 2.0 * old) - old)
        self.seconds[key] = seconds
        self.count[key] = self.count.get(key, 0) + 1

    def forget(self) -> None:
        """Verify figures not measured for `STALE` plain steps move towards their prior when
        above it: a shape measured dear (in a spike of another process's load) is not chosen,
        hence not measured again; forgetting lets the gate try it again now and then."""
        for (v, rows), old in list(self.seconds.items()):
            prior = _prior(rows)
            if v and old > prior and self.plain_steps - self.last.get(rows, 0) >= STALE:
                self.seconds[(v, rows)] = old - FORGET * (old - prior)
                self._line = None

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

    def verify_curve(self, first: int, count: int) -> list[float]:
        """`verify(r)` for r = first .. first + count - 1 (one fit, one unit: the gate's
        per-step figures)."""
        if count <= 0:
            return []
        self.verify(first)  # NOTE: fits `_line` when two shapes are measured
        if self._line is None:
            return [self.verify(r) for r in range(first, first + count)]
        unit, (slope, icpt) = self.plain(1), self._line
        return [unit * max(icpt + slope * r, 0.5) for r in range(first, first + count)]

    def verify(self, rows: int) -> float:
        """Seconds of a verify step over `rows` real tree nodes (roots included): on the line
        fitted through every measured shape (weighted by samples) once two are measured."""
        unit = self.plain(1)
        if self._line is not None:
            slope, icpt = self._line
            return unit * max(icpt + slope * rows, 0.5)
        points = sorted((r, s, min(self.count[(v, r)], MAX_WEIGHT))
                        for (v, r), s in self.seconds.items() if v)  # fmt: skip
        if len(points) >= 2:
            self._line = slope, icpt = _line(points)
            return unit * max(icpt + slope * rows, 0.5)
        if len(points) == 1:
            r0, s0, _ = points[0]
            return unit * max(s0 + PRIOR_ROW * (rows - r0), 0.5)
        return self.plain(rows)


def _prior(rows: int) -> float:
    """A verify step of `rows` rows before any is measured, in plain steps of one row."""
    return 1.0 + PRIOR_ROW * (rows - 1)


def _line(points: list[tuple[int, float, int]]) -> tuple[float, float]:
    """Weighted least-squares (slope, intercept) of seconds over rows; points (rows, seconds,
    weight)."""
    total = sum(w for _, _, w in points)
    mx = sum(r * w for r, _, w in points) / total
    my = sum(s * w for _, s, w in points) / total
    var = sum(w * (r - mx) ** 2 for r, _, w in points)
    slope = sum(w * (r - mx) * (s - my) for r, s, w in points) / var if var > 0 else 0.0
    slope = max(slope, 0.0)  # NOTE: more rows never cost less: noise; then the mean, flat
    return slope, my - slope * mx
