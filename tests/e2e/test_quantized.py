"""The default model with FP8 weights and an FP8 KV cache stays close to transformers (fp32):
the engine's greedy tokens are transformers' top-1 at most steps and near it at the others, with
close logprobs,
from a cold cache and again from a warm one (the prompt's K/V then read back from the FP8 pool)."""

from __future__ import annotations

from tests_helpers import PARITY_PROMPTS, get_engine, release_engine

CONFIG = {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}
PROMPTS = [PARITY_PROMPTS[2], PARITY_PROMPTS[5], PARITY_PROMPTS[7]]
MAX_NEW = 24


def test_fp8_engine_tracks_transformers(hf_reference) -> None:
    engine = get_engine(**CONFIG)
    try:
        params = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
        for round_ in ("cold", "warm"):
            outs = engine.generate(PROMPTS, params, return_logprob=True)
            agree, diffs, gaps = 0, [], []
            for prompt, out in zip(PROMPTS, outs):
                ids = hf_reference.tokenizer.encode(prompt)
                ref = hf_reference.logprobs(ids + out["output_ids"])
                steps = out["meta_info"]["output_token_logprobs"]
                assert [t for _, t, _ in steps] == out["output_ids"] and len(steps) == MAX_NEW
                for k, (logprob, tok, _) in enumerate(steps):
                    row = ref[len(ids) - 1 + k]
                    agree += int(row.argmax()) == tok
                    gaps.append(float(row.max() - row[tok]))
                    diffs.append(abs(logprob - float(row[tok])))
            if round_ == "warm":
                assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs)
            # Measured on CPU: 65/72 agree, mean |diff| 0.14, largest gap 0.39 (FP8 weights
            # alone: 64/72, 0.12, 0.77; a 135M model is among the most FP8-sensitive). NOTE: the
            # largest gap is one step's, and FP8 rounding turns last-bit differences upstream into
            # it: on an AVX2-only machine (2026-12-07) the C++ kernels' fp32 norms / LM head gave
            # 2.14 at one step of 72 (the next largest 0.65), torch's own kernels 0.41, with every
            # other figure alike. A broken scale or cache read is far outside these bounds.
            assert agree >= 0.8 * len(diffs), f"{round_}: {agree}/{len(diffs)} top-1 agree"
            assert sum(diffs) / len(diffs) < 0.25, f"{round_}: mean |logprob diff| {diffs}"
            assert max(gaps) < 3.0, f"{round_}: a greedy token far below transformers' best"
            assert sum(g > 0.5 for g in gaps) <= 3, f"{round_}: greedy tokens below the best {gaps}"
    finally:
        release_engine(**CONFIG)
