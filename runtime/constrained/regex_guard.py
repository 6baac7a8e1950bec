"""A bound on the automaton a user regex compiles to, checked before the request is admitted.

Why: a regex such as `(a|b)*a(a|b){40}` (exponentially many DFA states) or `[a-z]{1000000}`
(a million) is valid syntax, but compiling it to a token FSM never finishes; the grammar
compile timeout then answers 400, yet the compile keeps running on its worker thread (threads
cannot be killed), holding CPU and growing memory, and two of them occupy every compile worker.
So the tokenizer manager rejects such patterns up front, in milliseconds, with a 400 naming the
bound.

How: the pattern is parsed by Python's `re` parser into a Glushkov automaton (one position per
character-set occurrence, counted repetitions expanded), whose subset construction (the DFA) is
run over the character classes the pattern distinguishes, with budgets on positions, DFA
states and steps. The estimate is of the character-level DFA; outlines-core's FSM has the same
states up to byte-level splitting, so a pattern within the bounds compiles in reasonable time.
`\\w`, `\\d`, `\\s` are approximated (ASCII classes plus one class for the rest of Unicode), and
flags are ignored: this bounds the size, it does not decide the language.

Threading: pure functions, results cached (LRU); runs on the caller's thread.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

try:  # Python >= 3.11
    import re._constants as sre_c
    import re._parser as sre_parse
except ImportError:  # pragma: no cover
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

from radixlm.runtime.errors import GrammarError

MAX_POSITIONS = 10_000  # character-set occurrences after expanding counted repetitions
# NOTE: outlines-core needs ~10 ms per state of a narrow pattern on the 49k SmolLM2 vocabulary
# (`[a-z ]{0,1000}`: 12 s, `(a|b)*a(a|b){11}`, 2048 states: 23 s on the 2-core CI machine), so
# anything over this bound would run into the default 30 s grammar_compile_timeout anyway.
MAX_DFA_STATES = 2_000
MAX_STEPS = 1_000_000  # (state, position) pairs visited by the subset construction
_TOP = 0x110000
_NL = ((10, 10),)
_CATEGORIES: dict[object, tuple[tuple[int, int], ...]] = {
    sre_c.CATEGORY_DIGIT: ((48, 57),),
    sre_c.CATEGORY_SPACE: ((9, 13), (32, 32)),
    sre_c.CATEGORY_WORD: ((48, 57), (65, 90), (95, 95), (97, 122), (128, _TOP - 1)),
    sre_c.CATEGORY_LINEBREAK: _NL,
}
_NEGATED = {
    sre_c.CATEGORY_NOT_DIGIT: sre_c.CATEGORY_DIGIT,
    sre_c.CATEGORY_NOT_SPACE: sre_c.CATEGORY_SPACE,
    sre_c.CATEGORY_NOT_WORD: sre_c.CATEGORY_WORD,
    sre_c.CATEGORY_NOT_LINEBREAK: sre_c.CATEGORY_LINEBREAK,
}
_REPEATS = {sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)}


class _TooComplex(Exception):
    pass


@dataclass(frozen=True)
class _Frag:
    """A Glushkov fragment: does it match the empty string, its first and last positions."""

    nullable: bool
    first: frozenset[int]
    last: frozenset[int]


_EMPTY = _Frag(True, frozenset(), frozenset())


class _Glushkov:
    def __init__(self) -> None:
        self.sets: list[tuple[tuple[int, int], ...]] = []  # per position: sorted char ranges
        self.follow: list[set[int]] = []

    def atom(self, ranges: tuple[tuple[int, int], ...], negated: bool = False) -> _Frag:
        if len(self.sets) >= MAX_POSITIONS:
            raise _TooComplex(f"more than {MAX_POSITIONS} character positions")
        self.sets.append(_complement(ranges) if negated else _normalize(ranges))
        self.follow.append(set())
        pos = frozenset({len(self.sets) - 1})
        return _Frag(False, pos, pos)

    def concat(self, a: _Frag, b: _Frag) -> _Frag:
        for p in a.last:
            self.follow[p] |= b.first
        return _Frag(
            a.nullable and b.nullable,
            a.first | b.first if a.nullable else a.first,
            a.last | b.last if b.nullable else b.last,
        )

    def star(self, a: _Frag) -> _Frag:
        for p in a.last:
            self.follow[p] |= a.first
        return _Frag(True, a.first, a.last)

    def walk(self, items: list) -> _Frag:
        frag = _EMPTY
        for op, av in items:
            frag = self.concat(frag, self.node(op, av))
        return frag

    def node(self, op: object, av: object) -> _Frag:
        if op is sre_c.LITERAL:
            return self.atom(((av, av),))  # type: ignore[arg-type]
        if op is sre_c.NOT_LITERAL:
            return self.atom(((av, av),), negated=True)  # type: ignore[arg-type]
        if op is sre_c.ANY:
            return self.atom(_NL, negated=True)
        if op is sre_c.IN:
            return self._charset(av)  # type: ignore[arg-type]
        if op is sre_c.BRANCH:
            frags = [self.walk(list(alt)) for alt in av[1]]  # type: ignore[index]
            return _Frag(
                any(f.nullable for f in frags),
                frozenset().union(*(f.first for f in frags)),
                frozenset().union(*(f.last for f in frags)),
            )
        if op is sre_c.SUBPATTERN:
            return self.walk(list(av[-1]))  # type: ignore[index]
        if op is getattr(sre_c, "ATOMIC_GROUP", None):
            return self.walk(list(av))  # type: ignore[arg-type]
        if op in _REPEATS:
            lo, hi, body = av  # type: ignore[misc]
            return self._repeat(lo, hi, list(body))
        return _EMPTY  # anchors (and constructs check_regex already rejected)

    def _repeat(self, lo: int, hi: int, body: list) -> _Frag:
        frag = _EMPTY
        for _ in range(lo):
            frag = self.concat(frag, self.walk(body))
        if hi == sre_c.MAXREPEAT:
            return self.concat(frag, self.star(self.walk(body)))
        # NOTE: x{0,k} as (x(x(x)?)?)?, not x?x?x?: the same language with small DFA subsets,
        # linked in one pass (building it by nested unions would cost O(k^2)). Copies that match
        # the empty string are linked as if they did not: an estimate, not a decision.
        copies = [self.walk(body) for _ in range(hi - lo)]
        if not copies:
            return frag
        for a, b in itertools.pairwise(copies):
            for p in a.last:
                self.follow[p] |= b.first
        last = frozenset().union(*(c.last for c in copies))
        return self.concat(frag, _Frag(True, copies[0].first, last))

    def _charset(self, items: list) -> _Frag:
        ranges: list[tuple[int, int]] = []
        negated = False
        for op, av in items:
            if op is sre_c.NEGATE:
                negated = True
            elif op is sre_c.LITERAL:
                ranges.append((av, av))
            elif op is sre_c.RANGE:
                ranges.append(av)
            elif op is sre_c.CATEGORY:
                if av in _NEGATED:
                    ranges.extend(_complement(_CATEGORIES[_NEGATED[av]]))
                else:
                    ranges.extend(_CATEGORIES.get(av, ((0, _TOP - 1),)))
        return self.atom(tuple(ranges), negated)


def _normalize(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out, start = [], 0
    for lo, hi in _normalize(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start < _TOP:
        out.append((start, _TOP - 1))
    return tuple(out)


def _positions(items: list) -> int:
    """How many positions the Glushkov automaton of `items` has (counted repetitions expanded),
    computed on the parse tree: `[a-z]{1000000}` is refused before anything is built."""
    total = 0
    for op, av in items:
        if op in (sre_c.LITERAL, sre_c.NOT_LITERAL, sre_c.ANY, sre_c.IN):
            total += 1
        elif op is sre_c.BRANCH:
            total += sum(_positions(list(alt)) for alt in av[1])
        elif op is sre_c.SUBPATTERN:
            total += _positions(list(av[-1]))
        elif op is getattr(sre_c, "ATOMIC_GROUP", None):
            total += _positions(list(av))
        elif op in _REPEATS:
            lo, hi, body = av
            copies = lo + 1 if hi == sre_c.MAXREPEAT else hi
            total += copies * _positions(list(body))
        if total > MAX_POSITIONS:
            raise _TooComplex(f"more than {MAX_POSITIONS} character positions")
    return total


def dfa_size(pattern: str) -> int:
    """The number of states of the pattern's character-level DFA; raises _TooComplex beyond the
    budgets."""
    items = list(sre_parse.parse(pattern))
    _positions(items)
    g = _Glushkov()
    root = g.walk(items)
    # The alphabet, split where any position's set starts or ends: one representative each.
    cuts = sorted({0} | {b for ranges in g.sets for lo, hi in ranges for b in (lo, hi + 1)})
    reps = [c for c in cuts if c < _TOP]
    accepts: list[list[int]] = []  # per position: the indices of the representatives it takes
    for ranges in g.sets:
        idx: list[int] = []
        for lo, hi in ranges:
            idx.extend(range(bisect.bisect_left(reps, lo), bisect.bisect_right(reps, hi)))
        accepts.append(idx)
    start = root.first
    seen = {start}
    todo = [start]
    steps = 0
    while todo:
        state = todo.pop()
        targets: dict[int, set[int]] = {}
        for p in state:
            steps += len(accepts[p]) + 1
            for r in accepts[p]:
                targets.setdefault(r, set()).update(g.follow[p])
        if steps > MAX_STEPS:
            raise _TooComplex(f"building its automaton takes more than {MAX_STEPS} steps")
        for nxt in {frozenset(t) for t in targets.values() if t}:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
                if len(seen) > MAX_DFA_STATES:
                    raise _TooComplex(f"its automaton has more than {MAX_DFA_STATES} states")
    return len(seen)


def check_regex_size(pattern: str, field: str = "regex") -> None:
    """Raise GrammarError (HTTP 400, naming `field`) when the pattern's automaton is too large
    to compile. Patterns `re` cannot parse are left to the constraint checks."""
    problem = _problem(pattern)
    if problem:
        shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
        raise GrammarError(f"{field} {shown!r} is too complex: {problem}", field)


def check_schema_patterns(schema_text: str) -> None:
    """`check_regex_size` on every `pattern` of a JSON schema (HTTP 400 naming json_schema).
    A schema that is not JSON is left to the schema checks."""
    try:
        schema = json.loads(schema_text)
    except (TypeError, ValueError):
        return
    from radixlm.runtime.constrained.regex_python import translate

    for pattern in _schema_patterns(schema):
        check_regex_size(pattern, "json_schema")
        try:
            # NOTE: the automaton is built from the JSON-escaped form (`.` becomes a class plus
            # some 30 escape sequences), which can be several times larger than the pattern's.
            escaped = translate(pattern, "json_schema", json_string=True)
        except GrammarError:
            continue  # refused by the constraint checks, which run first
        problem = _problem(escaped)
        if problem:
            shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
            raise GrammarError(
                f"json_schema {shown!r} is too complex once JSON-escaped: {problem}", "json_schema"
            )


def _schema_patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _schema_patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from _schema_patterns(item)


@functools.lru_cache(maxsize=1024)
def _problem(pattern: str) -> str:
    """'' when the pattern is within the bounds (cached: the verdict of a pattern never changes)."""
    try:
        dfa_size(pattern)
    except _TooComplex as exc:
        return str(exc)
    except (sre_c.error, RecursionError, OverflowError):
        pass
    return ""
