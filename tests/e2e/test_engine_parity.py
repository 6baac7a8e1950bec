"""Greedy decoding of the real engine equals transformers token for token, whatever the cache,
chunking and memory pressure; logprobs agree to 1e-3. The engine runs the fp32 path (the default
CPU mode's Q4_1 blocks on Q8 activations are held to the quality gate instead:
tests/runtime/test_quality_gate.py)."""

from __future__ import annotations

import pytest

from tests_helpers import PARITY_PROMPTS, get_engine, hf_greedy_outputs, release_engine

MAX_NEW = 24

# NOTE: the overlapped decode schedule is CUDA-only by default; two configurations run its logic
# on CPU (`overlap_schedule_on_cpu`), the other two the plain loop.
FP32 = {"dtype": "float32"}  # = the `fp32_engine` fixture's engine
CONFIGS = {
    "radix": FP32,
    "no_radix": {**FP32, "disable_radix_cache": True},
    "tiny_chunks": {**FP32, "chunked_prefill_size": 16, "overlap_schedule_on_cpu": True},
    "retraction": {
        **FP32,
        "max_total_tokens": 256,
        "max_running_requests": 8,
        "overlap_schedule_on_cpu": True,
    },
}


@pytest.fixture(scope="module")
def reference(hf_reference):
    return hf_greedy_outputs(hf_reference, PARITY_PROMPTS, MAX_NEW)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_parity_batched(name, reference):
    engine = get_engine(**CONFIGS[name])
    try:
        _check_parity(name, engine, reference)
    finally:
        if CONFIGS[name] != FP32:  # not the session's `fp32_engine`
            release_engine(**CONFIGS[name])


def _check_parity(name: str, engine, reference: list[list[int]]) -> None:
    params = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
    outs = engine.generate(PARITY_PROMPTS, params)
    # Twice: the second round runs on a warm radix cache (prefix hits everywhere).
    outs2 = engine.generate(PARITY_PROMPTS, params)
    for prompt, out, out2, ref in zip(PARITY_PROMPTS, outs, outs2, reference):
        assert out["output_ids"] == ref, f"{name}: {prompt!r}"
        assert out2["output_ids"] == ref, f"{name} (warm cache): {prompt!r}"
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": MAX_NEW}
    if name == "radix":
        assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs2)
    if name == "no_radix":
        assert all(o["meta_info"]["cached_tokens"] == 0 for o in outs + outs2)
    overlapped = engine.get_server_info()["overlapped_steps"]
    assert (overlapped > 0) == bool(CONFIGS[name].get("overlap_schedule_on_cpu")), overlapped
    if name == "retraction":
        assert engine.get_server_info()["retracted"] > 0


def test_logprobs_match_transformers(fp32_engine, hf_reference):
    prompt = PARITY_PROMPTS[3]
    ids = hf_reference.tokenizer.encode(prompt)
    out = fp32_engine.generate(
        prompt,
        {"max_new_tokens": 8, "temperature": 0},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=5,
    )
    meta = out["meta_info"]
    full = ids + out["output_ids"]
    ref = hf_reference.logprobs(full)
    inp = meta["input_token_logprobs"]
    assert len(inp) == len(ids) and inp[0][0] is None and [t for _, t, _ in inp] == ids
    for pos in range(1, len(ids)):
        assert abs(inp[pos][0] - float(ref[pos - 1, ids[pos]])) <= 1e-3
    outp = meta["output_token_logprobs"]
    assert [t for _, t, _ in outp] == out["output_ids"]
    for k, (lp, tok, _) in enumerate(outp):
        assert abs(lp - float(ref[len(ids) - 1 + k, tok])) <= 1e-3
    # Top-k: ids and values of transformers' top 5, in order.
    for k, row in enumerate(meta["output_top_logprobs"]):
        ref_v, ref_i = ref[len(ids) - 1 + k].topk(5)
        assert [t for _, t, _ in row] == ref_i.tolist()
        assert max(abs(v - float(r)) for (v, _, _), r in zip(row, ref_v)) <= 1e-3
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"]) == len(ids)


def test_input_logprobs_from_start_len_with_cached_prefix(fp32_engine, hf_reference):
    prompt = PARITY_PROMPTS[5]
    ids = hf_reference.tokenizer.encode(prompt)
    fp32_engine.generate(prompt, {"max_new_tokens": 1})  # the whole prompt is now cached
    start = len(ids) // 2
    out = fp32_engine.generate(
        prompt,
        {"max_new_tokens": 1, "temperature": 0},
        return_logprob=True,
        logprob_start_len=start,
        return_text_in_logprobs=True,
    )
    ref = hf_reference.logprobs(ids)
    inp = out["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in inp] == ids[start:]
    for k, (lp, tok, text) in enumerate(inp):
        assert abs(lp - float(ref[start + k - 1, tok])) <= 1e-3
        assert text == hf_reference.tokenizer.decode([tok])
