"""`select` over SGLang's native protocol: score every choice with one batched prefill.

For a state text `T` and choices `c_i`, one request carries the batch `[T + c_i]` with
`max_new_tokens=0`, `return_logprob=True` and a `logprob_start_len` just before the end of `T`,
so the runtime returns the input-token log-probabilities of (at least) each choice's tokens. The
tokens that belong to a choice are found by position: a response's entries cover the last
positions of its prompt, and the choice starts at `len(tokens(T))`, or one token earlier when the
tokenizer merged the end of `T` with the start of the choice ("token healing", as in SGLang).

Threading: pure functions; `request` must be thread-safe (it is a backend's transport).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, normalized_logprob
from radixlm.lang.errors import UnsupportedFeatureError

Entry = Sequence[Any]  # (logprob | None, token_id, token_text | None)


def select_by_logprobs(
    request: Callable[[dict[str, Any]], Any],
    tokenize: Callable[[str], list[int] | None],
    text: str,
    choices: Sequence[str],
    temperature: float,
    choices_method: ChoicesSamplingMethod,
) -> ChoicesDecision:
    if temperature > 1e-5:
        raise UnsupportedFeatureError(
            "select() with temperature > 0 is not supported: choices are scored deterministically "
            "from log-probabilities (use temperature=0)"
        )
    prefix_ids = tokenize(text)
    if prefix_ids is None:
        # No local tokenizer: ask the runtime (this also puts the prefix in its cache), as SGLang does.
        out = request({"text": text, "sampling_params": {"max_new_tokens": 0}})
        num_prefix = int(out["meta_info"]["prompt_tokens"])
    else:
        num_prefix = len(prefix_ids)

    outs = request(
        {
            "text": [text + c for c in choices],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            # NOTE: two tokens early: covers token healing under both conventions of where the
            # returned entries start (at logprob_start_len, or one after it as SGLang does).
            "logprob_start_len": max(num_prefix - 2, 0),
        }
    )
    if isinstance(outs, dict):
        outs = [outs]
    input_token_logprobs = [
        choice_entries(o["meta_info"], num_prefix, prefix_ids, text) for o in outs
    ]
    output_token_logprobs = [o["meta_info"].get("output_token_logprobs", []) for o in outs]
    normalized = [normalized_logprob(e) for e in input_token_logprobs]

    unconditional = None
    if choices_method.requires_unconditional_logprobs:
        unconditional = _unconditional(request, input_token_logprobs)
    return choices_method(
        choices=list(choices),
        normalized_prompt_logprobs=normalized,
        input_token_logprobs=input_token_logprobs,
        output_token_logprobs=output_token_logprobs,
        unconditional_token_logprobs=unconditional,
    )


def choice_entries(
    meta: dict[str, Any], num_prefix: int, prefix_ids: Sequence[int] | None, text: str
) -> list[Entry]:
    """The entries of `meta["input_token_logprobs"]` that are the choice's tokens."""
    entries = [tuple(e) for e in meta["input_token_logprobs"]]
    first_pos = int(meta["prompt_tokens"]) - len(entries)  # position of entries[0]
    start = num_prefix
    last = num_prefix - 1  # the prefix's last token: kept, or merged into the choice
    if last >= 0 and first_pos <= last < first_pos + len(entries):
        _, token_id, token_text = entries[last - first_pos][:3]
        if prefix_ids is not None:
            same = token_id == prefix_ids[last]
        else:
            same = token_text is not None and text.endswith(token_text)
        if not same:
            start = last
    return entries[max(start - first_pos, 0) :]


def _unconditional(
    request: Callable[[dict[str, Any]], Any], choice_logprobs: Sequence[Sequence[Entry]]
) -> list[list[Entry]]:
    """Score each choice's tokens alone (no prompt): the second pass of `unconditional_*`."""
    ids = [[int(e[1]) for e in entries] for entries in choice_logprobs]
    outs = request(
        {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "logprob_start_len": 0,
        }
    )
    if isinstance(outs, dict):
        outs = [outs]
    result = []
    for token_ids, o in zip(ids, outs, strict=True):
        entries = [tuple(e) for e in o["meta_info"]["input_token_logprobs"]][-len(token_ids) :]
        # NOTE: the first token has no logprob (no context); a runtime may leave its entry out.
        missing = [(None, t, None) for t in token_ids[: len(token_ids) - len(entries)]]
        result.append(missing + entries if token_ids else [])
    return result
