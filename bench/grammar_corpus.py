"""The grammar corpus (`ebnf` constraints): CI (tests/constrained/test_grammar_corpus.py) and
`radixlm bench constrained` compile every grammar on each backend that accepts `ebnf`.

Each `GrammarCase` holds the grammar as sent (`text`, GBNF `root ::= ...` or Lark `start: ...`)
and `lark`: the same language in plain Lark, parsed by the `lark` package (Earley) as the
independent oracle of an output's validity (`parses`). Grammars are bounded where CI generates
from them (small repetition counts), so that an output finishes within a few dozen tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

_JSON_LARK = r"""
start: value
value: object | array | STRING | NUMBER | "true" | "false" | "null"
object: "{" (pair ("," " "? pair)*)? "}"
pair: STRING ":" " "? value
array: "[" (value ("," " "? value)*)? "]"
STRING: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt])*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
"""


@dataclass(frozen=True)
class GrammarCase:
    name: str
    text: str  # as sent in `ebnf`
    lark: str  # the same language in plain Lark (the oracle)
    question: str = "Answer."

    def parses(self, output: str) -> bool:
        import lark

        parser = _parser(self.lark)  # NOTE: a broken oracle raises, never reads as False
        try:
            parser.parse(output)
        except lark.exceptions.LarkError:
            return False
        return True


@functools.lru_cache(maxsize=64)
def _parser(text: str):  # type: ignore[no-untyped-def]
    import lark

    return lark.Lark(text, start="start", parser="earley", lexer="dynamic")


def _same(name: str, text: str, question: str = "Answer.") -> GrammarCase:
    return GrammarCase(name, text, text, question)


GRAMMARS: list[GrammarCase] = [
    _same(
        "arithmetic",
        r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,4}/
""",
        "Write an arithmetic expression that equals 12.",
    ),
    GrammarCase(
        "arithmetic_gbnf",
        'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= num (("*" | "/") num)*\n'
        "num ::= [0-9] | [0-9] [0-9]\n",
        'start: expr\nexpr: term (("+" | "-") term)*\nterm: num (("*" | "/") num)*\n'
        "num: /[0-9]{1,2}/\n",
        "Write a sum of two small numbers.",
    ),
    _same(
        "sql_select",
        r"""
start: "SELECT " cols " FROM " NAME where? order? limit?
cols: "*" | NAME (", " NAME)*
where: " WHERE " cond ((" AND " | " OR ") cond)*
cond: NAME " " OP " " value
value: NUMBER | /'[A-Za-z ]{0,12}'/
order: " ORDER BY " NAME (" ASC" | " DESC")?
limit: " LIMIT " NUMBER
OP: "=" | "<" | ">" | "<=" | ">=" | "!="
NAME: /[a-z_]{1,12}/
NUMBER: /[0-9]{1,4}/
""",
        "Write a SQL query selecting the names of users older than 30.",
    ),
    _same(
        "lisp",
        r"""
start: sexp
sexp: atom | "(" sexp (" " sexp)* ")"
atom: SYMBOL | NUMBER
SYMBOL: /[a-z+*\/-]{1,6}/
NUMBER: /[0-9]{1,3}/
""",
        "Write a Lisp expression that adds 1 and 2.",
    ),
    _same("json", _JSON_LARK, "Describe a cat as a JSON object."),
    GrammarCase(
        "json_gbnf",
        r"""
root ::= object
object ::= "{" ws ( pair ( "," ws pair )* )? "}"
pair ::= string ":" ws value
value ::= object | array | string | number | "true" | "false" | "null"
array ::= "[" ( value ( "," ws value )* )? "]"
string ::= "\"" [a-zA-Z0-9 ]* "\""
number ::= "-"? [0-9]+
ws ::= " "?
""",
        r"""
start: object
object: "{" WS? (pair ("," WS? pair)*)? "}"
pair: STRING ":" WS? value
value: object | array | STRING | NUMBER | "true" | "false" | "null"
array: "[" (value ("," WS? value)*)? "]"
STRING: /"[a-zA-Z0-9 ]*"/
NUMBER: /-?[0-9]+/
WS: " "
""",
        "Describe a dog as a JSON object.",
    ),
    _same(
        "tool_call",
        r"""
start: "<tool_call>" "{\"name\": " NAME ", \"arguments\": " args "}" "</tool_call>"
NAME: "\"get_weather\"" | "\"search\"" | "\"get_time\""
args: "{" (arg (", " arg)*)? "}"
arg: KEY ": " VALUE
KEY: /"[a-z_]{1,12}"/
VALUE: /"[A-Za-z ,]{0,20}"/ | /[0-9]{1,4}/
""",
        "Call a tool to get the weather in Paris.",
    ),
    _same(
        "boolean",
        r"""
start: disj
disj: conj (" OR " conj)*
conj: lit (" AND " lit)*
lit: "NOT " lit | VAR | "(" disj ")"
VAR: /[a-e]/
""",
        "Write a boolean formula over a, b and c.",
    ),
    _same(
        "csv",
        r"""
start: header ("\n" row)+
header: FIELD ("," FIELD)+
row: CELL ("," CELL)+
FIELD: /[a-z]{1,8}/
CELL: /[A-Za-z0-9]{1,8}/
""",
        "Write a small CSV table of fruits and prices.",
    ),
    _same(
        "int_list",
        r"""
start: "[" (INT (", " INT)*)? "]"
INT: /-?[0-9]{1,4}/
""",
        "List some prime numbers.",
    ),
    _same(
        "balanced",
        r"""
start: group+
group: "(" group* ")" | "[" group* "]"
""",
        "Write balanced brackets.",
    ),
    _same(
        "function_call",
        r"""
start: NAME "(" (arg (", " arg)*)? ")"
arg: NUMBER | STRING | NAME "=" (NUMBER | STRING)
NAME: /[a-z_]{1,10}/
NUMBER: /[0-9]{1,4}/
STRING: /"[a-z ]{0,10}"/
""",
        "Call a Python function that prints hello.",
    ),
    _same(
        "key_values",
        r"""
start: line ("\n" line)*
line: KEY " = " VALUE
KEY: /[a-z_]{1,10}/
VALUE: /[A-Za-z0-9.]{1,12}/
""",
        "Write a config file for a web server.",
    ),
    _same(
        "yes_no_reason",
        r"""
start: ("yes" | "no") ", because " /[a-z ,]{1,60}/ "."
""",
        "Is water wet?",
    ),
    _same(
        "bullets",
        r"""
start: item ("\n" item)*
item: "- " /[A-Z][a-z ]{1,30}/
""",
        "List three fruits as a markdown list.",
    ),
    _same(
        "chess_move",
        r"""
start: PIECE? FILE? "x"? FILE RANK PROMO? CHECK? | "O-O" | "O-O-O"
PIECE: /[KQRBN]/
FILE: /[a-h]/
RANK: /[1-8]/
PROMO: /=[QRBN]/
CHECK: "+" | "#"
""",
        "Give a chess opening move.",
    ),
    _same(
        "url",
        r"""
start: SCHEME "://" HOST ("." HOST)+ ("/" SEG)*
SCHEME: "http" | "https"
HOST: /[a-z0-9]{1,12}/
SEG: /[a-z0-9_-]{1,12}/
""",
        "Give the URL of a news site.",
    ),
    _same(
        "semver_range",
        r"""
start: clause (" || " clause)*
clause: OP? VERSION (" " OP VERSION)?
OP: ">=" | "<=" | ">" | "<" | "^" | "~"
VERSION: /[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}/
""",
        "Give an npm version range.",
    ),
    _same(
        "html",
        r"""
start: node+
node: "<" TAG ">" (TEXT | node)* "</" TAG ">"
TAG: "b" | "i" | "p" | "em"
TEXT: /[A-Za-z ]{1,20}/
""",
        "Write a short HTML paragraph.",
    ),
    _same(
        "email_list",
        r"""
start: EMAIL ("; " EMAIL)*
EMAIL: /[a-z0-9.]{1,12}@[a-z0-9]{1,10}\.(com|org|net)/
""",
        "List two email addresses.",
    ),
    GrammarCase(
        "yes_no_gbnf",
        'root ::= "yes" | "no"\n',
        'start: "yes" | "no"\n',
        "Is the sky blue?",
    ),
    GrammarCase(
        "list_gbnf",
        'root ::= item ("," " " item)*\nitem ::= [a-z]+\n',
        'start: ITEM ("," " " ITEM)*\nITEM: /[a-z]+/\n',
        "List three colors.",
    ),
    GrammarCase(
        "date_gbnf",
        'root ::= year "-" month "-" day\nyear ::= [12] [0-9] [0-9] [0-9]\n'
        'month ::= "0" [1-9] | "1" [0-2]\nday ::= [0-2] [1-9] | "3" [01]\n',
        'start: YEAR "-" MONTH "-" DAY\nYEAR: /[12][0-9]{3}/\nMONTH: /0[1-9]|1[0-2]/\n'
        "DAY: /[0-2][1-9]|3[01]/\n",
        "When did the Berlin wall fall?",
    ),
]
