"""Batch invariance of the CPU linear kernels (kernels/cpu/gemv.h, q8dot.h): a row's output is
bitwise the same computed alone (a batch-1 decode step), in a batch of 2..17 decode rows, or in a
prefill chunk of any size, for every weight form the CPU modes use (fp32, fp16, bf16, the GGUF
block types), in every build of the library this CPU runs. Speculative decoding's exactness rests
on it: a verify step computes k + 1 rows per request where plain decode computes one."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize
from kquant_blocks import random_kquant_blocks

from radixlm.kernels.cpu import build
from radixlm.kernels.cpu import linear as cl

_ORDER = ["avx2", "avx512", "avx512vnni"]  # each CPU that runs a build runs those before it
TARGETS = _ORDER[: _ORDER.index(build.isa()) + 1] if build.isa() in _ORDER else []
needs_lib = pytest.mark.skipif(
    not TARGETS or build.compiler() is None, reason="no AVX2 CPU or no C++ compiler"
)
ROWS = 300  # > linear.cpp's M_BLOCK: the prefill chunk spans two blocks of x rows


def _lib(target: str) -> ctypes.CDLL:
    return build._bind(ctypes.CDLL(build.build(target, build.compiler())))


def _quant(lib: ctypes.CDLL, x: torch.Tensor, blocks: torch.Tensor, qtype: int, k: int):
    y = torch.empty(x.shape[0], blocks.shape[0])
    xc = x.contiguous()
    rc = lib.rl_linear_quant(
        xc.data_ptr(), x.shape[0], k, blocks.data_ptr(), qtype, blocks.shape[0], y.data_ptr()
    )
    assert rc == 0
    return y


def _dense(lib: ctypes.CDLL, x: torch.Tensor, w: torch.Tensor):
    y = torch.empty(x.shape[0], w.shape[0])
    xc = x.contiguous()
    rc = lib.rl_linear_dense(
        xc.data_ptr(), x.shape[0], x.shape[1], w.data_ptr(), cl._WTYPES[w.dtype], w.shape[0],
        y.data_ptr(),
    )  # fmt: skip
    assert rc == 0
    return y


def _assert_invariant(run, x: torch.Tensor) -> torch.Tensor:
    """run(rows of x) -> their outputs: every row alone, every window of 2..17 rows and the
    whole chunk agree bitwise. Returns the chunk's output."""
    full = run(x)
    for i in range(x.shape[0]):
        assert torch.equal(run(x[i : i + 1])[0], full[i]), f"row {i} alone"
    for m in range(2, 18):
        for start in (0, 5 * m):
            got = run(x[start : start + m])
            assert torch.equal(got, full[start : start + m]), f"rows {start}..{start + m}"
    return full


@needs_lib
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "qtype", [cl.Q4_1, cl.Q4_0, cl.Q5_0, cl.Q5_1, cl.Q8_0, *(cl.QPACK + q for q in cl.PACKABLE)]
)
@pytest.mark.parametrize("k", [576, 96])  # 18 and 3 blocks: the odd block count's tail
def test_block_rows_alone_batched_and_prefill_agree(target: str, qtype: int, k: int) -> None:
    lib = _lib(target)
    w = torch.randn(48 if qtype > cl.QPACK else 37, k)  # 37: chunks of rows and their remainder
    blocks = torch.from_numpy(
        np.ascontiguousarray(gguf_quantize(w.numpy(), GGMLQuantizationType[cl.QTYPE_NAMES[qtype]]))
    )
    if qtype > cl.QPACK:  # 3 groups of 16 rows: one 32-row chunk and a half chunk
        blocks, qtype = cl.pack_blocks(blocks, qtype - cl.QPACK)
    x = torch.randn(ROWS, k) * torch.rand(ROWS, 1) * 4  # rows of different scales
    x[3, :32] = 0.0  # an all-zero block of x (scale 0)
    full = _assert_invariant(lambda xs: _quant(lib, xs, blocks, qtype, k), x)
    torch.testing.assert_close(full, cl.linear_quant_ref(x, blocks, qtype, k), rtol=1e-4, atol=5e-3)
    if target != "avx2":  # NOTE: by construction (q8dot.h, q8pack.h) the AVX-512 builds equal AVX2
        assert torch.equal(full, _quant(_lib("avx2"), x, blocks, qtype, k))


