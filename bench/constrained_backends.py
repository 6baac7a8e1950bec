"""`radixlm bench constrained --sections backends`: the grammar backends (outlines,
llguidance, xgrammar) side by side in one run, over one corpus: the bench workloads, the SchemaStore
schemas vendored in `check-jsonschema`, and the grammars of grammar_corpus.py (ebnf).

Per backend: coverage (compiled / rejected with a GrammarError / timed out / crashed), compile
time p50/p99 cold (first compile of a spec) and cached (the request path on a hit: `cached()`,
a copy of the template), per-token mask fill p50/p99 over random walks, validity of the walks
that finish (jsonschema / re.fullmatch / the lark oracle), and the decode-step time at batch 16
with a mask on every row vs unconstrained (an Engine per backend, `bench_tpot`).
Compiles run in a worker thread bounded by `compile_timeout` (a timed-out compile is recorded
as such; its thread finishes in the background).
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import torch

from radixlm.bench import constrained_workloads as W
from radixlm.bench.constrained_tpot import bench_tpot
from radixlm.bench.grammar_corpus import GRAMMARS

BACKENDS = ("outlines", "llguidance", "xgrammar")
VOCAB = 49152


def corpus(max_schema_kb: int | None) -> list[tuple[str, str, Any, Any]]:
    """(label, kind, value, oracle) per spec: oracle is a schema dict, a regex or a GrammarCase."""
    import check_jsonschema

    items: list[tuple[str, str, Any, Any]] = []
    for label, kind, value in W.all_specs():
        items.append((label, kind, value, json.loads(value) if kind == "json_schema" else value))
    root = os.path.join(os.path.dirname(check_jsonschema.__file__), "builtin_schemas", "vendor")
    for path in sorted(glob.glob(os.path.join(root, "*.json"))):
        if max_schema_kb is not None and os.path.getsize(path) > max_schema_kb * 1024:
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        items.append(
            (f"schemastore/{os.path.basename(path)}", "json_schema", text, json.loads(text))
        )
    for case in GRAMMARS:
        items.append((f"grammar/{case.name}", "ebnf", case.text, case))
    return items


def make_compiler(backend: str) -> Any:
    from radixlm.runtime.frontend.tokenizer import load_server_tokenizer
    from radixlm.runtime.server_args import ServerArgs

    tok = load_server_tokenizer(ServerArgs())
    if backend == "llguidance":
        from radixlm.runtime.constrained.llguidance_backend import LLGuidanceCompiler

        compiler: Any = LLGuidanceCompiler(tok, VOCAB, (tok.eos_token_id,))
        _ = compiler.lltokenizer  # built once per process, not per grammar
    elif backend == "xgrammar":
        from radixlm.runtime.constrained.xgrammar_backend import XGrammarCompiler

        compiler = XGrammarCompiler(tok, VOCAB, (tok.eos_token_id,))
        _ = compiler.xgrammar_compiler  # its TokenizerInfo: built once per process
    else:
        from radixlm.runtime.constrained.outlines_backend import OutlinesCompiler

        compiler = OutlinesCompiler(tok, VOCAB, (tok.eos_token_id,))
        compiler.vocab.outlines_vocabulary()
    return compiler


def _valid(kind: str, oracle: Any, text: str) -> bool:
    if kind == "ebnf":
        return oracle.parses(text)
    if kind in ("regex", "choices"):
        return bool(re.fullmatch(oracle, text)) if kind == "regex" else text in oracle
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), oracle)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


def _walk(
    grammar: Any,
    vocab: Any,
    rng: random.Random,
    steps: int,
    mask_s: list[float],
    first_s: list[float] | None = None,
) -> Any:
    """A random walk through the grammar, timing each mask fill (the first one of the walk also
    into `first_s`); the text, or None if unfinished."""
    from radixlm.kernels.token_bitmask import unpack_bitmask

    row = torch.zeros((VOCAB + 31) // 32, dtype=torch.int32)
    tokens: list[int] = []
    for _ in range(steps):
        if grammar.is_terminated():
            return vocab.decode_bytes(tokens).decode("utf-8", errors="replace")
        t = time.perf_counter()
        grammar.fill_mask(row)
        mask_s.append(time.perf_counter() - t)
        if first_s is not None and not tokens:
            first_s.append(mask_s[-1])
        allowed = unpack_bitmask(row.view(1, -1), VOCAB)[0].nonzero().flatten().tolist()
        eos = [a for a in allowed if a in vocab.eos_ids]
        other = [a for a in allowed if a not in vocab.eos_ids]
        if eos and (not other or rng.random() < 0.3):
            return vocab.decode_bytes(tokens).decode("utf-8", errors="replace")
        if not other:
            return None
        token = rng.choice(other)
        grammar.accept(token)
        tokens.append(token)
    return None


def bench_backend(
    backend: str, items: list, compile_timeout: float, walks: int, steps: int
) -> dict:
    from radixlm.runtime.constrained import GrammarSpec
    from radixlm.runtime.errors import GrammarError

    compiler = make_compiler(backend)
    pool = ThreadPoolExecutor(1)
    cold, cached, mask_s, first_s = [], [], [], []
    coverage = {"compiled": 0, "rejected": 0, "timeout": 0, "crashed": 0}
    walks_done = walks_valid = 0
    per_spec: dict[str, str] = {}
    for label, kind, value, oracle in items:
        spec = GrammarSpec.from_constraint(kind, value)
        t = time.perf_counter()
        future = pool.submit(compiler.compile, spec)
        try:
            future.result(timeout=compile_timeout)
        except FutureTimeout:
            coverage["timeout"] += 1
            per_spec[label] = "timeout"
            pool = ThreadPoolExecutor(1)  # NOTE: the stuck thread finishes on its own
            continue
        except GrammarError as exc:
            coverage["rejected"] += 1
            per_spec[label] = f"rejected: {str(exc)[:120]}"
            continue
        except Exception as exc:  # a crash inside the backend: named, never fatal
            coverage["crashed"] += 1
            per_spec[label] = f"crashed: {type(exc).__name__}: {str(exc)[:100]}"
            continue
        cold.append(time.perf_counter() - t)
        coverage["compiled"] += 1
        per_spec[label] = "compiled"
        for _ in range(3):
            t = time.perf_counter()
            compiler.cached(spec)
            cached.append(time.perf_counter() - t)
        rng = random.Random(label)
        for _ in range(walks):
            text = _walk(compiler.compile(spec), compiler.vocab, rng, steps, mask_s, first_s)
            if text is not None:
                walks_done += 1
                walks_valid += _valid(kind, oracle, text)
    pool.shutdown(wait=False, cancel_futures=True)
    return {
        "coverage": coverage,
        "compile_cold_ms": _pcts(cold, 1e3),
        "compile_cached_ms": _pcts(cached, 1e3),
        "mask_us": _pcts(mask_s, 1e6),
        "mask_first_us": _pcts(first_s, 1e6),  # a request's first mask (after its compile)
        "walks_finished": walks_done,
        "walks_valid": walks_valid,
        "per_spec": per_spec,
    }


def _pcts(values: list[float], scale: float) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "n": 0}
    arr = np.asarray(values) * scale
    return {
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
        "n": len(values),
    }


def bench_backends(
    quick: bool,
    tpot_tokens: int,
    batch: int = 16,
    compile_timeout: float = 10.0,
    backends: tuple[str, ...] = BACKENDS,
) -> dict[str, Any]:
    items = corpus(64 if quick else None)
    out: dict[str, Any] = {"corpus_size": len(items)}
    for backend in backends:
        res = bench_backend(
            backend, items, compile_timeout, 1 if quick else 3, 60 if quick else 300
        )
        if tpot_tokens > 0:
            from radixlm.runtime.frontend.engine import Engine

            engine = Engine(grammar_backend=backend)
            try:
                res["tpot"] = bench_tpot(engine, [batch], tpot_tokens, repeats=1 if quick else 5)
            finally:
                engine.shutdown()
        out[backend] = res
    return out


def print_backends(r: dict[str, Any]) -> None:
    rows = [
        ("compiled / rejected / timeout / crashed", lambda b: "{compiled} / {rejected} / {timeout} / {crashed}".format(**b["coverage"])),
        ("compile cold p50 / p99 (ms)", lambda b: _pp(b["compile_cold_ms"])),
        ("compile cached p50 / p99 (ms)", lambda b: _pp(b["compile_cached_ms"], 4)),
        ("mask per token p50 / p99 (µs)", lambda b: _pp(b["mask_us"], 1)),
        ("first mask of a request p50 / p99 (µs)", lambda b: _pp(b["mask_first_us"], 1)),
        ("valid walks / finished", lambda b: f"{b['walks_valid']} / {b['walks_finished']}"),
        ("TPOT overhead at batch 16", lambda b: _overhead(b.get("tpot"))),
        ("  the same, host work outside the model", lambda b: _overhead(b.get("tpot"), "_host")),
        ("mask work per step at batch 16", lambda b: _mask_share(b.get("tpot"))),
    ]  # fmt: skip
    print(f"\n== grammar backends ({r['corpus_size']} specs) ==")
    print(f"{'':42s}" + "".join(f"{b:>24s}" for b in BACKENDS if b in r))
    for label, fmt in rows:
        print(f"{label:42s}" + "".join(f"{fmt(r[b]):>24s}" for b in BACKENDS if b in r))


def _pp(p: dict[str, float], digits: int = 2) -> str:
    return f"{p['p50']:.{digits}f} / {p['p99']:.{digits}f}"


def _overhead(tpot: dict[str, Any] | None, suffix: str = "") -> str:
    """The median pair's overhead: by the wall clock (suffix ""), or by the scheduler's work
    outside the model ("_host", see `bench_tpot`)."""
    keys = [k for k in tpot or {} if re.fullmatch(rf"overhead_b\d+{suffix}", k)]
    return "-" if not keys else f"{100 * tpot[keys[0]]:+.1f} %"


def _mask_share(tpot: dict[str, Any] | None) -> str:
    """The scheduler's own time in grammar masks per constrained step, and its share of the
    unconstrained step."""
    key = next((k for k in tpot or {} if k.endswith("_mask_ms")), None)
    if key is None:
        return "-"
    plain = tpot[key.replace("constrained", "unconstrained").replace("_mask_ms", "_ms")]
    return f"{tpot[key]:.3f} ms = {100 * tpot[key] / plain:.1f} %"
