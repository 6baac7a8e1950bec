"""Wiring: the scheduler's `GrammarManager` from `ServerArgs` (backend choice, cache, flags).

The backend is a name of `registry.GRAMMAR_BACKENDS` (checked by `ServerArgs`); its factory below
builds the shared `GrammarCompiler`."""

from __future__ import annotations

from typing import Any

import torch

from radixlm.runtime.constrained.manager import GrammarManager
from radixlm.runtime.constrained.registry import GRAMMAR_BACKENDS


def make_grammar_manager(
    args: Any, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], device: torch.device
) -> GrammarManager:
    """`args` is the engine's `ServerArgs`. Without a tokenizer, constraints are rejected."""
    factory = GRAMMAR_BACKENDS.load(GRAMMAR_BACKENDS.check(args.grammar_backend, "grammar_backend"))
    compiler = None if tokenizer is None else factory(args, tokenizer, vocab_size, eos_ids)
    # NOTE: without the radix cache a jump would recompute the whole sequence: not worth it.
    jump = not args.disable_jump_forward and not args.disable_radix_cache
    return GrammarManager(
        compiler, vocab_size, args.grammar_compile_timeout, jump, tokenizer=tokenizer, device=device
    )


def outlines_compiler(args: Any, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    from radixlm.runtime.constrained.outlines_backend import OutlinesCompiler

    return OutlinesCompiler(
        tokenizer,
        vocab_size,
        eos_ids,
        whitespace_pattern=args.constrained_json_whitespace_pattern,
        cache_dir=args.grammar_cache_dir,
    )


def llguidance_compiler(
    args: Any, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]
) -> Any:
    from radixlm.runtime.constrained.llguidance_backend import LLGuidanceCompiler

    return LLGuidanceCompiler(
        tokenizer, vocab_size, eos_ids, whitespace_pattern=args.constrained_json_whitespace_pattern
    )


def xgrammar_compiler(args: Any, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    from radixlm.runtime.constrained.xgrammar_backend import XGrammarCompiler

    return XGrammarCompiler(
        tokenizer, vocab_size, eos_ids, whitespace_pattern=args.constrained_json_whitespace_pattern
    )
