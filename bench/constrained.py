"""`radixlm bench constrained`: constrained decoding costs and speed, side by side with Outlines'
own `transformers` integration on the same model (identical weights, our tokenizer), schemas and
prompts (workloads in constrained_workloads.py).

Sections (`--sections`, each prints a table; `--json PATH` writes everything, after every section):
- compile: grammar compile time per spec, p50/p99, cold / memory-cached / disk-cached;
- masks: per-row mask fill (`Grammar.fill_mask`) over random walks, and the batch mask apply in
  the sampler (numpy CPU path, and the torch reference), p50/p99 µs;
- e2e: the JSON-extraction workload (a fixed-layout regex and a schema) with jump-forward on and
  off (batch 1 and batched) and through `outlines.Generator` on transformers (batch 1), all
  interleaved run by run, best of `--repeats`; then the time per decode step unconstrained vs
  constrained (a mask on every row every step) at batch 1 and 16, measured as
  (time(N tokens) - time(1 token)) / decode steps.
- backends: outlines vs llguidance vs xgrammar over one corpus (workloads + SchemaStore + grammars):
  coverage, compile p50/p99 cold and cached, mask p50/p99, walk validity, TPOT overhead at
  batch 16 (constrained_backends.py).
Every constrained output is checked (regex full match / jsonschema).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from typing import Any

import numpy as np

from radixlm.bench import constrained_workloads as W
from radixlm.bench.constrained_backends import bench_backends, print_backends
from radixlm.bench.constrained_tpot import bench_tpot


def pcts(values: list[float], scale: float = 1.0) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64) * scale
    return {
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
        "n": len(values),
    }


def valid(kind: str, spec: Any, text: str) -> bool:
    if kind == "regex":
        return re.fullmatch(spec, text) is not None
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), spec)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


# ---- compile and masks (in process) -----------------------------------------------------------
def make_compiler(cache_dir: str | None = None) -> Any:
    from radixlm.runtime.constrained.outlines_backend import OutlinesCompiler
    from radixlm.runtime.frontend.tokenizer import load_server_tokenizer
    from radixlm.runtime.server_args import ServerArgs

    tok = load_server_tokenizer(ServerArgs())
    return OutlinesCompiler(tok, 49152, (tok.eos_token_id,), cache_dir=cache_dir)


def bench_compile(repeats: int) -> dict[str, Any]:
    from radixlm.runtime.constrained import GrammarSpec

    specs = [GrammarSpec.from_constraint(k, v) for _, k, v in W.all_specs()]
    with tempfile.TemporaryDirectory() as tmp:
        compiler = make_compiler(tmp)
        compiler.vocab.outlines_vocabulary()  # built once per process, not per grammar
        cold, cached, disk = [], [], []
        for spec in specs:
            t = time.perf_counter()
            compiler.compile(spec)
            cold.append(time.perf_counter() - t)
            for _ in range(repeats):
                t = time.perf_counter()
                compiler.compile(spec)
                cached.append(time.perf_counter() - t)
        reloaded = make_compiler(tmp)
        reloaded.vocab.outlines_vocabulary()
        for spec in specs:
            t = time.perf_counter()
            reloaded.compile(spec)
            disk.append(time.perf_counter() - t)
    per_spec = {label: round(c, 4) for (label, _, _), c in zip(W.all_specs(), cold)}
    return {
        "cold_s": pcts(cold),
        "cached_s": pcts(cached),
        "disk_s": pcts(disk),
        "per_spec_cold_s": per_spec,
    }


def bench_masks(steps: int) -> dict[str, Any]:
    import torch

    from radixlm.kernels.token_bitmask import apply_token_bitmask_inplace_ref, unpack_bitmask
    from radixlm.runtime.constrained import GrammarSpec

    compiler = make_compiler()
    rng = np.random.default_rng(0)
    fills: list[float] = []
    row = torch.zeros(1536, dtype=torch.int32)
    for _, kind, value in W.all_specs():
        spec = GrammarSpec.from_constraint(kind, value)
        grammar = compiler.compile(spec)
        for _ in range(steps):
            t = time.perf_counter()
            grammar.fill_mask(row)
            fills.append(time.perf_counter() - t)
            allowed = unpack_bitmask(row.view(1, -1), 49152)[0].nonzero().flatten().tolist()
            allowed = [a for a in allowed if a != compiler.vocab.eos_id]
            if grammar.is_terminated() or not allowed:
                grammar = compiler.compile(spec)
                continue
            grammar.accept(int(rng.choice(allowed)))
    out: dict[str, Any] = {"fill_us": pcts(fills, 1e6)}
    from radixlm.kernels.token_bitmask_cpu import apply_bitmask_cpu

    for bs in (1, 16):
        logits = torch.randn(bs, 49152)
        mask = torch.randint(-(2**31), 2**31 - 1, (bs, 1536), dtype=torch.int32)
        for name, apply in (
            ("apply", apply_bitmask_cpu),
            ("apply_torch_ref", apply_token_bitmask_inplace_ref),
        ):
            times = []
            for _ in range(50):
                fresh = logits.clone()
                t = time.perf_counter()
                apply(fresh, mask)
                times.append(time.perf_counter() - t)
            out[f"{name}_b{bs}_us"] = pcts(times, 1e6)
    return out


# ---- engine runs ------------------------------------------------------------------------------
def _radixlm(engine: Any, params: dict[str, Any], prompts: list[str], batched: bool) -> tuple:
    t = time.perf_counter()
    if batched:
        outs = engine.generate(prompts, [dict(params) for _ in prompts])
    else:
        outs = [engine.generate(p, params) for p in prompts]
    wall = time.perf_counter() - t
    return wall, [o["text"] for o in outs], sum(o["meta_info"]["completion_tokens"] for o in outs)


def _outlines_setup(kinds: list[tuple[str, Any]]) -> dict[str, Any]:
    import outlines
    from outlines.types import JsonSchema, Regex

    from radixlm.runtime.models.hf_reference import HFReference

    ref = HFReference.default()
    model = outlines.from_transformers(ref.model, ref.tokenizer)
    gens: dict[str, Any] = {}
    for kind, spec in kinds:
        typ = Regex(spec) if kind == "regex" else JsonSchema(json.dumps(spec))
        t = time.perf_counter()
        gens[kind] = outlines.Generator(model, typ, backend="outlines_core")
        gens[f"{kind}_compile_s"] = time.perf_counter() - t
    return gens


def bench_e2e(
    n: int,
    max_new: int,
    batch_sizes: list[int],
    tpot_tokens: int,
    repeats: int,
    peer: bool,
    json_whitespace: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """JSON extraction with jump-forward on and off, and through Outlines, *interleaved* (run
    r of every system back to back; best of `repeats`), so a busy machine skews all alike.
    `json_whitespace`: the engines' `constrained_json_whitespace_pattern` (None: `[ ]?`)."""
    from radixlm.runtime.frontend.engine import Engine

    kinds = [("regex", W.EXTRACTION_REGEX), ("json_schema", W.EXTRACTION_SCHEMA)]
    common = {"max_total_tokens": 16384, "constrained_json_whitespace_pattern": json_whitespace}
    engines = {
        "on": Engine(**common),
        "off": Engine(**common, disable_jump_forward=True),
    }
    jf: dict[str, Any] = {}
    ol: dict[str, Any] = {}
    try:
        gens = _outlines_setup(kinds) if peer else {}
        prompts = W.extraction_prompts(n)
        for kind, spec in kinds:
            value = json.dumps(spec) if kind == "json_schema" else spec
            params = {"temperature": 0, "max_new_tokens": max_new, kind: value}
            for engine in engines.values():
                engine.generate(prompts[0], params)  # compile + warm
            check = "regex" if kind == "regex" else "json"
            runs: dict[str, Any] = {f"{m}_{tag}": [] for m in ("b1", "batched") for tag in engines}
            if peer:
                t = time.perf_counter()
                gens[kind](prompts[0], max_new_tokens=max_new, do_sample=False)
                ol[kind] = {
                    "compile_s": gens[f"{kind}_compile_s"],
                    "first_call_s": time.perf_counter() - t,
                }
                runs["outlines"] = []
            for _ in range(repeats):
                for mode in ("b1", "batched"):
                    for tag, engine in engines.items():
                        runs[f"{mode}_{tag}"].append(
                            _radixlm(engine, params, prompts, mode == "batched")
                        )
                if peer:
                    t = time.perf_counter()
                    texts = [
                        gens[kind](p, max_new_tokens=max_new, do_sample=False) for p in prompts
                    ]
                    runs["outlines"].append((time.perf_counter() - t, texts, 0))
            for key, results in runs.items():
                wall, texts, tokens = min(results, key=lambda x: x[0])
                ok = sum(valid(check, spec, x) for x in texts)
                entry = {"wall_s": wall, "valid": f"{ok}/{n}", "tokens": tokens}
                if key == "outlines":
                    ol[kind].update(entry)
                else:
                    jf[f"{kind}_{key}"] = entry
        for tag, engine in engines.items():
            jf[f"jumps_{tag}"] = engine.get_server_info()["jump_forward"]
        jf["tpot"] = bench_tpot(engines["off"], batch_sizes, tpot_tokens)
    finally:
        for engine in engines.values():
            engine.shutdown()
    for kind, _ in kinds:
        for mode in ("b1", "batched"):
            on, off = jf[f"{kind}_{mode}_on"], jf[f"{kind}_{mode}_off"]
            jf[f"speedup_{kind}_{mode}"] = off["wall_s"] / on["wall_s"]
    return jf, ol