@needs_lib
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("qtype", [cl.Q4_K, cl.Q5_K, cl.Q6_K])
def test_kquant_rows_alone_batched_and_chunked_agree(target: str, qtype: int) -> None:
    lib, k = _lib(target), 512
    blocks = torch.from_numpy(random_kquant_blocks(np.random.default_rng(qtype), 19, k, qtype))
    _assert_invariant(lambda xs: _quant(lib, xs, blocks, qtype, k), torch.randn(40, k))


@needs_lib
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k", [576, 579])  # 579: the K % VW tail
def test_dense_rows_alone_batched_and_prefill_agree(
    target: str, dtype: torch.dtype, k: int
) -> None:
    lib = _lib(target)
    w = torch.randn(37, k).to(dtype)
    x = torch.randn(ROWS, k)
    full = _assert_invariant(lambda xs: _dense(lib, xs, w), x)
    torch.testing.assert_close(full, cl.linear_dense_ref(x, w), rtol=1e-4, atol=2e-3)


@needs_lib
@pytest.mark.parametrize("form", ["Q4_1", "float32", "bfloat16"])
def test_cpu_linear_layer_is_batch_invariant(form: str) -> None:
    """The layer seam (runtime/models/cpu_linear.py) sends decode rows and prefill chunks alike
    through the kernels: a prefill row equals the same row decoded alone."""
    from radixlm.runtime.models.cpu_linear import CpuLinear

    k, n = 576, 70
    w = torch.randn(n, k)
    if form == "Q4_1":
        q = gguf_quantize(w.numpy(), GGMLQuantizationType.Q4_1)
        layer = CpuLinear(
            None, blocks=torch.from_numpy(np.ascontiguousarray(q)), qtype=cl.Q4_1, k=k
        )
        x = torch.randn(48, k)
    else:
        dtype = getattr(torch, form)
        layer, x = CpuLinear(w.to(dtype).contiguous()), torch.randn(48, k).to(dtype)
    full = layer(x)
    for i in (0, 17, 47):
        assert torch.equal(layer(x[i : i + 1])[0], full[i])
    assert torch.equal(layer(x[8:17]), full[8:17])


@needs_lib
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_attention_query_alone_equals_extend_block(kv_dtype: torch.dtype) -> None:
    """The CPU attention kernel: an extend's 40 causal queries of one request in one call (runs of
    tokens sharing K/V loads), mixed with another request's decode query, equal each query
    computed alone (a decode step's attention), bitwise."""
    from radixlm.kernels.cpu.attention import decode_attention

    heads, kv_heads, dim, n = 9, 3, 64, 40
    k_pool = torch.randn(128, kv_heads, dim).to(kv_dtype)
    v_pool = torch.randn(128, kv_heads, dim).to(kv_dtype)
    table = torch.zeros(3, 64, dtype=torch.int32)
    table[1, :n] = torch.randperm(100)[:n].int() + 1
    table[2, :7] = torch.arange(101, 108, dtype=torch.int32)
    rows = torch.tensor([1] * n + [2])
    lens = torch.tensor([*range(1, n + 1), 7])
    q = torch.randn(n + 1, heads, dim)
    together = decode_attention(q, k_pool, v_pool, table, rows, lens, dim**-0.5)
    assert together is not None
    for t in range(n + 1):
        alone = decode_attention(q[t : t + 1], k_pool, v_pool, table, rows[t : t + 1],
                                 lens[t : t + 1], dim**-0.5)  # fmt: skip
        assert alone is not None and torch.equal(alone[0], together[t]), f"query {t}"
