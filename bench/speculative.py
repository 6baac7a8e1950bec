"""`radixlm bench speculative`: decode tokens/s with speculative decoding off and on, side by side
in one run, on the same model and prompts (issue 25's CPU table; docs/speculative.md).

Two engines run the same model: one plain, one with `--speculative-algorithm` (NGRAM by default).
Each workload (bench/speculative_workloads.py: rewrite, rewrite-after, extract, code, chat) is one
chat message with the model's chat template applied, sent `--batch-size` times at once (batch 1 by
default), greedy, up to `--max-new-tokens` tokens. Every repeat runs both engines, in alternating
order (off then on, then on then off, ...), with their prefix caches flushed; the table shows
medians.

What is measured, per engine and repeat: decode tokens/s, streamed. The window starts when the
last request of the batch has its first token (every prefill is done) and ends at the last token;
the rate is the tokens that arrived in that window over its length. Prefill is excluded.

Next to every speedup: `accept_len`, the mean tokens committed per verify step (bonus token
included; from each request's `meta_info["spec_accept_length"]`, weighted by its
`spec_verify_ct`, its decode steps with speculation on), and `accept_rate`, the tokens a step
adds beyond one as a fraction of the most it can add: (accept_len - 1) / (num_draft_tokens - 1),
where num_draft_tokens counts the rows verified per step, the first being the last committed
token (SGLang's convention). `drafted` is the draft tokens the engine verified in the run (its
`spec_draft_tokens` counter; median over repeats): 0 means every step was the plain decode step,
so the speedup is the per-step cost of speculation's bookkeeping plus the machine's noise.
`identical` says whether both engines produced the same tokens (greedy decoding must be exact).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from radixlm.bench.common import print_table, write_json
from radixlm.bench.speculative_workloads import WORKLOADS


class Sample(NamedTuple):
    """One engine's run of one workload (all requests of the batch)."""

    decode_tok_s: float | None  # None: no token arrived after the last prefill (too short a run)
    output_tokens: int  # all requests together
    outputs: list[list[int]]  # token ids per request
    verify_steps: int | None  # speculative verify steps, all requests (None: no meta_info keys)
    accept_length: float | None  # mean tokens per verify step, weighted by steps
    # draft tokens the engine verified during the run (its `spec_draft_tokens` counter; None:
    # not reported). 0 on a speculative engine: every step was the plain decode step.
    drafted: int | None = None


