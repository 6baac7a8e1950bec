"""The `triton` attention backend inside the real model equals the `torch` backend (the oracle):
extend batches with and without cached prefixes, then decode steps, on a tiny random-weight
Llama (runs on CPU in Triton's interpreter, on GPU natively), also with the model's fused kernels,
and with an FP8 KV cache."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.gemv import GEMV_CONFIGS
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.llama import Linear, RMSNorm
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.models.rotary import RotaryEmbedding
from radixlm.runtime.server_args import ServerArgs


def _runner(backend: str, kv_cache_dtype: str = "auto") -> ModelRunner:
    args = ServerArgs(
        kv_cache_dtype=kv_cache_dtype,
        model_path="tiny-llama",
        load_format="dummy",
        attention_backend=backend,
        max_total_tokens=512,
        max_running_requests=4,
        disable_cuda_graph=True,
        dtype="float32",
    )
    return ModelRunner(args, resolve_model("tiny-llama", "dummy"))


def _fused_runner() -> ModelRunner:
    """The triton runner with the model's GPU path: fused RMSNorm, activation, the rotary
    embedding fused with the K/V store (`rotary_store_kv`), and the small-batch GEMV for every
    linear layer at decode, run by Triton's interpreter on CPU."""
    runner = _runner("triton")
    model = runner.model
    gemv_cfg = {**GEMV_CONFIGS[0], "block_n": 16, "block_k": 64}  # few interpreted programs
    for module in model.modules():
        if isinstance(module, (RMSNorm, Linear)):
            module.fused = True
        if isinstance(module, Linear):
            module.small_m_cfg = [gemv_cfg] * 3
    model.rotary = RotaryEmbedding(runner.config, runner.context_len, runner.device, fused=True)
    return runner


def _extend(
    runner: ModelRunner, rows, prefix_lens, tokens, slots, logits_rows=None, rows_only=False
) -> torch.Tensor:
    """Hidden states of every row, or of `logits_rows` (with `rows_only` the last layer runs
    for those rows only, as for the scheduler's batches)."""
    ids, pos, loc, starts, ext = [], [], [], [], []
    off = 0
    for row, prefix, toks in zip(rows, prefix_lens, tokens):
        n = len(toks)
        s = slots[row][prefix : prefix + n]
        runner.req_to_token.write(row, prefix, s)
        ids += toks
        pos += list(range(prefix, prefix + n))
        loc.append(s)
        starts.append(off)
        ext.append(n)
        off += n
    t = lambda v: torch.tensor(v, dtype=torch.int64, device=runner.device)  # noqa: E731
    seq = [p + e for p, e in zip(prefix_lens, ext)]
    fb = ForwardBatch(
        ForwardMode.EXTEND,
        len(rows),
        t(ids),
        t(pos),
        torch.cat(loc).to(runner.device),
        t(rows),
        t(seq),
        seq,
        list(prefix_lens),
        ext,
        t(prefix_lens),
        t(ext),
        t(starts),
    )
    if logits_rows is not None:
        fb.logits_indices = t(logits_rows)
        fb.logits_indices_cpu = list(logits_rows) if rows_only else None
    assert fb.last_layer_rows_only == rows_only
    return runner.forward(fb)


def _decode(runner: ModelRunner, rows, positions, tokens, slots) -> torch.Tensor:
    loc = torch.stack([slots[r][p] for r, p in zip(rows, positions)]).to(runner.device)
    for r, p, s in zip(rows, positions, loc):
        runner.req_to_token.write(r, p, s.view(1))
    t = lambda v: torch.tensor(v, dtype=torch.int64, device=runner.device)  # noqa: E731
    seq = [p + 1 for p in positions]
    fb = ForwardBatch(
        ForwardMode.DECODE, len(rows), t(tokens), t(positions), loc, t(rows), t(seq), seq
    )
    return runner.forward(fb)


