"""`radixlm bench gpu --sections spec`: what a speculative verify step costs the target model
(issue 25's H200 rows), on the model runner alone (no scheduler, no drafter), with forced
acceptance.

A verify step of one request checks k draft tokens in one forward of k + 1 rows: the request's
last committed token and its k drafts, at consecutive positions p .. p + k, all in the request's
own `req_to_token` row, each row attending to the tokens up to and including itself (seq_lens
p + 1 .. p + k + 1). Here the drafts are the target's own greedy continuation (computed first by
plain decode steps), so every draft is accepted: the step commits k + 1 tokens (the bonus token
included), and `accepted` in the output confirms it (dummy weights in bf16 may have near-ties that
break a match; the count is printed, not assumed).

Printed, per k (batch 1, `--model`'s shapes, dummy weights, `context` tokens already cached):
  decode_ms     one plain decode forward (1 row) + logits + argmax
  verify_ms     one verify forward (k + 1 rows) + logits + argmax
  ms_per_token  verify_ms / (k + 1): the cost of each accepted token when all are accepted
  bound_tok_s   (k + 1) / verify_ms: the tokens/s bound with every draft accepted and a free
                drafter; `bound_x` = that over plain decode (1 / decode_ms)
  tok_s_at_3    3 / verify_ms: the bound at an accepted length of 3 (a real EAGLE head's), with
                the drafter's own cost left out; `x_at_3` = that over plain decode
The batch sweep (B requests, each verifying k + 1 rows, against B rows of plain decode): per
(k, B) `pays_x` = (k + 1) * time(B rows) / time(B * (k + 1) rows), the speedup bound with all
accepted, and `pays_x_at_3` with 3 accepted; the crossover batch is the smallest B where it is
below 1 (speculation stops paying), or None when it still pays at the largest B.

The verify forward is the speculative step's own: a tree verify batch (tree.verify_forward_batch,
a chain of k + 1 nodes per request, the tree-mask attention) through `ModelRunner.forward`, which
replays a verify CUDA graph where one fits (executor/verify_graphs.py: captured here for every
k + 1 and every batch size of the decode ladder up to the largest B); plain decode replays the
decode graphs (up to the largest B). `mode` says how the forwards ran (`decode/verify` where
the two differ): `graph` (for the verify forward: it did replay a verify graph, the runner's
replay counter moved) or `eager` (on CPU, with --disable-cuda-graph, or above the captured
sizes). Runs on CPU too (the
tests use a tiny preset): `python -m radixlm.bench.gpu_spec --model tiny-llama --device cpu`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from radixlm.bench.common import print_table

KS = (2, 3, 4, 5, 6, 7, 8)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CONTEXT = 256  # prompt tokens already in the KV pool when the timed steps run


class Timing(NamedTuple):
    ms: float  # median milliseconds of one forward + logits + argmax
    mode: str  # graph | eager


class VerifyBench:
    """A `ModelRunner` with `max_batch` requests of `context` cached tokens (random ids, prefilled)
    and room for `max_k + 2` more each; `tokens[b]` is request b's greedy continuation
    (`max_k + 2` tokens: the first from the prefill's logits, the rest from plain decode steps).
    Owns the runner: every slot it allocates stays with it (it is built for one measurement)."""

    def __init__(
        self, model: str, max_batch: int, max_k: int, context: int = CONTEXT, *,
        device: str | None = None, load_format: str = "dummy", dtype: str | None = None,
        graphs: bool = True, num_threads: int | None = None, seed: int = 0,
        ks: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        """`ks`: the draft counts whose verify forwards get CUDA graphs (None: 1 .. max_k)."""
        from radixlm.runtime.executor.model_runner import ModelRunner
        from radixlm.runtime.models.loader import resolve_model
        from radixlm.runtime.server_args import ServerArgs

        self.max_batch, self.max_k, self.context = max_batch, max_k, context
        rows = max_batch * (max_k + 1)
        per_req = context + max_k + 2
        extra: dict[str, Any] = {"dtype": dtype} if dtype else {}
        if num_threads is not None:
            extra["num_threads"] = num_threads
        args = ServerArgs(
            model_path=model, load_format=load_format, skip_tokenizer_init=True, device=device,
            max_running_requests=rows, max_total_tokens=2 * max(rows, max_batch * per_req) + 64,
            cuda_graph_max_bs=max_batch, disable_cuda_graph=not graphs, random_seed=seed,
            context_length=per_req + 8, **extra,
        )  # fmt: skip
        self.runner = ModelRunner(args, resolve_model(model, load_format))
        nodes = [k + 1 for k in (ks or range(1, max_k + 1))]
        self.runner.capture_verify_graphs(nodes, max_bs=max_batch)  # no-op without graphs
        self.device = self.runner.device
        self.reqs = [self.runner.req_to_token.alloc() for _ in range(max_batch)]
        for row in self.reqs:
            slots = self.runner.kv_pool.allocator.alloc(per_req)
            assert row is not None and slots is not None
            self.runner.req_to_token.write(row, 0, slots)
        gen = torch.Generator().manual_seed(seed)
        vocab = self.runner.config.vocab_size
        prompts = torch.randint(3, vocab, (max_batch, context), generator=gen)
        first = self._prefill(prompts)
        self.tokens = self._greedy(first, max_k + 2)

    # ---- batches -------------------------------------------------------------------------------
    def _t(self, values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64, device=self.device)

    def _slots(self, req: int, start: int, n: int) -> list[int]:
        return self.runner.req_to_token.table[req, start : start + n].tolist()

    def _prefill(self, prompts: torch.Tensor) -> list[int]:
        """Prefill each request (one EXTEND forward per request); its first greedy token."""
        from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
        from radixlm.runtime.sampling.sampler import argmax

        n, out = self.context, []
        for b, req in enumerate(self.reqs):
            batch = ForwardBatch(
                ForwardMode.EXTEND, 1, prompts[b].to(self.device), self._t(range(n)),
                self._t(self._slots(req, 0, n)), self._t([req]), self._t([n]), [n], [0], [n],
                self._t([0]), self._t([n]), self._t([0]), self._t([n - 1]), [n - 1],
            )  # fmt: skip
            out.append(int(argmax(self.runner.compute_logits(self.runner.forward(batch)))[0]))
        return out

    def rows_batch(self, batch_size: int, k: int, ids: list[list[int]], offset: int = 0) -> Any:
        """A DECODE-mode forward of `batch_size` requests with k + 1 rows each: request b's rows
        hold `ids[b][offset : offset + k + 1]` at positions context + offset + (0 .. k), in its
        own req_to_token row, with seq_lens one past each position (k = 0: plain decode)."""
        from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode

        reqs, start = self.reqs[:batch_size], self.context + offset
        pos = [start + j for _ in reqs for j in range(k + 1)]
        slots = [s for req in reqs for s in self._slots(req, start, k + 1)]
        seq = [p + 1 for p in pos]
        flat = [t for b in range(batch_size) for t in ids[b][offset : offset + k + 1]]
        return ForwardBatch(
            ForwardMode.DECODE, len(pos), self._t(flat), self._t(pos), self._t(slots),
            self._t([req for req in reqs for _ in range(k + 1)]), self._t(seq), seq,
        )  # fmt: skip

    def verify_batch(self, batch_size: int, k: int, ids: list[list[int]]) -> Any:
        """The speculative step's verify forward of `batch_size` requests, each a chain of k + 1
        nodes `ids[b][: k + 1]` after its `context` cached tokens (its draft slots: the next
        k + 1 of its own row), every row's output, in `rows_batch`'s row order."""
        from radixlm.runtime.speculative.tree import (
            build_tree,
            chain_parents,
            verify_forward_batch,
        )

        reqs, n = self.reqs[:batch_size], k + 1
        prefix = [self.context] * batch_size
        tree = build_tree(chain_parents([n] * batch_size, n), torch.tensor(prefix))
        loc = self._t([s for req in reqs for s in self._slots(req, self.context, n)])
        flat = self._t([t for b in range(batch_size) for t in ids[b][:n]])
        return verify_forward_batch(flat, self._t(reqs), prefix, loc.view(batch_size, n), tree)

    def _greedy(self, first: list[int], n: int) -> list[list[int]]:
        """`n` greedy tokens per request: `first`, then plain decode steps of all requests."""
        tokens = [[t] for t in first]
        for step in range(n - 1):
            nxt = self.predict(self.rows_batch(self.max_batch, 0, tokens, offset=step))
            for t, x in zip(tokens, nxt):
                t.append(int(x))
        return tokens

    # ---- measurements --------------------------------------------------------------------------
    def predict(self, batch: Any) -> list[int]:
        """The target's greedy token after each row of `batch`."""
        from radixlm.runtime.sampling.sampler import argmax

        return argmax(self.runner.compute_logits(self.runner.forward(batch))).tolist()

    def accepted(self, batch_size: int, k: int, drafts: list[list[int]] | None = None) -> list[int]:
        """Per request, the tokens a greedy verify step of its k drafts commits: the drafts the
        target predicts from the rows before them, then its own next token (the bonus; k + 1 in
        all when every draft matches). The drafts are `tokens` (the target's greedy continuation:
        forced acceptance) unless given; `drafts[b][0]` is the request's last committed token."""
        out = self.predict(self.verify_batch(batch_size, k, drafts or self.tokens))
        result = []
        for b in range(batch_size):
            rows = out[b * (k + 1) : (b + 1) * (k + 1)]
            given = (drafts or self.tokens)[b][1 : k + 1]
            n = 0
            while n < k and rows[n] == given[n]:
                n += 1
            result.append(n + 1)
        return result

    def time(self, batch_size: int, k: int, iters: int) -> Timing:
        """Median time of one forward + logits + argmax: plain decode (`rows_batch`) for k = 0,
        else the verify forward (`verify_batch`); its mode from the runner (a decode graph that
        can run it; the verify graphs' replay counter moving over one call)."""
        runner = self.runner
        if k == 0:
            batch = self.rows_batch(batch_size, 0, self.tokens)
            graph = runner.graphs is not None and runner.graphs.can_run(batch)
        else:
            batch = self.verify_batch(batch_size, k, self.tokens)
            before = runner.verify_graph_replays
            self.predict(batch)
            graph = runner.verify_graph_replays > before
        mode = "graph" if graph else "eager"
        return Timing(_median_ms(lambda: self.predict(batch), iters, self.device), mode)


def _median_ms(fn: Callable[[], Any], iters: int, device: torch.device) -> float:
    cuda = device.type == "cuda"
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()  # NOTE: `predict` reads the tokens back to the host: the step is complete
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def verify_cost(bench: VerifyBench, ks: Sequence[int], iters: int) -> list[dict[str, Any]]:
    """Batch 1: plain decode vs a verify step of k drafts, per k."""
    plain = bench.time(1, 0, iters)
    rows = []
    for k in ks:
        v = bench.time(1, k, iters)
        rows.append({
            "k": k, "rows": k + 1, "accepted": bench.accepted(1, k)[0],
            "decode_ms": plain.ms, "verify_ms": v.ms, "ms_per_token": v.ms / (k + 1),
            "bound_tok_s": (k + 1) / v.ms * 1e3, "bound_x": (k + 1) * plain.ms / v.ms,
            "tok_s_at_3": 3 / v.ms * 1e3, "x_at_3": 3 * plain.ms / v.ms,
            "mode": plain.mode if plain.mode == v.mode else f"{plain.mode}/{v.mode}",
        })  # fmt: skip
    return rows


def batch_sweep(
    bench: VerifyBench, ks: Sequence[int], batches: Sequence[int], iters: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per (k, B): the speedup bound of verifying k + 1 rows per request over plain decode of B
    requests; and per k the crossover batch sizes (forced acceptance, and 3 accepted)."""
    plain = {b: bench.time(b, 0, iters) for b in batches}
    rows, crossover = [], {}
    for k in ks:
        cross_all = cross_3 = None
        for b in batches:
            v = bench.time(b, k, iters)
            pays, pays_3 = (k + 1) * plain[b].ms / v.ms, 3 * plain[b].ms / v.ms
            if pays < 1 and cross_all is None:
                cross_all = b
            if pays_3 < 1 and cross_3 is None:
                cross_3 = b
            rows.append({
                "k": k, "batch": b, "rows": b * (k + 1), "decode_ms": plain[b].ms,
                "verify_ms": v.ms, "pays_x": pays, "pays_x_at_3": pays_3,
                "mode": f"{plain[b].mode}/{v.mode}",
            })  # fmt: skip
        crossover[f"k{k}"] = {"all_accepted": cross_all, "accept_len_3": cross_3}
    return rows, crossover


def run(
    model: str, ks: Sequence[int] = KS, batches: Sequence[int] = BATCHES, context: int = CONTEXT,
    iters: int = 20, **runner_kw: Any,
) -> dict[str, Any]:  # fmt: skip
    """Both measurements on one runner; prints the tables, returns the results."""
    bench = VerifyBench(model, max(batches), max(ks), context, ks=ks, **runner_kw)
    graphs, verify = bench.runner.graphs, bench.runner.verify_graphs
    note = (
        f"CUDA graphs for decode batches up to {graphs.max_bs} rows"
        if graphs is not None
        else f"eager (no CUDA graphs on {bench.device.type})"
    )
    if verify is not None:
        note += (
            f", verify graphs of {verify.node_counts} nodes x batch sizes up to {verify.max_bs} "
            f"({len(verify.captured)}; graph pool {verify.capture.pool_bytes / 1e6:.0f} MB)"
        )
    cost = verify_cost(bench, ks, iters)
    sweep, crossover = batch_sweep(bench, ks, batches, iters)
    where = f"{model}, context {context}, {bench.device}, {note}"
    print_table(f"verify cost at batch 1, forced acceptance ({where})", cost)
    print_table("batch sweep: speedup bound of verifying k + 1 rows per request", sweep)
    still = f"> {max(batches)}"  # pays at every batch size measured
    print_table(
        "crossover batch size (the smallest where speculation stops paying)",
        [{"k": k, **{n: still if b is None else b for n, b in v.items()}}
         for k, v in crossover.items()],
    )  # fmt: skip
    return {"model": model, "context": context, "device": str(bench.device), "graphs": note,
            "batch1": cost, "sweep": sweep, "crossover": crossover}  # fmt: skip


def section_spec(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """`radixlm bench gpu --sections spec` (--model: the dummy preset, llama-3-8b by default)."""
    import gc

    results["spec"] = run(args.model)
    gc.collect()  # the runner's weights, KV pool and graphs go with it
    torch.cuda.empty_cache()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m radixlm.bench.gpu_spec",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="llama-3-8b", help="a dummy preset or a model folder")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--ks", type=_ints, default=list(KS))
    parser.add_argument("--batches", type=_ints, default=list(BATCHES))
    parser.add_argument("--context", type=int, default=CONTEXT)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    result = run(
        args.model, args.ks, args.batches, args.context, args.iters, device=args.device,
        dtype=args.dtype, graphs=not args.disable_cuda_graph, num_threads=args.num_threads,
    )  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
