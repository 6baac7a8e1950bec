"""Regexes for JSON integers and numbers within bounds (JSON schema `minimum`, `maximum`,
`exclusiveMinimum`, `exclusiveMaximum`), which outlines-core's schema converter ignores.

Pure functions, no state. Integers are written without leading zeros and without `-0` (the JSON
grammar's canonical forms); numbers have no exponent (so the value is the literal). Only
integer-valued bounds are supported for `number` (a decimal bound raises ValueError).
NOTE: every language here is finite-length on purpose: an unbounded side has at most
`MAX_DIGITS` digits and a fraction at most `MAX_FRACTION` digits, so a model that keeps emitting
digits ("0.000000...") is stopped by the FSM instead of running into max_new_tokens.
"""

from __future__ import annotations

import math

MAX_DIGITS = 18
MAX_FRACTION = 15
_FRACTION = rf"(\.[0-9]{{1,{MAX_FRACTION}}})?"
_ZERO_FRACTION = rf"(\.0{{1,{MAX_FRACTION}}})?"
_POSITIVE_FRACTION = rf"\.[0-9]{{0,{MAX_FRACTION - 1}}}[1-9]"  # > 0 (ends in a non-zero digit)


def _same_len(lo: str, hi: str) -> list[str]:
    """Patterns matching every digit string of len(lo) in [lo, hi] (lo <= hi, same length)."""
    if lo == hi:
        return [lo]
    if len(lo) == 1:
        return [f"[{lo}-{hi}]"]
    if lo[0] == hi[0]:
        return [lo[0] + p for p in _same_len(lo[1:], hi[1:])]
    rest = len(lo) - 1
    out: list[str] = []
    first, last = int(lo[0]), int(hi[0])
    if lo[1:] != "0" * rest:
        out += [lo[0] + p for p in _same_len(lo[1:], "9" * rest)]
        first += 1
    tail: list[str] = []
    if hi[1:] != "9" * rest:
        tail = [hi[0] + p for p in _same_len("0" * rest, hi[1:])]
        last -= 1
    if first <= last:
        head = str(first) if first == last else f"[{first}-{last}]"
        out.append(head + ("[0-9]" if rest == 1 else f"[0-9]{{{rest}}}"))
    return out + tail


def _nonneg_patterns(lo: int, hi: int | None) -> list[str]:
    """Patterns for the decimal integers in [lo, hi] (hi None: unbounded), lo >= 0."""
    if hi is not None and hi < lo:
        return []
    out: list[str] = []
    digits = len(str(lo))
    while True:
        seg_lo = lo if digits == len(str(lo)) else 10 ** (digits - 1)
        seg_max = 10**digits - 1
        if hi is not None and hi <= seg_max:
            out += _same_len(str(seg_lo), str(hi))
            return out
        if hi is None and seg_lo == 10 ** (digits - 1) and digits > 1:
            out.append(_open_ended(digits))
            return out
        out += _same_len(str(seg_lo), str(seg_max))
        digits += 1
        if hi is None and digits > 1:
            out.append(_open_ended(digits))
            return out


def _open_ended(digits: int) -> str:
    """Integers of `digits` digits or more (up to MAX_DIGITS, or `digits`)."""
    return f"[1-9][0-9]{{{digits - 1},{max(digits, MAX_DIGITS) - 1}}}"


def _alt(patterns: list[str]) -> str:
    if not patterns:
        raise ValueError("the range is empty")
    return patterns[0] if len(patterns) == 1 else "(" + "|".join(patterns) + ")"


def integer_regex(lo: int | None, hi: int | None) -> str:
    """Integers n with lo <= n <= hi (None: unbounded)."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"empty integer range [{lo}, {hi}]")
    parts: list[str] = []
    if hi is None or hi >= 0:
        parts += _nonneg_patterns(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = None if lo is None else -lo
        parts += ["-" + p for p in _nonneg_patterns(mag_lo, mag_hi)]
    return _alt(parts)


def integer_bounds(schema: dict) -> tuple[int | None, int | None]:
    """Inclusive integer bounds of an integer schema (draft 4 boolean exclusives too)."""
    lo, hi = (
        _bound(schema, "minimum", "exclusiveMinimum"),
        _bound(schema, "maximum", "exclusiveMaximum"),
    )
    ilo = None if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
    ihi = None if hi is None else (math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0]))
    return ilo, ihi


def _bound(schema: dict, key: str, excl_key: str) -> tuple[float, bool] | None:
    """(value, exclusive) of the tighter of `key` and `excl_key`."""
    best: tuple[float, bool] | None = None
    value, excl = schema.get(key), schema.get(excl_key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        best = (value, excl is True)  # draft 4: exclusiveMinimum is a boolean modifier
    if isinstance(excl, (int, float)) and not isinstance(excl, bool):
        tighter = best is None or (excl >= best[0] if key == "minimum" else excl <= best[0])
        if tighter:
            best = (excl, True)
    return best


def _magnitude(lo: int, lo_excl: bool, hi: int | None, hi_excl: bool) -> list[str]:
    """Patterns of non-negative decimals m (no exponent) with lo <(=) m <(=) hi."""
    out: list[str] = []
    start = lo
    if lo_excl:
        if hi is None or hi > lo:
            out.append(str(lo) + _POSITIVE_FRACTION)
        start = lo + 1
    if hi is None:
        out += [p + _FRACTION for p in _nonneg_patterns(start, None)]
        return out
    if hi - 1 >= start:
        out += [p + _FRACTION for p in _nonneg_patterns(start, hi - 1)]
    if not hi_excl and hi >= start:
        out.append(str(hi) + _ZERO_FRACTION)
    return out


def number_regex(schema: dict) -> str:
    """JSON numbers within the schema's bounds; integer-valued bounds only (else ValueError)."""
    lo, hi = (
        _bound(schema, "minimum", "exclusiveMinimum"),
        _bound(schema, "maximum", "exclusiveMaximum"),
    )
    for b, name in ((lo, "minimum"), (hi, "maximum")):
        if b is not None and float(b[0]) != math.floor(b[0]):
            raise ValueError(f"number {name} {b[0]} (only integer-valued bounds are supported)")
    lo_v, lo_x = (int(lo[0]), lo[1]) if lo else (None, False)
    hi_v, hi_x = (int(hi[0]), hi[1]) if hi else (None, False)
    parts: list[str] = []
    # x >= 0 side.
    if hi_v is None or hi_v > 0 or (hi_v == 0 and not hi_x):
        if lo_v is None or lo_v < 0:
            parts += _magnitude(0, False, hi_v, hi_x)
        else:
            parts += _magnitude(lo_v, lo_x, hi_v, hi_x)
    # x < 0 side: x = -m with m > 0, lo <(=) x <(=) hi  <=>  -hi <(=) m <(=) -lo.
    if lo_v is None or lo_v < 0:
        m_hi, m_hi_x = (None, False) if lo_v is None else (-lo_v, lo_x)
        if hi_v is None or hi_v >= 0:
            m_lo, m_lo_x = 0, True
        else:
            m_lo, m_lo_x = -hi_v, hi_x
        parts += ["-" + p for p in _magnitude(m_lo, m_lo_x, m_hi, m_hi_x)]
    return _alt(parts)