def chat_prompt(tokenizer: Any, message: str) -> str:
    """The user message in the model's chat template, ready for the assistant's answer."""
    messages = [{"role": "user", "content": message}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def spec_stats(metas: Sequence[dict[str, Any]]) -> tuple[int | None, float | None]:
    """(verify steps, mean accepted length weighted by steps) over finished requests' meta_info;
    (None, None) when they carry no speculative keys (speculation off, or not reported)."""
    steps = accepted = 0.0
    seen = False
    for meta in metas:
        ct, length = meta.get("spec_verify_ct"), meta.get("spec_accept_length")
        if ct is None or length is None:
            continue
        seen = True
        steps += ct
        accepted += ct * length
    if not seen:
        return None, None
    return int(steps), (accepted / steps if steps else None)


def decode_rate(events: Sequence[tuple[float, int, int]]) -> float | None:
    """Decode tokens/s from stream events `(time, request index, tokens so far)`: the tokens that
    arrived after the last request's first token, over the time from then to the last event."""
    first: dict[int, float] = {}
    for t, i, _ in events:
        first.setdefault(i, t)
    start = max(first.values())
    end = max(t for t, _, _ in events)
    at_start: dict[int, int] = {}
    final: dict[int, int] = {}
    for t, i, n in events:
        final[i] = max(final.get(i, 0), n)
        if t <= start:
            at_start[i] = max(at_start.get(i, 0), n)
    tokens = sum(final.values()) - sum(at_start.values())
    if tokens <= 0 or end <= start:
        return None
    return tokens / (end - start)


def measure(engine: Any, prompt: str, batch_size: int, params: dict[str, Any]) -> Sample:
    """Run `batch_size` copies of `prompt` at once, streamed, on a flushed prefix cache."""
    engine.flush_cache()
    before = engine.get_server_info().get("spec_draft_tokens")
    prompts: str | list[str] = prompt if batch_size == 1 else [prompt] * batch_size
    events: list[tuple[float, int, int]] = []
    final: dict[int, dict[str, Any]] = {}
    for chunk in engine.generate(prompts, params, stream=True):
        index = chunk.get("index", 0)
        events.append((time.perf_counter(), index, len(chunk["output_ids"])))
        if chunk["meta_info"].get("finish_reason") is not None:
            final[index] = chunk
    outs = [final[i] for i in sorted(final)]
    steps, accept = spec_stats([o["meta_info"] for o in outs])
    after = engine.get_server_info().get("spec_draft_tokens")
    drafted = after - before if after is not None and before is not None else None
    return Sample(
        decode_rate(events),
        sum(len(o["output_ids"]) for o in outs),
        [list(o["output_ids"]) for o in outs],
        steps,
        accept,
        drafted,
    )


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def summarize(
    workload: str, batch_size: int, off: Sequence[Sample], on: Sequence[Sample],
    num_draft_tokens: int | None,
) -> dict[str, Any]:  # fmt: skip
    """One table row: medians over the repeats of each side, the speedup, the acceptance."""
    off_rate = _median([s.decode_tok_s for s in off])
    on_rate = _median([s.decode_tok_s for s in on])
    accept = _median([s.accept_length for s in on])
    rate = None
    if accept is not None and num_draft_tokens is not None and num_draft_tokens > 1:
        rate = (accept - 1) / (num_draft_tokens - 1)
    steps = _median([s.verify_steps for s in on])
    drafted = _median([s.drafted for s in on])
    return {
        "workload": workload,
        "batch": batch_size,
        "out_tokens": on[-1].output_tokens,
        "off_tok_s": off_rate,
        "on_tok_s": on_rate,
        "speedup": on_rate / off_rate if on_rate and off_rate else None,
        "accept_len": accept,
        "accept_rate": rate,
        "verify_steps": None if steps is None else int(steps),
        "drafted": None if drafted is None else int(drafted),
        "identical": all(a.outputs == b.outputs for a, b in zip(off, on)),
    }


def run(
    engines: dict[str, Any], prompts: dict[str, str], batch_size: int, params: dict[str, Any],
    repeats: int, num_draft_tokens: int | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every workload on both engines ("off", "on"), alternating their order per repeat."""
    for eng in engines.values():  # warm-up: first-call costs stay out of the first repeat
        eng.generate("Hello", {"max_new_tokens": 4, "temperature": 0})
    rows = []
    for name, prompt in prompts.items():
        samples: dict[str, list[Sample]] = {"off": [], "on": []}
        for r in range(repeats):
            for side in ("off", "on") if r % 2 == 0 else ("on", "off"):
                samples[side].append(measure(engines[side], prompt, batch_size, params))
        rows.append(summarize(name, batch_size, samples["off"], samples["on"], num_draft_tokens))
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="radixlm bench speculative",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--speculative-algorithm", default="NGRAM")
    parser.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    parser.add_argument("--speculative-num-steps", type=int, default=None)
    parser.add_argument("--speculative-eagle-topk", type=int, default=None)
    parser.add_argument("--speculative-draft-model-path", default=None)
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"of {', '.join(WORKLOADS)}"
    )
    parser.add_argument("--repeats", type=int, default=3, help="median of N per side")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument(
        "--ignore-eos", action="store_true", help="always decode --max-new-tokens tokens"
    )
    parser.add_argument("--model-path", default=None, help="default: the default model")
    parser.add_argument("--load-format", default=None, help="dummy: random weights of a preset")
    parser.add_argument("--tokenizer-path", default=None, help="default: the model's")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.repeats < 1 or args.batch_size < 1 or args.max_new_tokens < 1:
        parser.error("--repeats, --batch-size and --max-new-tokens must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    from radixlm.runtime.frontend.engine import Engine

    args = parse_args(argv)
    common: dict[str, Any] = {"log_level": "warning"}
    for key in ("model_path", "load_format", "tokenizer_path", "device", "num_threads"):
        if getattr(args, key) is not None:
            common[key] = getattr(args, key)
    spec: dict[str, Any] = {"speculative_algorithm": args.speculative_algorithm}
    for key in ("speculative_num_draft_tokens", "speculative_num_steps",
                "speculative_eagle_topk", "speculative_draft_model_path"):  # fmt: skip
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 0,
              "ignore_eos": args.ignore_eos}  # fmt: skip
    with Engine(**common) as off, Engine(**common, **spec) as on:
        info = on.get_server_info()
        draft = info.get("speculative_num_draft_tokens") or args.speculative_num_draft_tokens
        prompts = {n: chat_prompt(on.tokenizer, WORKLOADS[n]) for n in args.workloads.split(",")}
        rows = run({"off": off, "on": on}, prompts, args.batch_size, params, args.repeats, draft)
        device, mode = info.get("device", "?"), info.get("weight_mode", "?")
    title = (
        f"speculative decoding off vs on ({args.speculative_algorithm}, "
        f"num_draft_tokens={draft}), decode tok/s, median of {args.repeats}, {device}, {mode}"
    )
    print_table(title, rows)
    if any(r["accept_len"] is None for r in rows):
        print("accept_len empty: the engine reported no spec_verify_ct / spec_accept_length")
    write_json(
        args.json,
        {"config": {**spec, **common, **params, "num_draft_tokens": draft,
                    "repeats": args.repeats, "batch_size": args.batch_size},
         "rows": rows},
    )  # fmt: skip
    return 0
