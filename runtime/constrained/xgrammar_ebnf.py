"""Rewrites of XGrammar grammar text (its EBNF, as `str(Grammar)` prints it) where XGrammar's own
automaton would let invalid output through; `valid_utf8` applies them and re-reads the grammar.

- `exclude_surrogates`: U+D800-U+DFFF out of every negated character class;
- `inline_regexes`: lazy `Regex(..., json_string=true)` rules become the EBNF of the regex.

Pure functions on text; thread-safe.
"""

from __future__ import annotations

import re
from typing import Any


def exclude_surrogates(ebnf: str, json_controls: bool = False) -> str:
    """The grammar text with U+D800-U+DFFF taken out of every negated character class, and with
    `json_controls` U+0000-U+001F out of every negated class that excludes `"` (the characters
    of a JSON string).
    NOTE: XGrammar's `[^...]` (its JSON string rule, `.`) admits the UTF-8 encodings of surrogate
    code points (`\\xed\\xb9\\x8b`): bytes that are not UTF-8, which no output may hold; and
    its length-bounded JSON string (`[^\\"\\\\\\r\\n]{0,n}`) admits raw control characters,
    which JSON does not."""
    out: list[str] = []
    i, n, quoted, in_class = 0, len(ebnf), False, False
    while i < n:
        ch = ebnf[i]
        if ch == "\\" and (quoted or in_class):
            out.append(ebnf[i : i + 2])
            i += 2
            continue
        if quoted:
            quoted = ch != '"'
        elif in_class:
            in_class = ch != "]"
        elif ch == '"':
            quoted = True
        elif ch == "[":
            in_class = True
            if ebnf.startswith("[^", i):
                body = _CLASS_BODY.match(ebnf, i + 2)
                quote = json_controls and body is not None and '\\"' in body.group(0)
                out.append("[^\\ud800-\\udfff" + ("\\0-\\x1f" if quote else ""))
                i += 2
                continue
        out.append(ch)
        i += 1
    return "".join(out)


_CLASS_BODY = re.compile(r"(?:\\.|[^\]\\])*")
_LAZY_REGEX = re.compile(r'^(\w+) ::= Regex\("((?:\\.|[^"\\])*)", json_string=true\)$', re.M)
_EBNF_PIECE = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\b(root(?:_\d+)*)\b')


def inline_regexes(ebnf: str) -> str:
    """XGrammar's JSON converter leaves some string `pattern`s as lazy `Regex(..., json_string=
    true)` rules, whose automaton lets overlong UTF-8 through (`\\xe0\\x95`). Our patterns are
    already regexes of the JSON text (`_strings`): each such rule becomes the EBNF XGrammar
    builds from that regex, its rules renamed into the rule's own namespace."""

    def inline(match: re.Match[str]) -> str:
        name = match.group(1)
        body = match.group(2).encode("latin-1", "backslashreplace").decode("unicode_escape")
        body = body.removeprefix("^").removesuffix("$")
        sub = str(xgr_grammar().from_regex(body))
        renamed = _EBNF_PIECE.sub(
            lambda m: f"{name}_rx{m.group(1)[4:]}" if m.group(1) else m.group(0), sub
        )
        return f"{name} ::= (({name}_rx))\n{renamed.strip()}"

    return _LAZY_REGEX.sub(inline, ebnf)


def xgr_grammar() -> Any:
    """XGrammar's `Grammar` class (imported on first use: the tokenizer manager may never)."""
    import xgrammar as xgr

    return xgr.Grammar


def valid_utf8(grammar: Any, json: bool = False) -> Any:
    """`grammar` rewritten (see the module docstring); `json`: a JSON-schema grammar."""
    text = exclude_surrogates(inline_regexes(str(grammar)), json_controls=json)
    return xgr_grammar().from_ebnf(text, root_rule_name="root")
