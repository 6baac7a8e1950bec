"""A user regex, read by Python's `re` parser, re-written in the plain syntax outlines-core builds
its automaton from: the promise of a `regex` constraint is `re.fullmatch` semantics, and that of
a JSON-schema `pattern` is `re.search` on the *decoded* string value.

Why: outlines-core parses Rust's regex syntax, which reads some patterns differently from Python
(`[[:digit:]]`, `[a-z&&[^aeiou]]`, `a{,3}`, `[\\b]`, `\\u4e00`), and a `pattern` spliced into a
JSON string as-is lets `.` or `[^...]` emit a raw `"`, `\\` or control character. So:
- the pattern is parsed by `re._parser` (Python's own reading is the definition);
- constructs that a finite automaton cannot express, or that other dialects read differently,
  raise `GrammarError` naming the construct;
- the parse tree is emitted with explicit character sets (`\\d`, `\\w`, `\\s` as Python's Unicode
  sets, `.` as "anything but newline", negations as complements) and no flags;
- in JSON-string mode every character that JSON must escape is emitted as its escape sequence
  (`"` -> `\\"`, newline -> `\\n`, U+0001 -> `\\u0001`), so the generated text is the JSON form
  of a string that the pattern matches.
Pure functions, cached; thread-safe.
"""

from __future__ import annotations

import functools
import re
import warnings

try:  # Python >= 3.11
    import re._constants as sre_c
    import re._parser as sre_parse
except ImportError:  # pragma: no cover
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

from radixlm.runtime.errors import GrammarError

Ranges = tuple[tuple[int, int], ...]
_TOP = 0x110000
_SURROGATES = (0xD800, 0xDFFF)
# Foreign syntax that Python rejects with a terse message (or reads differently): a clear reason.
_FOREIGN = (
    (re.compile(r"(?<!\\)(?:\\\\)*\\x\{"), r"\x{...} is not Python syntax (write \xe9 or \u00e9)"),
    (re.compile(r"(?<!\\)(?:\\\\)*\\[QE]"), r"\Q...\E quoting is not Python syntax (escape each character)"),
    (re.compile(r"(?<!\\)(?:\\\\)*\\z"), r"\z is not Python 3.11 syntax (use \Z, or no anchor: the match is whole)"),
    (re.compile(r"(?<!\\)(?:\\\\)*\\[pP]\{"), r"Unicode property classes (\p{...}) are not Python syntax"),
    (re.compile(r"(?<!\\)(?:\\\\)*\(\?<(?![=!])"), "named groups are written (?P<name>...) in Python, not (?<name>...)"),
    (re.compile(r"(?<!\\)(?:\\\\)*\(\?'"), "named groups are written (?P<name>...) in Python, not (?'name'...)"),
    (re.compile(r"(?<!\\)(?:\\\\)*\\0"), r"\0 is an octal escape (NUL) in Python and a back-reference elsewhere (write \x00)"),
)  # fmt: skip
# Python warns about these and reads them literally; other dialects read them as set syntax.
_SET_WARNINGS = {
    "Possible nested set": "POSIX classes / nested sets ([[:digit:]], [[a-z]])",
    "Possible set intersection": "set intersection (&&) inside a class",
    "Possible set difference": "set difference (--) inside a class",
    "Possible set symmetric difference": "set symmetric difference (~~) inside a class",
}
_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}  # fmt: skip
_NEEDS_ESCAPE: Ranges = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))
_ANCHORS_START = {sre_c.AT_BEGINNING, sre_c.AT_BEGINNING_STRING}
_ANCHORS_END = {sre_c.AT_END, sre_c.AT_END_STRING}


def translate(pattern: str, field: str = "regex", json_string: bool = False) -> str:
    """The regex outlines-core should compile for `pattern` (GrammarError when it cannot be
    honoured). `json_string`: emit the JSON-escaped form, without the surrounding quotes."""
    return _translate(pattern, field, json_string)


