"""Speed sections of `radixlm bench kernels` (CUDA only); see `bench.kernels` for the CLI.

Inputs are built directly on the GPU (random pool, shuffled page-size-1 slots) so that 32k-token
contexts at batch 64 (8.6 GB of bf16 KV) take no host time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from radixlm.bench.kernel_timing import Bench, Row, time_graph_ms, time_graph_stream_ms, time_ms

H, KVH, D = 32, 8, 128  # Llama-3-8B attention shapes
DT = torch.bfloat16
FP8 = torch.float8_e4m3fn


def _copy_bandwidth(bench: Bench) -> float:
    """Device-to-device copy GB/s (read + write bytes) of a ~4 GB buffer, measured now."""
    nbytes = (1 << 28) if bench.tiny else (4 << 30)
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def _paged_pool(
    num_tokens: int, head_dim: int = D, dtype: torch.dtype = DT
) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(num_tokens + 1, KVH, head_dim, device="cuda", dtype=DT).to(dtype)
    return k, torch.randn_like(k, dtype=DT).to(dtype)


def _shuffled_slots(rows: int, cols: int) -> torch.Tensor:
    return (torch.randperm(rows * cols, device="cuda") + 1).to(torch.int32).view(rows, cols)


def _decode_case(
    bs: int, ctx: int, copy_gbs: float, config=None, splits=None, kv_dtype: torch.dtype = DT
) -> Row:
    """Decode at Llama-3-8B shapes, timed in a CUDA graph cycling over enough layers (pools) to
    exceed L2; `kv_dtype` float8_e4m3fn: an FP8 KV cache (q stays bf16)."""
    from radixlm.kernels import decode_attention as da

    kv_bytes = 2 * bs * ctx * KVH * D * kv_dtype.itemsize
    layers = max(1, min(32, math.ceil((512 << 20) / kv_bytes)))
    pools = [_paged_pool(bs * ctx, D, kv_dtype) for _ in range(layers)]
    r2t = _shuffled_slots(bs, ctx)
    rpi = torch.arange(bs, device="cuda")
    seq_lens = torch.full((bs,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(bs, H, D, device="cuda", dtype=DT)
    splits = splits or da.choose_num_kv_splits(bs, ctx, KVH)
    mid_o, mid_lse = da.alloc_decode_workspace(bs, H, D, splits, "cuda")
    arrivals = torch.zeros(bs * H, dtype=torch.int32, device="cuda")  # the fused merge, as served
    out = torch.empty_like(q)
    fns = [
        partial(
            da.decode_attention_fwd,
            *(q, k, v, r2t, rpi, seq_lens, out, mid_o, mid_lse),
            config=config,
            arrivals=arrivals,
        )
        for k, v in pools
    ]
    ms = time_graph_stream_ms(fns)
    flushed_ms = time_graph_ms(fns)  # the method of runs 1-17 (L2 flushed before each replay)
    eager_ms = time_ms(fns[0])
    gbs = kv_bytes / ms / 1e6
    note = (
        f"{ms * 1e3:.1f} us (graph replay after an L2 flush {flushed_ms * 1e3:.1f}, eager "
        f"{eager_ms * 1e3:.1f}), splits={splits}, layers={layers}"
    )
    if config:
        note += f" cfg={config}"
    fp8 = " fp8" if kv_dtype != DT else ""
    name = f"bs{bs} ctx{ctx}{fp8} (KV {kv_bytes / 1e9:.2f} GB)"
    return Row("decode", name, gbs, "GB/s", copy_gbs, gbs / copy_gbs, note)


def _extend_case(bs: int, new: int, prefix: int, config=None, d: int = D) -> Row:
    from torch.nn.attention.bias import causal_lower_right

    from radixlm.kernels import extend_attention as ea

    seq = prefix + new
    k_buf, v_buf = _paged_pool(bs * seq, d)
    r2t = _shuffled_slots(bs, seq)
    q = torch.randn(bs * new, H, d, device="cuda", dtype=DT)
    k_ext = k_buf[r2t[:, prefix:].reshape(-1).long()]  # the new tokens' K/V are in the pool too
    v_ext = v_buf[r2t[:, prefix:].reshape(-1).long()]
    rpi = torch.arange(bs, device="cuda")
    pre = torch.full((bs,), prefix, dtype=torch.int32, device="cuda")
    ext = torch.full((bs,), new, dtype=torch.int32, device="cuda")
    start = torch.arange(bs, device="cuda", dtype=torch.int32) * new
    out = torch.empty_like(q)
    args = (q, k_ext, v_ext, k_buf, v_buf, r2t, rpi, pre, ext, start, new)
    ms = time_graph_ms([lambda: ea.extend_attention(*args, out=out, config=config)])
    # Dense layout for SDPA: [bs, H, len, D], kv heads expanded (not timed).
    qd = q.view(bs, new, H, d).transpose(1, 2).contiguous()
    kd = k_buf[r2t.long()].repeat_interleave(H // KVH, dim=2).transpose(1, 2).contiguous()
    vd = v_buf[r2t.long()].repeat_interleave(H // KVH, dim=2).transpose(1, 2).contiguous()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if prefix == 0:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def ref() -> torch.Tensor:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return sdpa(qd, kd, vd, is_causal=True)

        label = "sdpa flash causal"
    else:
        mask = causal_lower_right(new, seq)

        def ref() -> torch.Tensor:
            return sdpa(qd, kd, vd, attn_mask=mask)

        label = "sdpa causal_lower_right"
    ref_ms = time_graph_ms([ref])
    err = (ref().transpose(1, 2).reshape(bs * new, H, d).float() - out.float()).abs().max().item()
    pairs = bs * (new * prefix + new * (new + 1) / 2)  # (query, key) pairs attended
    tflops = 4 * d * H * pairs / ms / 1e9
    note = f"{tflops:.0f} TFLOP/s vs {label} {ref_ms:.3f} ms, err {err:.3g}"
    if config:
        note += f" cfg={config}"
    return Row(
        "extend",
        f"{bs}x{new} new, prefix {prefix}" + (f" d{d}" if d != D else ""),
        ms,
        "ms",
        ref_ms,
        ref_ms / ms,
        note,
        ok=err < 0.05,
    )


def _vs_ref(name: str, fast: Callable[[], object], ref: Callable[[], object], nbytes: int) -> Row:
    """Both timed as 10 calls in one CUDA graph (data stays L2-hot, as between adjacent ops)."""
    ms, ref_ms = time_graph_ms([fast] * 10), time_graph_ms([ref] * 10)
    note = f"{nbytes / ms / 1e6:.0f} GB/s vs torch {nbytes / ref_ms / 1e6:.0f} GB/s"
    return Row("misc", name, ms * 1e3, "us", ref_ms * 1e3, ref_ms / ms, note)


def _misc(bench: Bench) -> None:
    from radixlm.kernels import rmsnorm as rn
    from radixlm.kernels import rotary as rp
    from radixlm.kernels import store_kv as sk
    from radixlm.kernels import token_bitmask as tb

    hidden = 4096
    for rows in (64, 8192):
        x = torch.randn(rows, hidden, device="cuda", dtype=DT)
        r, w = torch.randn_like(x), torch.randn(hidden, device="cuda", dtype=DT)
        nb = 2 * x.numel() * 2
        name = f"rmsnorm {rows}x{hidden}"
        fast, ref = partial(rn.rmsnorm, x, w), partial(rn.rmsnorm_ref, x, w)
        bench.case("misc", name, _vs_ref, name, fast, ref, nb)
        name = f"fused_add_rmsnorm {rows}x{hidden}"
        fast, ref = (
            partial(rn.fused_add_rmsnorm, x, r, w),
            partial(rn.fused_add_rmsnorm_ref, x, r, w),
        )
        bench.case("misc", name, _vs_ref, name, fast, ref, 2 * nb)
    tokens = 8192
    q = torch.randn(tokens, H, D, device="cuda", dtype=DT)
    k = torch.randn(tokens, KVH, D, device="cuda", dtype=DT)
    cache = rp.build_cos_sin_cache(torch.rand(D // 2, device="cuda"), 32768)
    pos = torch.randint(0, 32768, (tokens,), device="cuda")
    nb = 2 * (q.numel() + k.numel()) * 2
    fast, ref = (
        partial(rp.rotary_embedding, pos, q, k, cache),
        partial(rp.rotary_embedding_ref, pos, q, k, cache),
    )
    bench.case("misc", "rope", _vs_ref, f"rope T={tokens}", fast, ref, nb)
    vocab, bs = 128256, 64
    logits = torch.randn(bs, vocab, device="cuda")
    mask = torch.randint(
        -(2**31), 2**31 - 1, (bs, math.ceil(vocab / 32)), dtype=torch.int32, device="cuda"
    )
    fast = partial(tb.apply_token_bitmask_inplace, logits, mask)
    ref = partial(tb.apply_token_bitmask_inplace_ref, logits, mask)
    bench.case("misc", "bitmask", _vs_ref, f"bitmask {bs}x{vocab}", fast, ref, logits.numel() * 4)
    kb, vb = _paged_pool(4 * tokens)
    kn, vn = (
        torch.randn(tokens, KVH, D, device="cuda", dtype=DT),
        torch.randn(tokens, KVH, D, device="cuda", dtype=DT),
    )
    loc = torch.randperm(4 * tokens, device="cuda")[:tokens] + 1
    fast, ref = (
        partial(sk.store_kv, kb, vb, loc, kn, vn),
        partial(sk.store_kv_ref, kb, vb, loc, kn, vn),
    )
    bench.case("misc", "store_kv", _vs_ref, f"store_kv T={tokens}", fast, ref, 4 * kn.numel() * 2)


def _sweep(bench: Bench, copy_gbs: float) -> None:
    """Config sweeps (~1 minute): decode tiles/stages/splits, extend tiles (bf16, 32/8 heads)."""
    decode_cases = {  # the rows behind `choose_num_kv_splits` (docs/benchmarks.md, run 18)
        (1, 4096): (16, 32, 64),
        (1, 32768): (32, 64),
        (8, 4096): (8, 16),
        (8, 32768): (8, 16),
        (32, 4096): (1, 2, 4),
        (64, 4096): (1, 2, 4),
    }
    for (bs, ctx), split_options in decode_cases.items():
        for splits in split_options:
            for cfg in ((16, 64, 4, 3), (16, 128, 4, 2)):
                bench.case("sweep", "decode", _decode_case, bs, ctx, copy_gbs, cfg, splits)
    for bs, ctx in ((1, 4096), (1, 32768), (8, 4096), (64, 4096)):  # FP8 pool: tile rows
        for cfg in ((16, 64, 4, 2), (16, 128, 4, 2), (16, 128, 4, 3), (16, 256, 8, 2)):
            bench.case("sweep", "decode", _decode_case, bs, ctx, copy_gbs, cfg, None, FP8)
    extend_cfgs = {
        128: (
            (128, 64, 128, 8, 3),
            (128, 64, 64, 8, 3),
            (128, 32, 128, 8, 3),
            (128, 64, 128, 8, 2),
        ),
        64: ((128, 64, 128, 4, 3), (128, 64, 128, 8, 3), (128, 32, 64, 4, 3), (128, 64, 64, 4, 4)),
    }
    for d, cfgs in extend_cfgs.items():
        for bs, new, prefix in ((8, 1024, 0), (8, 1024, 1024), (1, 512, 32256)):
            for cfg in cfgs:
                bench.case("sweep", "extend", _extend_case, bs, new, prefix, cfg, d)


def run_perf(bench: Bench, sections: set[str]) -> None:
    copy_gbs = float("nan")

    def copy_row() -> Row:
        nonlocal copy_gbs
        copy_gbs = _copy_bandwidth(bench)
        return Row("decode", "device copy bandwidth (read+write)", copy_gbs, "GB/s")

    bench.case("decode", "copy", copy_row)
    if "decode" in sections:
        ctxs, sizes = ((512,), (1, 8)) if bench.tiny else ((4096, 32768), (1, 8, 64))
        for ctx in ctxs:
            for bs in sizes:
                bench.case("decode", f"bs{bs} ctx{ctx}", _decode_case, bs, ctx, copy_gbs)
        for ctx in ctxs:  # an FP8 KV cache (kv_cache_dtype="fp8_e4m3")
            for bs in sizes:
                name = f"bs{bs} ctx{ctx} fp8"
                bench.case("decode", name, _decode_case, bs, ctx, copy_gbs, kv_dtype=FP8)
    if "extend" in sections:
        new, bs = (128, 2) if bench.tiny else (1024, 8)
        for prefix in (0, new):
            bench.case("extend", f"prefix {prefix}", _extend_case, bs, new, prefix)
    if "misc" in sections:
        _misc(bench)
    if "sweep" in sections:
        _sweep(bench, copy_gbs)
