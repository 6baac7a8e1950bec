"""Independent oracles of the constrained-decoding tests: format checkers that check (jsonschema's
own `FORMAT_CHECKER` with the `format-nongpl` extras, plus an explicit RFC 5322 dot-atom email
check: jsonschema's `email` rule only looks for "@"), a schema validator using them, and a
model-free sampler of the strings a regex accepts (Python's reading of the regex), used to check
the schema -> regex conversion without decoding."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema

try:  # Python >= 3.11
    import re._constants as sre_c
    import re._parser as sre_parse
except ImportError:  # pragma: no cover
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_EMAIL = re.compile(rf"{_ATEXT}(\.{_ATEXT})*@{_LABEL}(\.{_LABEL})+")


def is_email(value: object) -> bool:
    """RFC 5322 dot-atom local part (no leading, trailing or doubled dot), at most 64 characters,
    and a domain of at least two LDH labels (RFC 1035)."""
    if not isinstance(value, str):
        return True
    local, _, domain = value.rpartition("@")
    return bool(_EMAIL.fullmatch(value)) and len(local) <= 64 and len(domain) <= 253


def format_checker() -> jsonschema.FormatChecker:
    # NOTE: a bare FormatChecker() mixes every draft's rules (draft 3's `time` has no offset).
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = dict(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
    for name in ("date", "time", "date-time", "ipv4", "uuid", "uri", "hostname"):
        assert name in checker.checkers, (
            f"jsonschema has no {name!r} format rule: install jsonschema[format-nongpl]"
        )
    checker.checks("email")(is_email)
    return checker


FORMAT_CHECKER = format_checker()


def validate(value: Any, schema: Any) -> None:
    """jsonschema validation with the real format rules (raises ValidationError)."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls(schema, format_checker=FORMAT_CHECKER).validate(value)


def check_json(text: str, schema: Any) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"not JSON: {text!r} ({exc})") from None
    try:
        validate(value, schema)
    except jsonschema.ValidationError as exc:
        raise AssertionError(f"{text!r} is invalid: {exc.message}") from None
    return value


# Characters a sampler prefers when a class allows them: the ones that break JSON or dialects.
_INTERESTING = '"\\\n\t\x01\x1f /%.@-:aZ09_é中😄\x7f'


def sample(regex: str, rng: random.Random, max_extra: int = 3) -> str:
    """A random string of the regex's language (as Python's `re` reads it), biased towards the
    characters in `_INTERESTING` and short repetitions."""
    out: list[str] = []
    _walk(list(sre_parse.parse(regex)), rng, max_extra, out)
    return "".join(out)


def _walk(items: list, rng: random.Random, extra: int, out: list[str]) -> None:
    for op, av in items:
        if op is sre_c.LITERAL:
            out.append(chr(av))
        elif op in (sre_c.IN, sre_c.NOT_LITERAL, sre_c.ANY):
            out.append(_pick(op, av, rng))
        elif op is sre_c.BRANCH:
            _walk(list(rng.choice(av[1])), rng, extra, out)
        elif op is sre_c.SUBPATTERN:
            _walk(list(av[-1]), rng, extra, out)
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, body = av
            hi = lo + extra if hi == sre_c.MAXREPEAT else min(hi, lo + extra)
            for _ in range(rng.randint(lo, hi)):
                _walk(list(body), rng, extra, out)
        elif op is sre_c.AT:
            pass
        else:
            raise AssertionError(f"the sampler does not handle {op}")


def _pick(op: object, av: object, rng: random.Random) -> str:
    if rng.random() < 0.6:
        hits = [c for c in _INTERESTING if _member(op, av, c)]
        if hits:
            return rng.choice(hits)
    for _ in range(5000):
        c = chr(
            rng.choice((rng.randint(0x20, 0x7E), rng.randint(0, 0x2FF), rng.randint(0, 0x10FFFF)))
        )
        if not 0xD800 <= ord(c) <= 0xDFFF and _member(op, av, c):
            return c
    raise AssertionError(f"no character found for {op} {av}")


_CATS = {
    sre_c.CATEGORY_DIGIT: re.compile(r"\d"), sre_c.CATEGORY_NOT_DIGIT: re.compile(r"\D"),
    sre_c.CATEGORY_SPACE: re.compile(r"\s"), sre_c.CATEGORY_NOT_SPACE: re.compile(r"\S"),
    sre_c.CATEGORY_WORD: re.compile(r"\w"), sre_c.CATEGORY_NOT_WORD: re.compile(r"\W"),
}  # fmt: skip


def _member(op: object, av: Any, c: str) -> bool:
    if op is sre_c.ANY:
        return c != "\n"
    if op is sre_c.NOT_LITERAL:
        return ord(c) != av
    hit, negated = False, False
    for iop, iav in av:
        if iop is sre_c.NEGATE:
            negated = True
        elif iop is sre_c.LITERAL:
            hit |= ord(c) == iav
        elif iop is sre_c.RANGE:
            hit |= iav[0] <= ord(c) <= iav[1]
        elif iop is sre_c.CATEGORY:
            hit |= bool(_CATS[iav].fullmatch(c))
    return hit != negated