# ---- report -----------------------------------------------------------------------------------
def print_report(r: dict[str, Any]) -> None:
    def line(label: str, value: str) -> None:
        print(f"  {label:<46} {value}")

    for name in ("compile", "masks", "jump_forward", "outlines"):
        if isinstance(r.get(name), dict) and "error" in r[name]:
            print(f"{name}: FAILED: {r[name]['error']}")
            r = {k: v for k, v in r.items() if k != name}

    if "compile" in r:
        c = r["compile"]
        print(f"compile ({c['cold_s']['n']} specs)")
        for k in ("cold_s", "cached_s", "disk_s"):
            line(k[:-2], f"p50 {c[k]['p50'] * 1e3:9.3f} ms   p99 {c[k]['p99'] * 1e3:9.3f} ms")
    if "masks" in r:
        m = r["masks"]
        print("masks")
        for k, v in m.items():
            line(k, f"p50 {v['p50']:8.1f} us   p99 {v['p99']:8.1f} us   (n={v['n']})")
    jf = r.get("jump_forward")
    if jf:
        print("tpot (ms per decode step; jump-forward off)")
        for k, v in jf["tpot"].items():
            if k.endswith("_ms"):
                line(k, f"{v:8.1f}")
            elif k.startswith("overhead") and not k.endswith("_pairs"):
                line(k, f"{v * 100:+7.1f} %")
        print("jump-forward (JSON extraction)")
        for k, v in jf.items():
            if isinstance(v, dict) and "wall_s" in v:
                line(k, f"{v['wall_s']:7.2f} s  valid {v['valid']}  tokens {v['tokens']}")
            elif k.startswith("speedup") or k.startswith("jumps"):
                line(k, f"{v:.2f}" if isinstance(v, float) else str(v))
    ol = r.get("outlines")
    if ol:
        print("outlines (transformers, batch 1)")
        for k, v in ol.items():
            line(k, json.dumps({a: round(b, 2) if isinstance(b, float) else b for a, b in v.items()})
                 if isinstance(v, dict) else str(v))  # fmt: skip
        if jf and "regex" in ol and "wall_s" in ol["regex"]:
            for kind in ("regex", "json_schema"):
                ours = jf[f"{kind}_b1_on"]["wall_s"]
                line(f"radixlm b1 vs outlines ({kind})", f"{ol[kind]['wall_s'] / ours:.2f}x faster")
                ours = jf[f"{kind}_batched_on"]["wall_s"]
                line(
                    f"radixlm batched vs outlines ({kind})",
                    f"{ol[kind]['wall_s'] / ours:.2f}x faster",
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="radixlm bench constrained", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="fewer prompts and steps")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--tpot-tokens", type=int, default=128)
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--sections", default="compile,masks,e2e,backends")
    parser.add_argument("--repeats", type=int, default=2, help="e2e runs per system (best kept)")
    parser.add_argument("--no-outlines", action="store_true", help="skip the Outlines peer")
    parser.add_argument(
        "--json-whitespace",
        default=None,
        help="the engines' constrained_json_whitespace_pattern (default: outlines' `[ ]?`)",
    )
    parser.add_argument(
        "--grammar-backends",
        default="outlines,llguidance,xgrammar",
        help="the backends section's columns",
    )
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    n = 4 if args.quick else args.num_prompts
    sections = set(args.sections.split(","))
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    report: dict[str, Any] = {"argv": list(argv if argv is not None else sys.argv[1:])}

    def save(rep: dict[str, Any]) -> None:  # NOTE: after every section: long runs keep results
        if args.json_path:
            with open(args.json_path, "w") as f:
                json.dump(rep, f, indent=1)

    runs = {
        "compile": lambda: bench_compile(repeats=3 if args.quick else 10),
        "masks": lambda: bench_masks(steps=30 if args.quick else 120),
        # outlines vs llguidance vs xgrammar over one corpus (constrained_backends.py)
        "backends": lambda: bench_backends(
            args.quick, args.tpot_tokens, backends=tuple(args.grammar_backends.split(","))
        ),
    }
    failed = False
    for name, run in runs.items():
        if name not in sections:
            continue
        try:
            report[name] = run()
        except Exception as exc:  # report what ran; a failed section is named, not fatal
            failed = True
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        save(report)
    if "e2e" in sections:
        try:
            report["jump_forward"], report["outlines"] = bench_e2e(
                n,
                args.max_new_tokens,
                batch_sizes,
                args.tpot_tokens,
                args.repeats,
                not args.no_outlines,
                args.json_whitespace,
            )
        except Exception as exc:
            failed = True
            report["jump_forward"] = {"error": f"{type(exc).__name__}: {exc}"}
        save(report)
    print_report(report)
    if isinstance(report.get("backends"), dict) and "error" not in report["backends"]:
        print_backends(report["backends"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