def _fp8_runners() -> dict[str, ModelRunner]:
    """torch and triton runners on a float8_e4m3fn pool with scales != 1 in every layer, and
    "exact": the torch runner on an fp32 pool.

    # NOTE: the triton runner stores with `store_kv`; the fused `rotary_store_kv` (the GPU's store
    # path) is tested against `store_kv` in test_rotary.py: interpreted here it would add ~4 s.
    """
    runners = {name: _runner(name, "fp8_e4m3") for name in ("torch", "triton")}
    for runner in runners.values():
        pool = runner.kv_pool
        assert pool.k[0].dtype == pool.v[0].dtype == torch.float8_e4m3fn
        pool.k_scale = [0.75] * pool.num_layers
        pool.v_scale = [1.5] * pool.num_layers
    runners["exact"] = _runner("torch")
    return runners


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_triton_backend_matches_torch_backend(kv_cache_dtype: str) -> None:
    gen = torch.Generator().manual_seed(0)
    if kv_cache_dtype == "auto":
        runners = {name: _runner(name) for name in ("torch", "triton")}
        runners["fused"] = _fused_runner()
    else:
        runners = _fp8_runners()
    # Shuffled, non-contiguous slots per request row (as after evictions).
    perm = torch.randperm(511, generator=gen)[: 4 * 100] + 1
    slots = {r: perm[r * 100 : (r + 1) * 100] for r in range(4)}
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (37, 5, 64, 1)]
    out = {}
    for name, runner in runners.items():
        # Round 1: three prompts from scratch; round 2: the fourth request reuses request 0's
        # first 20 tokens as a cached prefix (mid-block) plus new tokens, alongside a continuation.
        h1 = _extend(runner, [0, 1, 2], [0, 0, 0], prompts[:3], slots)
        slots[3][:20] = slots[0][:20]
        h2 = _extend(runner, [3, 1], [20, 5], [prompts[3] + [7, 8], [9, 10, 11]], slots)
        steps = []
        positions = [37, 8, 64, 23]
        for step in range(3):
            steps.append(
                _decode(runner, [0, 1, 2, 3], [p + step for p in positions], [5, 6, 7, 8], slots)
            )
        out[name] = [h1, h2, *steps]
    for name in ("triton", "fused") if kv_cache_dtype == "auto" else ("triton",):
        for a, b in zip(out["torch"], out[name]):
            torch.testing.assert_close(b, a, rtol=2e-4, atol=2e-4)
    if kv_cache_dtype != "auto":
        # Layer 0's K/V do not depend on attention: in both fp8 pools they are the exact fp32
        # pool's values quantised with the layer's scales (within half an fp8 step, not equal).
        used, exact = slots[0][:37], runners["exact"].kv_pool
        for name in ("torch", "triton"):
            pool = runners[name].kv_pool
            for buf, ref, scale in (
                (pool.k[0], exact.k[0], pool.k_scale[0]),
                (pool.v[0], exact.v[0], pool.v_scale[0]),
            ):
                dequantised, expected = buf[used].float() * scale, ref[used]
                assert not torch.equal(dequantised, expected)
                torch.testing.assert_close(dequantised, expected, rtol=2**-4, atol=2**-9 * scale)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_last_layer_for_logits_rows_only_is_the_same_math(backend: str) -> None:
    """A prefill's last layer attending and running its MLP for the logits rows only (the
    others just store K/V) gives the full forward's hidden states at those rows, the same KV
    pool, and the same decode steps after it; a batch without logits rows returns none."""
    gen = torch.Generator().manual_seed(1)
    perm = torch.randperm(511, generator=gen)[: 4 * 100] + 1
    slots = {r: perm[r * 100 : (r + 1) * 100] for r in range(4)}
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (37, 5, 64, 9)]
    runners = {mode: _runner(backend) for mode in ("full", "rows_only")}
    out = {}
    for mode, runner in runners.items():
        rows_only = mode == "rows_only"
        # Round 1: requests 0-2, the last rows of 0 and 2 only (1's prompt continues later).
        h1 = _extend(runner, [0, 1, 2], [0, 0, 0], prompts[:3], slots, [36, 105], rows_only)
        # Round 2: request 1 goes on from its 5 cached tokens, request 3 has no logits row.
        h2 = _extend(runner, [1, 3], [5, 0], [prompts[3], [4, 5, 6]], slots, [8], rows_only)
        # Round 3: no logits rows at all (a chunk in the middle of a prompt).
        h3 = _extend(runner, [3], [3], [[7, 8]], slots, [], rows_only)
        step = _decode(runner, [0, 1, 2, 3], [37, 14, 64, 5], [5, 6, 7, 8], slots)
        out[mode] = [h1, h2, h3, step]
    for a, b in zip(out["full"], out["rows_only"]):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=2e-5)
    assert out["rows_only"][2].shape == (0, runners["full"].config.hidden_size)
    written = torch.cat([slots[r][:n] for r, n in ((0, 38), (1, 15), (2, 65), (3, 6))])
    full, rows_only = runners["full"].kv_pool, runners["rows_only"].kv_pool
    for a, b in zip(full.k + full.v, rows_only.k + rows_only.v):
        assert torch.equal(a[written], b[written])
