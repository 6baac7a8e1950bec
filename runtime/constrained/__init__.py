"""Constrained decoding: regex, JSON schema and choices on a token FSM (outlines-core), packed
bitmask masks, jump-forward. See docs/constrained.md.

Modules: base (the `Grammar` / `GrammarCompiler` seams), patterns (spec -> regex, validation),
json_schema and num_range (schema -> regex), vocab (our tokenizer as bytes), outlines_backend
(Index/Guide), cache (LRU + disk), jump_forward (re-tokenizing plan), reasoning (the grammar starts after `</think>`), manager (the scheduler's
compile queue, masks, jumps), setup (wiring from ServerArgs); the llguidance backend
(llguidance_backend, llguidance_specs) and the XGrammar one (xgrammar_backend, xgrammar_specs,
xgrammar_ebnf).
"""

from __future__ import annotations

from radixlm.runtime.constrained.base import Grammar, GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.patterns import check_sampling_params, check_spec, spec_to_regex

__all__ = [
    "Grammar",
    "GrammarCompiler",
    "GrammarSpec",
    "check_sampling_params",
    "check_spec",
    "spec_to_regex",
]
