"""Grammar backends by name (`--grammar-backend`): factories
`(args, tokenizer, vocab_size, eos_ids) -> GrammarCompiler` (see `setup.py`, which calls them).
`ServerArgs` checks the name in the user's process."""

from __future__ import annotations

from radixlm.runtime.registry import Registry

GRAMMAR_BACKENDS: Registry = Registry("grammar backend")
GRAMMAR_BACKENDS.register("outlines", "radixlm.runtime.constrained.setup:outlines_compiler")
GRAMMAR_BACKENDS.register("llguidance", "radixlm.runtime.constrained.setup:llguidance_compiler")
GRAMMAR_BACKENDS.register("xgrammar", "radixlm.runtime.constrained.setup:xgrammar_compiler")
