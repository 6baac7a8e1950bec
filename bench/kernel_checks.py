"""The `check` section of `radixlm bench kernels`: every kernel against its torch reference at
Llama-3-8B shapes (32 heads, 8 kv heads, head_dim 128; bf16, fp16, fp32), incl. 32k contexts and
a CUDA-graph replay of decode attention; each row is a max abs error against a tolerance.
`--tiny` shapes run on CPU in Triton's interpreter (`bench.kernels.main` sets it up first).
"""

from __future__ import annotations

import math

import torch

from radixlm.bench.kernel_timing import Bench, Row
from radixlm.kernels.decode_attention_ref import decode_attention_ref


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    if torch.isnan(a).any():
        return math.inf
    return (a.float() - b.float()).abs().max().item()


TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def run_checks(bench: Bench) -> None:
    from radixlm.kernels import decode_attention as da
    from radixlm.kernels import extend_attention as ea
    from radixlm.kernels.testing import make_paged_batch

    dev, tiny = bench.device, bench.tiny
    dtypes = [torch.float32] if dev == "cpu" else [torch.bfloat16, torch.float16, torch.float32]
    if tiny:
        shapes = [(4, 2, 64), (8, 1, 80)]
        dec_lens, ext_case = [1, 37, 70], ([0, 20, 3], [33, 1, 17])
    else:
        shapes = [(32, 8, 128), (32, 8, 64), (28, 4, 96), (32, 32, 80)]
        dec_lens = [32768, 1, 4097, 900, 77, 16000, 2, 300]
        ext_case = ([0, 32768 - 512, 1000, 37], [1024, 512, 1, 300])

    def check_decode(h: int, kvh: int, d: int, dtype: torch.dtype, lens: list[int]) -> Row:
        batch = make_paged_batch([n - 1 for n in lens], [1] * len(lens), h, kvh, d, dtype, dev)
        args = batch.decode_args()
        out = torch.full_like(batch.q, float("nan"))
        da.decode_attention(*args, out=out)
        err = _err(out, decode_attention_ref(*args))
        return Row(
            "check",
            f"decode h{h}/{kvh} d{d} {str(dtype)[6:]} max{max(lens)}",
            err,
            "abs",
            TOL[dtype],
            None,
            "",
            err <= TOL[dtype],
        )

    def check_extend(h: int, kvh: int, d: int, dtype: torch.dtype, case: tuple) -> Row:
        batch = make_paged_batch(case[0], case[1], h, kvh, d, dtype, dev)
        args = batch.extend_args()
        out = torch.full_like(batch.q, float("nan"))
        ea.extend_attention(*args, batch.max_extend_len, out=out)
        err = _err(out, ea.extend_attention_ref(*args))
        name = f"extend h{h}/{kvh} d{d} {str(dtype)[6:]} pre{max(case[0])}"
        return Row("check", name, err, "abs", TOL[dtype], None, "", err <= TOL[dtype])

    h, kvh, d = shapes[0]
    for dtype in dtypes:
        bench.case("check", "decode", check_decode, h, kvh, d, dtype, dec_lens)
        bench.case("check", "extend", check_extend, h, kvh, d, dtype, ext_case)
    small_dec, small_ext = [1, 100, 333], ([0, 70, 129], [65, 1, 200])
    for h2, kvh2, d2 in shapes[1:]:
        bench.case("check", "decode", check_decode, h2, kvh2, d2, dtypes[0], small_dec)
        bench.case("check", "extend", check_extend, h2, kvh2, d2, dtypes[0], small_ext)
    if dev == "cuda":
        bench.case("check", "decode cuda graph", _check_graph, dec_lens, shapes[0])
    _check_misc(bench, dtypes)