def _shown(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 80 else pattern[:77] + "...")


def _unsupported(pattern: str, field: str, what: str) -> GrammarError:
    return GrammarError(f"unsupported regex feature in {_shown(pattern)}: {what}", field)


@functools.lru_cache(maxsize=1024)
def _translate(pattern: str, field: str, json_string: bool) -> str:
    for rx, reason in _FOREIGN:
        if rx.search(pattern):
            raise _unsupported(pattern, field, reason)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            tree = sre_parse.parse(pattern)
        except re.error as exc:
            raise GrammarError(f"invalid regex {_shown(pattern)}: {exc}", field) from None
        except (RecursionError, OverflowError) as exc:
            raise GrammarError(f"invalid regex {_shown(pattern)}: {exc}", field) from None
    for warning in caught:
        for prefix, what in _SET_WARNINGS.items():
            if str(warning.message).startswith(prefix):
                raise _unsupported(pattern, field, f"{what}: Python reads it literally")
    flags = tree.state.flags
    if flags & (re.IGNORECASE | re.LOCALE):
        raise _unsupported(pattern, field, "the case-insensitive flag (?i) / locale flag (?L)")
    return _Emitter(pattern, field, json_string).seq(list(tree), flags, True, True)


class _Emitter:
    def __init__(self, pattern: str, field: str, json_string: bool) -> None:
        self.pattern, self.field, self.json = pattern, field, json_string

    def fail(self, what: str) -> GrammarError:
        return _unsupported(self.pattern, self.field, what)

    def seq(self, items: list, flags: int, at_start: bool, at_end: bool) -> str:
        # NOTE: an anchor is a no-op only where it cannot fail: `^`/`\A` before anything that
        # consumes a character, `$`/`\Z` after everything that does (fullmatch semantics; for a
        # JSON `pattern`, re.search of a string the unanchored pattern matches in full).
        consumes = [op is not sre_c.AT for op, _ in items]
        out = []
        for i, (op, av) in enumerate(items):
            first = at_start and not any(consumes[:i])
            last = at_end and not any(consumes[i + 1 :])
            out.append(self.node(op, av, flags, first, last))
        return "".join(out)

    def node(self, op: object, av: object, flags: int, first: bool, last: bool) -> str:
        if op is sre_c.LITERAL:
            return self.chars(((av, av),))  # type: ignore[arg-type]
        if op is sre_c.NOT_LITERAL:
            return self.chars(_complement(((av, av),)))  # type: ignore[arg-type]
        if op is sre_c.ANY:
            return self.chars(((0, _TOP - 1),) if flags & re.DOTALL else _complement(((10, 10),)))
        if op is sre_c.IN:
            return self.chars(self.charset(av, flags))  # type: ignore[arg-type]
        if op is sre_c.BRANCH:
            alts = [self.seq(list(a), flags, first, last) for a in av[1]]  # type: ignore[index]
            return "(" + "|".join(alts) + ")"
        if op is sre_c.SUBPATTERN:
            _group, add, remove, body = av  # type: ignore[misc]
            if add & (re.IGNORECASE | re.LOCALE):
                raise self.fail("the case-insensitive flag (?i) / locale flag (?L)")
            return "(" + self.seq(list(body), (flags | add) & ~remove, first, last) + ")"
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, body = av  # type: ignore[misc]
            inner = "(" + self.seq(list(body), flags, False, False) + ")"
            if hi == sre_c.MAXREPEAT:
                return f"{inner}{{{lo},}}"
            return f"{inner}{{{lo},{hi}}}"
        if op is sre_c.AT:
            if (av in _ANCHORS_START and first) or (av in _ANCHORS_END and last):
                return ""
            if av in (sre_c.AT_BOUNDARY, sre_c.AT_NON_BOUNDARY):
                raise self.fail(r"word boundaries (\b, \B)")
            raise self.fail("anchors (^, $, \\A, \\Z) other than at the start/end of the pattern")
        if op is getattr(sre_c, "POSSESSIVE_REPEAT", None):
            raise self.fail(
                "possessive quantifiers (*+, ++, ?+, {n}+): Python never backtracks into them"
            )
        if op is getattr(sre_c, "ATOMIC_GROUP", None):
            raise self.fail("atomic groups (?>...)")
        if op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
            raise self.fail("look-around assertions ((?=...), (?!...), (?<=...), (?<!...))")
        if op is sre_c.GROUPREF:
            raise self.fail("back-references (\\1, (?P=name))")
        if op is sre_c.GROUPREF_EXISTS:
            raise self.fail("conditional groups ((?(1)a|b))")
        raise self.fail(f"the construct {op}")

    def charset(self, items: list, flags: int) -> Ranges:
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
                ranges.extend(_category(av, bool(flags & re.ASCII)))
            else:  # pragma: no cover - the parser puts nothing else in a class
                raise self.fail(f"the class item {op}")
        return _complement(tuple(ranges)) if negated else _normalize(tuple(ranges))

    def chars(self, ranges: Ranges) -> str:
        ranges = _subtract(ranges, (_SURROGATES,))
        if not ranges:
            raise self.fail("a character class that matches nothing")
        if not self.json:
            return _class(ranges)
        safe = _subtract(ranges, _NEEDS_ESCAPE)
        alts = [_class(safe)] if safe else []
        for lo, hi in _intersect(ranges, _NEEDS_ESCAPE):
            for c in range(lo, hi + 1):
                alts.append(_escape_text(_JSON_ESCAPES.get(c, f"\\u{c:04x}")))
        return alts[0] if len(alts) == 1 else "(" + "|".join(alts) + ")"


