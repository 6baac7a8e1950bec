"""`radixlm bench serving`: a load generator against a running server (radixlm or any
OpenAI-compatible one), reporting request / token throughput and TTFT, TPOT, ITL, E2E percentiles.

    radixlm serve --port 30000 &
    radixlm bench serving --base-url http://127.0.0.1:30000 --dataset random --num-prompts 64 \\
        --random-input-len 256 --random-output-len 32 --max-concurrency 8
    radixlm bench serving --base-url http://127.0.0.1:8000 --backend openai --model my-model

Backends: `radixlm` (native `/generate`, SSE), `openai` (`/v1/completions`), `openai-chat`
(`/v1/chat/completions`); every request streams. Arrivals: `--request-rate` requests/s (Poisson;
`inf` sends all at once), capped by `--max-concurrency` requests in flight. Datasets are generated
locally (no downloads), from whole-word tokens of a tokenizer (the default model's unless
`--tokenizer`), so prompt lengths are exact in that tokenizer: `random` (lengths uniform in
[len * (1 - range_ratio), len]) and `shared-prefix` (groups of questions behind one long system
prompt: what a prefix cache is for). Outputs have fixed lengths (`ignore_eos`) unless
`--disable-ignore-eos`. Metrics: TTFT = first streamed text; ITL = gaps between streamed chunks;
TPOT = (E2E - TTFT) / (output tokens - 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx


@dataclass
class Request:
    prompt: str
    prompt_len: int
    output_len: int


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


# ---- datasets -------------------------------------------------------------------------------------
def word_tokens(tokenizer: Any) -> list[str]:
    """Vocabulary entries that are one lowercase word with a leading space: a sequence of them
    tokenizes back to exactly one token per word."""
    words = []
    for tid in range(min(len(tokenizer), 60000)):
        text = tokenizer.decode([tid])
        if re.fullmatch(r" [a-z]{2,10}", text) and tokenizer.encode(
            text, add_special_tokens=False
        ) == [tid]:
            words.append(text)
    return words


def _text(rng: random.Random, words: list[str], n: int) -> str:
    return "".join(rng.choice(words) for _ in range(n)).lstrip()


def random_dataset(
    words: list[str], rng: random.Random, num: int, in_len: int, out_len: int, ratio: float
) -> list[Request]:
    reqs = []
    for _ in range(num):
        n_in = rng.randint(max(1, int(in_len * (1 - ratio))), in_len)
        n_out = rng.randint(max(1, int(out_len * (1 - ratio))), out_len)
        reqs.append(Request(_text(rng, words, n_in), n_in, n_out))
    return reqs


def shared_prefix_dataset(words: list[str], rng: random.Random, groups: int, per_group: int,
                          system_len: int, question_len: int, out_len: int) -> list[Request]:  # fmt: skip
    reqs = []
    for _ in range(groups):
        system = _text(rng, words, system_len)
        for _ in range(per_group):
            question = _text(rng, words, question_len)
            reqs.append(
                Request(
                    f"{system}\nQuestion: {question}\nAnswer:",
                    system_len + question_len + 5,
                    out_len,
                )
            )
    rng.shuffle(reqs)
    return reqs


# ---- one request --------------------------------------------------------------------------------
def payload(backend: str, model: str, req: Request, ignore_eos: bool) -> tuple[str, dict[str, Any]]:
    extra = {"ignore_eos": True} if ignore_eos else {}
    if backend == "radixlm":
        sp = {"max_new_tokens": req.output_len, "temperature": 0.0, **extra}
        return "/generate", {"text": req.prompt, "sampling_params": sp, "stream": True}
    common = {"model": model, "max_tokens": req.output_len, "temperature": 0.0, "stream": True,
              "stream_options": {"include_usage": True}, **extra}  # fmt: skip
    if backend == "openai":
        return "/v1/completions", {"prompt": req.prompt, **common}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": req.prompt}], **common}


def _delta(backend: str, obj: dict[str, Any], seen: str) -> tuple[str, dict[str, Any] | None]:
    """(new text, usage-like info) of one SSE event."""
    if backend == "radixlm":
        meta = obj["meta_info"]
        info = {"prompt_tokens": meta["prompt_tokens"], "output_tokens": meta["completion_tokens"],
                "cached_tokens": meta.get("cached_tokens", 0)}  # fmt: skip
        return obj["text"][len(seen) :], info
    usage = obj.get("usage")
    info = None
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        info = {"prompt_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                "cached_tokens": details.get("cached_tokens") or 0}  # fmt: skip
    text = ""
    for choice in obj.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text, info


async def run_one(
    client: httpx.AsyncClient, backend: str, model: str, req: Request, ignore_eos: bool
) -> Result:
    path, body = payload(backend, model, req, ignore_eos)
    res = Result(prompt_tokens=req.prompt_len)
    start = last = time.perf_counter()
    text, chunks = "", 0
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:200]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res.error = str(obj["error"])[:200]
                    return res
                delta, info = _delta(backend, obj, text)
                now = time.perf_counter()
                if delta:
                    if chunks == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last, chunks = now, chunks + 1
                    text += delta
                if info:
                    res.prompt_tokens, res.output_tokens = (
                        info["prompt_tokens"],
                        info["output_tokens"],
                    )
                    res.cached_tokens = info["cached_tokens"]
        res.e2e = time.perf_counter() - start
        res.output_tokens = res.output_tokens or chunks
        res.ok = chunks > 0
        res.error = "" if res.ok else "no output"
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


# ---- the run ------------------------------------------------------------------------------------
async def run_benchmark(
    args: argparse.Namespace, reqs: list[Request]
) -> tuple[list[Result], float]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(
        max_connections=args.max_concurrency or len(reqs), max_keepalive_connections=64
    )
    async with httpx.AsyncClient(
        base_url=args.base_url, headers=headers, limits=limits, timeout=3600.0
    ) as client:
        for req in reqs[: args.warmup_requests]:
            await run_one(
                client,
                args.backend,
                args.model,
                Request(req.prompt, req.prompt_len, 4),
                args.ignore_eos,
            )
        gate = asyncio.Semaphore(args.max_concurrency or len(reqs))
        rng = random.Random(args.seed + 1)

        async def limited(req: Request) -> Result:
            async with gate:
                return await run_one(client, args.backend, args.model, req, args.ignore_eos)

        start = time.perf_counter()
        tasks = []
        for req in reqs:
            tasks.append(asyncio.ensure_future(limited(req)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(results: list[Result], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    output = sum(r.output_tokens for r in ok)
    out: dict[str, Any] = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "total_input_tokens": prompt, "total_output_tokens": output,
        "cached_tokens": sum(r.cached_tokens for r in ok),
        "request_throughput": len(ok) / duration, "input_throughput": prompt / duration,
        "output_throughput": output / duration, "total_throughput": (prompt + output) / duration,
        "concurrency": sum(r.e2e for r in ok) / duration,
    }  # fmt: skip
    series = {
        "ttft_ms": [r.ttft * 1000 for r in ok],
        "tpot_ms": [
            (r.e2e - r.ttft) / (r.output_tokens - 1) * 1000 for r in ok if r.output_tokens > 1
        ],
        "itl_ms": [g * 1000 for r in ok for g in r.itl],
        "e2e_ms": [r.e2e * 1000 for r in ok],
    }
    for name, values in series.items():
        out[name] = {"mean": sum(values) / len(values) if values else float("nan"),
                     **{f"p{q}": _pct(values, q) for q in (50, 95, 99)}}  # fmt: skip
    out["errors"] = sorted({r.error for r in results if not r.ok})[:5]
    return out


def print_report(args: argparse.Namespace, s: dict[str, Any]) -> None:
    rows = [
        ("Backend / dataset", f"{args.backend} / {args.dataset}"),
        (
            "Request rate / max concurrency",
            f"{args.request_rate} / {args.max_concurrency or 'unbounded'}",
        ),
        ("Successful / failed requests", f"{s['completed']} / {s['failed']}"),
        ("Benchmark duration (s)", f"{s['duration_s']:.2f}"),
        ("Input / output tokens", f"{s['total_input_tokens']} / {s['total_output_tokens']}"),
        ("Cached prompt tokens (server-reported)", f"{s['cached_tokens']}"),
        ("Request throughput (req/s)", f"{s['request_throughput']:.3f}"),
        ("Input token throughput (tok/s)", f"{s['input_throughput']:.1f}"),
        ("Output token throughput (tok/s)", f"{s['output_throughput']:.1f}"),
        ("Total token throughput (tok/s)", f"{s['total_throughput']:.1f}"),
        ("Mean concurrency", f"{s['concurrency']:.2f}"),
    ]
    print(f"{'=' * 22} Serving benchmark {'=' * 22}")
    for name, value in rows:
        print(f"{name:<40}{value:>22}")
    print(f"{'(ms)':<12}{'mean':>12}{'p50':>12}{'p95':>12}{'p99':>12}")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        m = s[key]
        print(
            f"{key[:-3].upper():<12}"
            + "".join(f"{m[k]:>12.1f}" for k in ("mean", "p50", "p95", "p99"))
        )
    for err in s["errors"]:
        print(f"error: {err}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench serving", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--backend", choices=("radixlm", "openai", "openai-chat"), default="radixlm")
    p.add_argument("--model", default="default", help="`model` field of OpenAI requests")
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset", choices=("random", "shared-prefix"), default="random")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--random-input-len", type=int, default=256)
    p.add_argument("--random-output-len", type=int, default=32)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--gsp-num-groups", type=int, default=4)
    p.add_argument("--gsp-prompts-per-group", type=int, default=8)
    p.add_argument("--gsp-system-prompt-len", type=int, default=512)
    p.add_argument("--gsp-question-len", type=int, default=32)
    p.add_argument("--gsp-output-len", type=int, default=32)
    p.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="requests/s (Poisson); inf: all at once",
    )
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument(
        "--tokenizer", default=None, help="tokenizer (HF folder or GGUF) for the prompts"
    )
    p.add_argument("--disable-ignore-eos", dest="ignore_eos", action="store_false")
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output-file", default=None, help="write the summary as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    from radixlm.runtime.frontend.tokenizer import load_server_tokenizer
    from radixlm.runtime.server_args import ServerArgs

    tokenizer = load_server_tokenizer(ServerArgs(tokenizer_path=args.tokenizer))
    words = word_tokens(tokenizer)
    rng = random.Random(args.seed)
    if args.dataset == "random":
        reqs = random_dataset(words, rng, args.num_prompts, args.random_input_len,
                              args.random_output_len, args.random_range_ratio)  # fmt: skip
    else:
        reqs = shared_prefix_dataset(words, rng, args.gsp_num_groups, args.gsp_prompts_per_group,
                                     args.gsp_system_prompt_len, args.gsp_question_len, args.gsp_output_len)  # fmt: skip
    results, duration = asyncio.run(run_benchmark(args, reqs))
    summary = summarize(results, duration)
    print_report(args, summary)
    if args.output_file:
        with open(args.output_file, "w") as f:
            json.dump(
                {"args": vars(args), "summary": summary, "results": [asdict(r) for r in results]},
                f,
                indent=1,
            )
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
