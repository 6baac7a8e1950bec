"""The schemas, regexes and prompts of `radixlm bench constrained` (data only)."""

from __future__ import annotations

import json

NAME = {"type": "string", "maxLength": 20}
SCHEMAS: dict[str, dict] = {
    "person": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}}, "required": ["name", "age"]},
    "address": {"type": "object", "properties": {"name": NAME, "address": {"type": "object", "properties": {"street": NAME, "city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"]}}, "required": ["name", "address"]},
    "people": {"type": "object", "properties": {"people": {"type": "array", "items": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]}, "minItems": 1, "maxItems": 3}}, "required": ["people"]},
    "enum_const": {"type": "object", "properties": {"kind": {"const": "review"}, "rating": {"enum": ["good", "bad", "mixed"]}, "score": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["kind", "rating", "score"]},
    "formats": {"type": "object", "properties": {"day": {"type": "string", "format": "date"}, "mail": {"type": "string", "format": "email"}}, "required": ["day", "mail"]},
    "item": {"type": "object", "properties": {"name": NAME, "price": {"type": "number", "minimum": 0, "maximum": 10000}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}}, "required": ["name", "price", "tags"]},
}  # fmt: skip
REGEXES: dict[str, str] = {
    "date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    "phone": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    "email": r"[a-z0-9._]{1,20}@[a-z0-9]{1,15}\.(com|org|net)",
    "url": r"https://[a-z]{3,12}\.(com|org|net)/[a-z]{1,10}",
    "sentence": r"[A-Z][a-z ,]{5,60}\.",
}

# JSON extraction: a fixed-layout record (SGLang's jump-forward benchmark style), where the keys
# and layout are forced and only the values are generated.
EXTRACTION_REGEX = (
    r'\{\n    "name": "[A-Z][a-z]{1,15}( [A-Z][a-z]{1,15})?",\n    "age": [0-9]{1,3},\n'
    r'    "city": "[A-Z][a-z]{1,15}( [A-Z][a-z]{1,15})?",\n    "occupation": "[a-z]{1,20}( [a-z]{1,20})?",\n'
    r'    "favourite_color": "[a-z]{1,12}"\n\}'
)
EXTRACTION_SCHEMA = {
    "type": "object",
    "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}, "city": NAME, "occupation": NAME, "favourite_color": {"type": "string", "maxLength": 12}},
    "required": ["name", "age", "city", "occupation", "favourite_color"],
}  # fmt: skip
PEOPLE = [
    ("Alice Martin", 34, "Paris", "engineer", "blue"), ("Bob Stone", 52, "Berlin", "baker", "red"),
    ("Chen Wei", 28, "Shanghai", "designer", "green"), ("Dana Cruz", 41, "Madrid", "doctor", "yellow"),
    ("Eli Cohen", 67, "Haifa", "teacher", "purple"), ("Fatima Noor", 23, "Cairo", "student", "orange"),
    ("Gus Berg", 45, "Oslo", "fisherman", "grey"), ("Hana Sato", 31, "Tokyo", "pianist", "pink"),
    ("Ivan Petrov", 58, "Moscow", "pilot", "black"), ("Julia Rossi", 36, "Rome", "chef", "white"),
    ("Kofi Mensah", 29, "Accra", "nurse", "brown"), ("Lena Vogel", 50, "Vienna", "lawyer", "teal"),
    ("Mateo Silva", 39, "Lima", "farmer", "gold"), ("Nina Holm", 44, "Stockholm", "writer", "silver"),
    ("Omar Haddad", 61, "Beirut", "tailor", "navy"), ("Priya Nair", 27, "Mumbai", "architect", "violet"),
]  # fmt: skip


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def extraction_prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        name, age, city, job, color = PEOPLE[i % len(PEOPLE)]
        doc = (
            f"{name} is a {age}-year-old {job} who lives in {city}. "
            f"{name.split()[0]}'s favourite color is {color}."
        )
        out.append(
            chat(
                f"Extract name, age, city, occupation and favourite_color from this text as JSON.\n\n{doc}"
            )
        )
    return out


def spec_prompt(kind: str, name: str) -> str:
    return chat(f"Answer with a {name.replace('_', ' ')} ({kind}).")


def all_specs() -> list[tuple[str, str, str]]:
    """(label, kind, value) for the compile and mask measurements."""
    specs = [(f"schema:{k}", "json_schema", json.dumps(v)) for k, v in SCHEMAS.items()]
    specs += [(f"regex:{k}", "regex", v) for k, v in REGEXES.items()]
    specs.append(("regex:extraction", "regex", EXTRACTION_REGEX))
    specs.append(("schema:extraction", "json_schema", json.dumps(EXTRACTION_SCHEMA)))
    return specs
