"""The real-world corpus, without the model: every SchemaStore schema vendored in
`check-jsonschema` compiles on the llguidance and xgrammar backends or is rejected with a GrammarError naming
the keyword (and its JSON pointer) or the reason; every grammar of bench/grammar_corpus.py
compiles, and random walks through it (random allowed tokens until EOS) parse with the `lark`
package's Earley parser (an independent oracle). ebnf on the outlines backend is refused by name.
"""

from __future__ import annotations

import glob
import json
import os
import random

import pytest
from constrained.helpers import make_compiler
from constrained.test_compile_walks import random_walk

from radixlm.bench.grammar_corpus import GRAMMARS
from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.errors import GrammarError

# Recursive grammars whose random walks rarely close every bracket within the step budget.
MAY_NOT_FINISH = {"balanced", "html", "json"}
WALKS = 3


def schemastore_files() -> list[str]:
    import check_jsonschema

    root = os.path.join(os.path.dirname(check_jsonschema.__file__), "builtin_schemas", "vendor")
    return sorted(glob.glob(os.path.join(root, "*.json")))


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def llg(request):
    """A compiler of each backend that takes the whole corpus (ebnf included)."""
    return make_compiler(backend=request.param)


def test_schemastore_compiles_or_is_rejected_by_name(llg):
    files = schemastore_files()
    assert len(files) >= 20
    compiled, rejected = [], []
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            grammar = llg.compile(GrammarSpec("json_schema", text))
        except GrammarError as exc:
            message = str(exc)
            rejected.append(os.path.basename(path))
            # A clear error: the unsupported keyword and where, or the reason in words.
            assert "json_schema" in message or "JSON Schema" in message, message
            if "unsupported JSON Schema keyword" in message:
                assert " at /" in message, message
            continue
        compiled.append(os.path.basename(path))
        assert not grammar.is_terminated()
    assert compiled, "no SchemaStore schema compiled"
    assert len(compiled) + len(rejected) == len(files)


def test_schemastore_small_schemas_generate_valid_json(llg):
    """Random walks through the schemas that compile and are small: the outputs validate."""
    import jsonschema

    done = 0
    for path in schemastore_files():
        if os.path.getsize(path) > 4096:
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            llg.compile(GrammarSpec("json_schema", text))
        except GrammarError:
            continue
        rng = random.Random(path)
        for _ in range(WALKS):
            out = random_walk(llg.compile(GrammarSpec("json_schema", text)), llg.vocab, rng, 600)
            if out is not None:
                jsonschema.validate(json.loads(out), json.loads(text))
                done += 1
    assert done >= 1


@pytest.mark.parametrize("case", GRAMMARS, ids=lambda c: c.name)
def test_grammar_walks_parse(llg, case):
    rng = random.Random(case.name)
    finished = 0
    for _ in range(WALKS):
        out = random_walk(llg.compile(GrammarSpec("ebnf", case.text)), llg.vocab, rng)
        if out is not None:
            assert case.parses(out), f"{case.name}: {out!r} does not parse"
            finished += 1
    if case.name not in MAY_NOT_FINISH:
        assert finished >= 1, f"{case.name}: no random walk finished"


def test_corpus_has_twenty_grammars():
    names = {c.name for c in GRAMMARS}
    assert len(names) == len(GRAMMARS) >= 20
    assert {"arithmetic", "sql_select", "lisp", "json", "tool_call"} <= names


def test_outlines_rejects_ebnf_by_name():
    outlines = make_compiler()
    with pytest.raises(GrammarError, match="ebnf grammars are not supported by the outlines"):
        outlines.validate(GrammarSpec("ebnf", GRAMMARS[0].text))
