"""`radixlm bench programs`: generation programs with and without program-aware caching, and vs
plain per-request Hugging Face `transformers` generate, in one run on the same model.

Workloads (the same programs run on every backend):
- few_shot: many questions after one long shared few-shot prefix (`gen` per program);
- branch: a shared context, `fork(3)` with one `gen` per branch, then a `select` per program.

Modes:
- `radixlm+precache`: `run_batch` traces the program and caches the shared prefix before the
  fan-out (the default);
- `radixlm`: the same with `precache=False` (the radix cache still shares what it sees);
- `transformers`: an in-bench backend that serves each request alone with `model.generate`
  (greedy, batch 1, no cache reuse) and scores each `select` choice with its own forward pass.
  It runs the first `--transformers-programs` programs; speedups are ratios of programs/s.

The engine's cache is flushed before each radixlm mode. Prints a table; `--json PATH` writes it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import radixlm.interpreter.api as rl
from radixlm.interpreter.backend import Backend
from radixlm.interpreter.engine_backend import EngineBackend
from radixlm.lang.chat_template import ChatTemplate, from_tokenizer
from radixlm.lang.choices import ChoicesDecision, normalized_logprob
from radixlm.lang.sampling import SamplingParams

COUNTRIES = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Peru", "Lima"),
    ("Kenya", "Nairobi"), ("Norway", "Oslo"), ("Chile", "Santiago"), ("India", "New Delhi"),
    ("Greece", "Athens"), ("Cuba", "Havana"), ("Poland", "Warsaw"), ("Ireland", "Dublin"),
    ("Austria", "Vienna"), ("Sweden", "Stockholm"), ("Portugal", "Lisbon"), ("Turkey", "Ankara"),
]  # fmt: skip


def few_shot_prefix(num_shots: int) -> str:
    shots = [COUNTRIES[i % len(COUNTRIES)] for i in range(num_shots)]
    lines = ["Answer each question with the capital city only.\n"]
    for country, capital in shots:
        lines.append(
            f"Q: What is the capital city of the country called {country}?\nA: {capital}\n"
        )
    return "".join(lines)


def make_programs(num_shots: int, max_tokens: int) -> dict[str, rl.Function]:
    prefix = few_shot_prefix(num_shots)

    @rl.function
    def few_shot(s, country):
        s += prefix
        s += "Q: What is the capital city of the country called " + country + "?\n"
        s += "A:" + rl.gen("answer", max_tokens=max_tokens, stop="\n")

    context = prefix + "\nNow some travel advice.\n"

    @rl.function
    def branch(s, country):
        s += context
        s += "Three things to do in " + country + ":\n"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"{i + 1}." + rl.gen("idea", max_tokens=max_tokens, stop="\n")
        forks.join()
        s += "The best time to visit is in"
        s += rl.select("season", [" spring", " summer", " autumn", " winter"])

    return {"few_shot": few_shot, "branch": branch}


class TransformersBackend(Backend):
    """Plain per-request `transformers` generate: one request at a time, nothing cached."""

    def __init__(self, model: Any, tokenizer: Any, chat_template: ChatTemplate) -> None:
        self.model, self.tokenizer, self._template = model, tokenizer, chat_template
        self._lock = threading.Lock()
        self.generated_tokens = 0

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    def generate(self, text: str, params: SamplingParams) -> tuple[str, dict[str, Any]]:
        import torch

        ids = torch.tensor([self.tokenizer.encode(text)])
        with self._lock, torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=params.max_new_tokens,
                do_sample=False,
                stop_strings=list(params.stop or ()) or None,
                tokenizer=self.tokenizer,
                pad_token_id=self.tokenizer.eos_token_id,
            )
        new = out[0, ids.shape[1] :].tolist()
        self.generated_tokens += len(new)
        completion = self.tokenizer.decode(new, skip_special_tokens=True)
        for stop in params.stop or ():
            completion = completion.split(stop)[0]
        meta = {"prompt_tokens": ids.shape[1], "completion_tokens": len(new), "cached_tokens": 0}
        return completion, meta

    def select(self, text, choices, temperature, choices_method) -> ChoicesDecision:
        import torch

        prefix_len = len(self.tokenizer.encode(text))
        scores = []
        for choice in choices:
            ids = self.tokenizer.encode(text + choice)
            with self._lock, torch.inference_mode():
                logits = self.model(torch.tensor([ids])).logits[0]
            logprobs = torch.log_softmax(logits.float(), -1)
            start = min(prefix_len, len(ids) - 1)
            entries = [
                (float(logprobs[p - 1, ids[p]]), ids[p], None)
                for p in range(max(start, 1), len(ids))
            ]
            scores.append(normalized_logprob(entries))
        best = max(range(len(choices)), key=scores.__getitem__)
        return ChoicesDecision(choices[best], {"normalized_prompt_logprobs": scores})


@dataclass(frozen=True)
class Row:
    workload: str
    mode: str
    programs: int
    seconds: float
    programs_per_s: float
    cache_hit_rate: float | None
    speedup_vs_transformers: float | None = None


class CountingEngineBackend(EngineBackend):
    """The engine backend, counting prompt and cached tokens over every request it sends."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self._count_lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._count_lock:
            self.prompt_tokens = self.cached_tokens = 0

    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def _request(self, payload: dict[str, Any]) -> Any:
        out = super()._request(payload)
        with self._count_lock:
            for o in out if isinstance(out, list) else [out]:
                self.prompt_tokens += o["meta_info"]["prompt_tokens"]
                self.cached_tokens += o["meta_info"].get("cached_tokens", 0)
        return out