def _char(c: int) -> str:
    if c < 0x80 and not chr(c).isalnum():
        return f"\\x{c:02x}"
    return chr(c)


def _escape_text(text: str) -> str:
    return "".join(_char(ord(c)) for c in text)


def _class(ranges: Ranges) -> str:
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return _char(ranges[0][0])
    comp = _subtract(_complement(ranges), (_SURROGATES,))
    body, neg = (comp, "^") if comp and len(comp) < len(ranges) else (ranges, "")
    parts = [_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in body]
    return "[" + neg + "".join(parts) + "]"


def _normalize(ranges: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _complement(ranges: Ranges) -> Ranges:
    out, start = [], 0
    for lo, hi in _normalize(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start < _TOP:
        out.append((start, _TOP - 1))
    return tuple(out)


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    out = []
    for lo1, hi1 in _normalize(a):
        for lo2, hi2 in _normalize(b):
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return _normalize(tuple(out))


def _subtract(a: Ranges, b: Ranges) -> Ranges:
    return _intersect(a, _complement(b))


@functools.lru_cache(maxsize=16)
def _category(cat: object, ascii_only: bool) -> Ranges:
    """Python's own reading of `\\d`, `\\w`, `\\s` (and negations) as code-point ranges."""
    base = {
        sre_c.CATEGORY_DIGIT: str.isdecimal,
        sre_c.CATEGORY_SPACE: str.isspace,
        sre_c.CATEGORY_WORD: lambda ch: ch.isalnum() or ch == "_",
    }
    negated = {
        sre_c.CATEGORY_NOT_DIGIT: sre_c.CATEGORY_DIGIT,
        sre_c.CATEGORY_NOT_SPACE: sre_c.CATEGORY_SPACE,
        sre_c.CATEGORY_NOT_WORD: sre_c.CATEGORY_WORD,
    }
    if cat in negated:
        return _complement(_category(negated[cat], ascii_only))
    test = base[cat]  # type: ignore[index]
    top = 0x80 if ascii_only else _TOP
    out: list[tuple[int, int]] = []
    for c in range(top):
        if test(chr(c)):
            if out and out[-1][1] == c - 1:
                out[-1] = (out[-1][0], c)
            else:
                out.append((c, c))
    return tuple(out)
