"""The regexes and JSON schemas the constrained-decoding tests decode on the default model.

Every case is bounded (maxLength / maxItems / numeric bounds) so that a complete output always
fits in `MAX_NEW_TOKENS`; `check(case, text)` is the oracle (re.fullmatch, or jsonschema with real format rules).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_NEW_TOKENS = 200


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # regex | json_schema | choices
    spec: Any  # regex str, schema dict, or list of choices
    question: str

    @property
    def prompt(self) -> str:
        return chat(self.question)

    def params(self, **extra: Any) -> dict[str, Any]:
        value = json.dumps(self.spec) if self.kind == "json_schema" else self.spec
        return {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, self.kind: value, **extra}


def check(case: Case, text: str) -> None:
    """Raise AssertionError unless `text` is in the case's language."""
    if case.kind == "regex":
        assert re.fullmatch(case.spec, text), f"{case.name}: {text!r} !~ {case.spec!r}"
    elif case.kind == "choices":
        assert text in case.spec, f"{case.name}: {text!r} not in {case.spec}"
    else:
        # NOTE: real format rules (jsonschema's format-nongpl extras and an RFC 5322 email
        # check): the bare FORMAT_CHECKER has no date-time/time/uri rule (issue 28).
        from constrained.oracles import check_json

        try:
            check_json(text, case.spec)
        except AssertionError as exc:
            raise AssertionError(f"{case.name}: {exc}") from None


NAME = {"type": "string", "maxLength": 16}
ADDRESS = {
    "type": "object",
    "properties": {
        "street": NAME,
        "city": NAME,
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    },
    "required": ["street", "city", "zip"],
}