def run_workload(
    name: str, program: rl.Function, backend: Backend, mode: str, num_programs: int
) -> Row:
    batch = [{"country": COUNTRIES[i % len(COUNTRIES)][0]} for i in range(num_programs)]
    if isinstance(backend, CountingEngineBackend):
        backend.flush_cache()
        backend.reset()
    start = time.perf_counter()
    states = program.run_batch(
        batch, backend=backend, temperature=0, precache=(mode == "radixlm+precache"),
        num_threads=1 if mode == "transformers" else "auto",
    )  # fmt: skip
    seconds = time.perf_counter() - start
    failed = [s.error() for s in states if s.error() is not None]
    if failed:
        raise RuntimeError(f"{name}/{mode}: {len(failed)} programs failed, first: {failed[0]!r}")
    hit = backend.hit_rate() if isinstance(backend, CountingEngineBackend) else None
    return Row(name, mode, len(states), seconds, len(states) / seconds, hit)


def format_table(rows: Sequence[Row]) -> str:
    head = f"{'workload':10s} {'mode':18s} {'programs':>8s} {'seconds':>8s} {'prog/s':>8s} {'cache hit':>9s} {'vs HF':>7s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        hit = "-" if r.cache_hit_rate is None else f"{100 * r.cache_hit_rate:.0f}%"
        speed = "-" if r.speedup_vs_transformers is None else f"{r.speedup_vs_transformers:.1f}x"
        lines.append(
            f"{r.workload:10s} {r.mode:18s} {r.programs:8d} {r.seconds:8.2f} {r.programs_per_s:8.2f} {hit:>9s} {speed:>7s}"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="radixlm bench programs", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["few_shot", "branch", "all"], default="all")
    p.add_argument("--num-programs", type=int, default=32)
    p.add_argument(
        "--num-shots", type=int, default=20, help="few-shot examples in the shared prefix"
    )
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--model-path", default=None)
    p.add_argument("--skip-transformers", action="store_true", help="only compare radixlm modes")
    p.add_argument(
        "--transformers-programs",
        type=int,
        default=8,
        help="programs per workload for the (sequential, slow) transformers baseline",
    )
    p.add_argument("--json", default=None, help="write the rows as JSON to this path")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from radixlm.runtime.frontend.engine import Engine

    programs = make_programs(args.num_shots, args.max_tokens)
    workloads = list(programs) if args.workload == "all" else [args.workload]
    rows: list[Row] = []
    engine_args = {} if args.model_path is None else {"model_path": args.model_path}
    with Engine(**engine_args) as engine:
        backend = CountingEngineBackend(engine)
        for name in workloads:
            programs[name].run(country="Chad", backend=backend, temperature=0)  # warm up
            for mode in ("radixlm+precache", "radixlm"):
                rows.append(run_workload(name, programs[name], backend, mode, args.num_programs))
                print(format_table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    if not args.skip_transformers:
        from radixlm.runtime.models.hf_reference import HFReference

        ref = HFReference.load(args.model_path)  # the very weights the engine serves
        hf = TransformersBackend(ref.model, ref.tokenizer, from_tokenizer(ref.tokenizer))
        for name in workloads:
            n = min(args.num_programs, args.transformers_programs)
            hf_row = run_workload(name, programs[name], hf, "transformers", n)
            rows.append(hf_row)
            # NOTE: a ratio of throughputs (programs/s): the baseline serves one request at a
            # time, so its throughput does not depend on how many programs it is given.
            rows = [
                Row(
                    **{
                        **asdict(r),
                        "speedup_vs_transformers": r.programs_per_s / hf_row.programs_per_s,
                    }
                )
                if r.workload == name
                else r
                for r in rows
            ]
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
