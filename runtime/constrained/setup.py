"""Wiring: the scheduler's `GrammarManager` from `ServerArgs` (backend choice, cache, flags)."""

from __future__ import annotations

from typing import Any

import torch

from radixlm.runtime.constrained.manager import GrammarManager
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.server_args import GRAMMAR_BACKENDS


def make_grammar_manager(
    args: Any, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], device: torch.device
) -> GrammarManager:
    """`args` is the engine's `ServerArgs`. Without a tokenizer, constraints are rejected."""
    if args.grammar_backend not in GRAMMAR_BACKENDS:
        raise InvalidRequestError(
            f"grammar_backend must be one of {GRAMMAR_BACKENDS}, got {args.grammar_backend!r}",
            "grammar_backend",
        )
    compiler: Any = None
    if tokenizer is not None and args.grammar_backend == "llguidance":
        from radixlm.runtime.constrained.llguidance_backend import LLGuidanceCompiler

        compiler = LLGuidanceCompiler(
            tokenizer,
            vocab_size,
            eos_ids,
            whitespace_pattern=args.constrained_json_whitespace_pattern,
        )
    elif tokenizer is not None:
        from radixlm.runtime.constrained.outlines_backend import OutlinesCompiler

        compiler = OutlinesCompiler(
            tokenizer,
            vocab_size,
            eos_ids,
            whitespace_pattern=args.constrained_json_whitespace_pattern,
            cache_dir=args.grammar_cache_dir,
        )
    # NOTE: without the radix cache a jump would recompute the whole sequence: not worth it.
    jump = not args.disable_jump_forward and not args.disable_radix_cache
    return GrammarManager(
        compiler, vocab_size, args.grammar_compile_timeout, jump, tokenizer=tokenizer, device=device
    )