REGEX_CASES = [
    Case("date", "regex", r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", "When did World War II end? Give the date."),
    Case("ipv4", "regex", r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])", "What is the IP address of Google's public DNS server?"),
    Case("phone", "regex", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", "Write a US phone number."),
    Case("email", "regex", r"[a-z0-9._]{1,20}@[a-z0-9]{1,15}\.(com|org|net)", "Write the email address of a support desk."),
    Case("time", "regex", r"([01][0-9]|2[0-3]):[0-5][0-9]", "At what time does a typical office open?"),
    Case("hex_color", "regex", r"#[0-9a-fA-F]{6}", "What is the hex code of pure red?"),
    Case("zip", "regex", r"[0-9]{5}(-[0-9]{4})?", "Give a ZIP code in New York."),
    Case("semver", "regex", r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}", "Give a software version number."),
    Case("unicode_alt", "regex", r"(café|naïve|日本語|Ω|straße)", "Pick a word with an accent."),
    Case("sentence", "regex", r"[A-Z][a-z ,]{5,40}\.", "Describe the sky in one short sentence."),
    Case("url", "regex", r"https://[a-z]{3,12}\.(com|org|net)/[a-z]{1,10}", "Give the URL of a documentation page."),
    Case("int_list", "regex", r"\[([0-9]{1,3}, ){2}[0-9]{1,3}\]", "List three small prime numbers."),
    Case("key_value", "regex", r"name=[A-Za-z]{1,10};age=[0-9]{1,2}", "Describe a person as name=...;age=..."),
    Case("json_regex", "regex", r'\{"city": "[A-Za-z ]{1,20}", "population": [0-9]{1,8}\}', "Give a city and its population as JSON."),
    Case("choices_plain", "choices", ["yes", "no", "maybe"], "Is the earth round?"),
    Case("choices_special", "choices", ["C++", "C#", "F*", "(none)", "a.b|c"], "Which language has pointers?"),
]  # fmt: skip

SCHEMA_CASES = [
    Case("person", "json_schema", {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}}, "required": ["name", "age"]}, "Describe Alice, who is 30, as JSON."),
    Case("nested", "json_schema", {"type": "object", "properties": {"name": NAME, "address": ADDRESS}, "required": ["name", "address"]}, "Give a person with an address as JSON."),
    Case("array_bounds", "json_schema", {"type": "object", "properties": {"colors": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 4}}, "required": ["colors"]}, "List some colors as JSON."),
    Case("enum", "json_schema", {"type": "object", "properties": {"size": {"enum": ["small", "medium", "large"]}}, "required": ["size"]}, "How big is an elephant? Answer in JSON."),
    Case("const", "json_schema", {"type": "object", "properties": {"version": {"const": 2}, "kind": {"const": "report"}}, "required": ["version", "kind"]}, "Write a report header in JSON."),
    Case("optional", "json_schema", {"type": "object", "properties": {"title": NAME, "subtitle": NAME, "pages": {"type": "integer", "minimum": 1, "maximum": 999}}, "required": ["title"]}, "Describe a book in JSON."),
    Case("escapes_unicode", "json_schema", {"type": "object", "properties": {"quote": {"type": "string", "maxLength": 32}}, "required": ["quote"]}, 'Put this text in JSON: She said "héllo" to the café owner ☺'),
    Case("pattern", "json_schema", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}, "required": ["code"]}, "Give a product code like ABC-123 in JSON."),
    Case("lengths", "json_schema", {"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 8}}, "required": ["word"]}, "Give a word in JSON."),
    Case("int_bounds", "json_schema", {"type": "object", "properties": {"year": {"type": "integer", "minimum": 1900, "maximum": 2100}, "neg": {"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 0}}, "required": ["year", "neg"]}, "Give a year and a small negative number in JSON."),
    Case("number_bounds", "json_schema", {"type": "object", "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1}, "temp": {"type": "number", "minimum": -50, "maximum": 60}}, "required": ["ratio", "temp"]}, "Give a ratio and a temperature in JSON."),
    Case("any_of", "json_schema", {"type": "object", "properties": {"nickname": {"anyOf": [NAME, {"type": "null"}]}}, "required": ["nickname"]}, "Does Bob have a nickname? JSON."),
    Case("one_of", "json_schema", {"type": "object", "properties": {"id": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 99999}, {"type": "string", "maxLength": 10}]}}, "required": ["id"]}, "Give an id in JSON."),
    Case("refs", "json_schema", {"$defs": {"addr": ADDRESS}, "type": "object", "properties": {"home": {"$ref": "#/$defs/addr"}, "work": {"$ref": "#/$defs/addr"}}, "required": ["home", "work"]}, "Give a home and a work address in JSON."),
    Case("array_of_objects", "json_schema", {"type": "object", "properties": {"people": {"type": "array", "items": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]}, "minItems": 1, "maxItems": 2}}, "required": ["people"]}, "List two people in JSON."),
    Case("bool_null", "json_schema", {"type": "object", "properties": {"active": {"type": "boolean"}, "deleted": {"type": "null"}}, "required": ["active", "deleted"]}, "Is the account active? JSON."),
    Case("formats", "json_schema", {"type": "object", "properties": {"day": {"type": "string", "format": "date"}, "at": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"}, "mail": {"type": "string", "format": "email"}}, "required": ["day", "at", "id", "mail"]}, "Give an event record in JSON."),
    Case("enum_mixed", "json_schema", {"type": "object", "properties": {"v": {"enum": [1, "two", None, True, 3.5]}}, "required": ["v"]}, "Pick a value in JSON."),
    Case("matrix", "json_schema", {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}, "Give a 2x2 matrix of digits as JSON."),
    Case("type_list", "json_schema", {"type": "object", "properties": {"count": {"type": ["integer", "null"], "minimum": 0, "maximum": 1000}}, "required": ["count"]}, "How many moons does Mars have? JSON."),
    Case("pydantic_like", "json_schema", {"title": "Item", "type": "object", "additionalProperties": False, "properties": {"name": {"title": "Name", "type": "string", "maxLength": 20, "description": "The item name"}, "price": {"title": "Price", "type": "number", "minimum": 0, "maximum": 10000}, "tags": {"title": "Tags", "type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3, "default": []}}, "required": ["name", "price"]}, "Describe a laptop for sale in JSON."),
]  # fmt: skip

CASES = REGEX_CASES + SCHEMA_CASES


# A recursive tree (issue 23): llguidance generates it; the outlines backend refuses it by name.
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 8},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
            },
            "required": ["name", "children"],
        }
    },
    "$ref": "#/$defs/node",
}