def _check_graph(lens: list[int], shape: tuple[int, int, int]) -> Row:
    from radixlm.kernels import decode_attention as da
    from radixlm.kernels.testing import make_paged_batch

    h, kvh, d = shape
    batch = make_paged_batch(
        [n - 1 for n in lens], [1] * len(lens), h, kvh, d, torch.bfloat16, "cuda"
    )
    args = batch.decode_args()
    splits = da.choose_num_kv_splits(len(lens), max(lens), kvh)
    mid_o, mid_lse = da.alloc_decode_workspace(len(lens), h, d, splits, "cuda")
    out = torch.empty_like(batch.q)
    arrivals = torch.zeros(len(lens) * h, dtype=torch.int32, device="cuda")  # fused merge
    da.decode_attention_fwd(*args, out, mid_o, mid_lse, arrivals=arrivals)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        da.decode_attention_fwd(*args, out, mid_o, mid_lse, arrivals=arrivals)
    batch.seq_lens[0] = max(1, lens[0] // 2)  # new data (within the tokens it owns), same shapes
    out.fill_(float("nan"))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    err = _err(out, decode_attention_ref(*args))
    if arrivals.any():  # the counters must come back to zero after every launch
        err = float("inf")
    tol = TOL[torch.bfloat16]
    return Row(
        "check", f"decode graph replay splits={splits}", err, "abs", tol, None, "", err <= tol
    )


def _check_misc(bench: Bench, dtypes: list[torch.dtype]) -> None:
    from radixlm.kernels import argmax as am
    from radixlm.kernels import rmsnorm as rn
    from radixlm.kernels import rotary as rp
    from radixlm.kernels import store_kv as sk
    from radixlm.kernels import token_bitmask as tb

    dev = bench.device
    hidden, vocab, tokens = (96, 1000, 5) if bench.tiny else (4096, 128256, 257)
    heads, kvh, d = (4, 2, 64) if bench.tiny else (32, 8, 128)
    dtype = dtypes[0]
    # bf16 may differ by one ulp (rounding order); under the interpreter it truncates.
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2

    def rms() -> Row:
        x = torch.randn(tokens, hidden, device=dev).to(dtype)
        r = torch.randn_like(x)
        w = (1 + 0.1 * torch.randn(hidden, device=dev)).to(dtype)
        e1 = _err(rn.rmsnorm(x, w) / 4, rn.rmsnorm_ref(x, w) / 4)
        o, res = rn.fused_add_rmsnorm(x, r, w)
        eo, eres = rn.fused_add_rmsnorm_ref(x, r, w)
        err = max(e1, _err(o / 4, eo / 4), _err(res / 4, eres / 4))
        return Row(
            "check", f"rmsnorm+fused {str(dtype)[6:]}", err, "abs/4", tol, None, "", err <= tol
        )

    def rope() -> Row:
        """rotary_embedding, and rotary_store_kv (the pool's rows must equal the rotated k, v)."""
        q = torch.randn(tokens, heads, d, device=dev).to(dtype)
        k, v = torch.randn(2, tokens, kvh, d, device=dev).to(dtype)
        inv = 1.0 / 500000.0 ** (torch.arange(0, d, 2, device=dev).float() / d)
        cache = rp.build_cos_sin_cache(inv, 40000)
        pos = torch.randint(0, 40000, (tokens,), device=dev)
        q2, k2, q3, k3 = q.clone(), k.clone(), q.clone(), k.clone()
        rp.rotary_embedding(pos, q, k, cache)
        rp.rotary_embedding_ref(pos, q2, k2, cache)
        buf_k, buf_v = torch.zeros(2, 2 * tokens, kvh, d, device=dev, dtype=dtype)
        loc = torch.randperm(2 * tokens - 1, device=dev)[:tokens] + 1
        rp.rotary_store_kv(pos, q3, k3, v, cache, buf_k, buf_v, loc)
        pairs = [(q, q2), (k, k2), (q3, q2), (k3, k2), (buf_k[loc], k2)]
        err = max(_err(a / 4, b / 4) for a, b in pairs)
        if not torch.equal(buf_v[loc], v):
            err = float("inf")
        name = f"rope, rope+store_kv {str(dtype)[6:]}"
        return Row("check", name, err, "abs/4", tol, None, "", err <= tol)

    def bitmask() -> Row:
        logits = torch.randn(9, vocab, device=dev)
        words = (vocab + 31) // 32
        mask = torch.randint(-(2**31), 2**31 - 1, (9, words), dtype=torch.int32, device=dev)
        a, b = logits.clone(), logits.clone()
        idx = torch.tensor([0, 3, 8], device=dev)
        tb.apply_token_bitmask_inplace(a, mask, idx)
        tb.apply_token_bitmask_inplace_ref(b, mask, idx)
        same = torch.equal(a, b)
        return Row("check", "bitmask (indices)", 0.0 if same else 1.0, "diff", 0.0, None, "", same)

    def argmax() -> Row:
        logits = torch.randn(9, vocab, device=dev)
        logits[1, [5, vocab - 1]] = 100.0  # a tie: the lower column wins, as torch
        same = torch.equal(am.argmax_rows(logits), am.argmax_rows_ref(logits))
        return Row("check", "argmax", 0.0 if same else 1.0, "diff", 0.0, None, "", same)

    def store() -> Row:
        buf_k = torch.randn(4 * tokens, kvh, d, device=dev).to(dtype)
        buf_v, ref_k = torch.randn_like(buf_k), buf_k.clone()
        ref_v = buf_v.clone()
        k, v = (
            torch.randn(tokens, kvh, d, device=dev).to(dtype),
            torch.randn(tokens, kvh, d, device=dev).to(dtype),
        )
        loc = torch.randperm(4 * tokens - 1, device=dev)[:tokens] + 1
        sk.store_kv(buf_k, buf_v, loc, k, v)
        sk.store_kv_ref(ref_k, ref_v, loc, k, v)
        same = torch.equal(buf_k, ref_k) and torch.equal(buf_v, ref_v)
        return Row("check", "store_kv", 0.0 if same else 1.0, "diff", 0.0, None, "", same)

    def step_inputs() -> Row:
        """decode_inputs at the largest captured batch, into a wider buffer (as the graphs')."""
        from radixlm.kernels import decode_inputs as di

        bs, rows, ctx = (7, 16, 64) if bench.tiny else (512, 1024, 32768)
        req_rows = torch.randperm(rows, device=dev)[:bs]
        cols = torch.stack([req_rows, *torch.randint(0, ctx, (2, bs), device=dev)])
        slots = torch.randperm(1 << 20, device=dev)[:bs] + 1
        got = []
        for fn in (di.decode_inputs, di.decode_inputs_ref):
            table = torch.zeros(rows, ctx, dtype=torch.int32, device=dev)
            out = torch.full((5, bs + 8), -1, dtype=torch.int64, device=dev)
            got.append((fn(cols, None, slots, table, out[:, :bs]), table))
        same = all(torch.equal(a, b) for a, b in zip(*got))
        return Row("check", "decode_inputs", 0.0 if same else 1.0, "diff", 0.0, None, "", same)

    for name, fn in [
        ("rmsnorm", rms),
        ("rope", rope),
        ("bitmask", bitmask),
        ("argmax", argmax),
        ("store_kv", store),
        ("decode_inputs", step_inputs),
    ]:
        bench.case("check", name, fn)
    _check_gemv(bench, dtype)


def _check_gemv(bench: Bench, dtype: torch.dtype) -> None:
    """Every decode GEMV candidate against its reference at Llama-3-8B's qkv and down shapes,
    M = 1 and 5 (relative to the largest output), and the activation kernel."""
    from radixlm.kernels import activation
    from radixlm.kernels import gemv as gv

    dev = bench.device
    if bench.tiny:  # interpreter: one plain and one persistent config, small tiles
        configs = [{**c, "block_k": 64} for c in (gv.GEMV_CONFIGS[0], gv.GEMV_CONFIGS[-1])]
        shapes, rows = [(40, 96), (33, 300)], (3,)
    else:
        configs = list(gv.GEMV_CONFIGS)
        shapes, rows = [(6144, 4096), (4096, 14336)], (1, 5)
    tol = 1e-5 if dtype == torch.float32 else 1e-2

    def check(n: int, k: int) -> Row:
        w = (0.02 * torch.randn(n, k, device=dev)).to(dtype)
        err = 0.0
        for m in rows:
            x = torch.randn(m, k, device=dev).to(dtype)
            ref = gv.gemv_ref(x, w).float()
            for cfg in configs:
                out = gv.gemv(x, w, **cfg).float()
                err = max(err, _err(out, ref) / ref.abs().max().item())
        name = f"gemv {n}x{k} x{len(configs)} configs"
        return Row("check", name, err, "rel", tol, None, "", err <= tol)

    def check_activation(m: int, n: int) -> Row:
        x = (4 * torch.randn(m, 2 * n, device=dev)).to(dtype)
        ref = activation.act_and_mul_ref(x).float()
        err = _err(activation.act_and_mul(x).float(), ref) / ref.abs().max().item()
        return Row("check", f"silu_and_mul {m}x{n}", err, "rel", tol, None, "", err <= tol)

    for n, k in shapes:
        bench.case("check", "gemv", check, n, k)
    bench.case(
        "check", "silu_and_mul", check_activation, *((3, 40) if bench.tiny else (300, 14336))
    )
