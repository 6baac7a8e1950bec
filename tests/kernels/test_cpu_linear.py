"""The CPU linear kernels (kernels/cpu) against their torch references and against the `gguf`
package's own quantiser/de-quantiser (K-quants: hand-built random super-blocks, since `gguf` cannot
quantise them, against its de-quantiser); the torch fallback when the library cannot be built."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from kquant_blocks import random_kquant_blocks

from radixlm.kernels.cpu import build
from radixlm.kernels.cpu import linear as cl

needs_lib = pytest.mark.skipif(
    build.isa() is None or build.compiler() is None, reason="no AVX2 CPU or no C++ compiler"
)
QTYPES = {cl.Q8_0: "Q8_0", cl.Q4_0: "Q4_0", cl.Q4_1: "Q4_1", cl.Q5_0: "Q5_0", cl.Q5_1: "Q5_1"}
KQTYPES = {cl.Q4_K: "Q4_K", cl.Q5_K: "Q5_K", cl.Q6_K: "Q6_K"}


def _blocks(w: torch.Tensor, qtype: int) -> torch.Tensor:
    q = gguf_quantize(w.numpy(), GGMLQuantizationType[QTYPES[qtype]])
    return torch.from_numpy(np.ascontiguousarray(q))


@needs_lib
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 576), (3, 70, 100), (8, 33, 1536)])
def test_dense_matches_reference(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    x = torch.randn(m, k)
    w = torch.randn(n, k).to(dtype)
    y = cl.linear_dense(x, w)
    assert y is not None and y.shape == (m, n)
    torch.testing.assert_close(y, cl.linear_dense_ref(x, w), rtol=1e-4, atol=1e-3)


@needs_lib
@pytest.mark.parametrize("qtype", list(QTYPES))
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 576), (5, 37, 1536), (11, 20, 64)])
def test_quant_matches_gguf_dequantize(qtype: int, m: int, n: int, k: int) -> None:
    w = torch.randn(n, k)
    blocks = _blocks(w, qtype)
    want_w = torch.from_numpy(
        gguf_dequantize(blocks.numpy(), GGMLQuantizationType[QTYPES[qtype]])
    ).reshape(n, k)
    torch.testing.assert_close(cl.dequant_ref(blocks, qtype, k), want_w)
    torch.testing.assert_close(cl.dequant(blocks, qtype, k), want_w)
    x = torch.randn(m, k)
    y = cl.linear_quant(x, blocks, qtype, k)
    assert y is not None
    xq = cl.q8_activations_ref(x)  # the 32-value block types read x quantised to int8 per 32
    torch.testing.assert_close(y, xq @ want_w.t(), rtol=1e-4, atol=2e-3)
    torch.testing.assert_close(cl.linear_quant_ref(x, blocks, qtype, k), xq @ want_w.t())
    # and that rounding costs what llama.cpp's Q8 activations cost: ~1 % of the output's scale
    err = (y - x @ want_w.t()).pow(2).mean().sqrt() / (x @ want_w.t()).pow(2).mean().sqrt()
    assert 0 < err < 0.02


def test_q8_activations_ref_rounding() -> None:
    """Per 32 values: the largest magnitude maps to +-127 exactly, ties round to even, a block
    of zeros stays zero."""
    x = torch.zeros(1, 64)
    x[0, :4] = torch.tensor([127.0, 0.5, 1.5, -2.5])  # amax 127: scale 1, the ties as given
    got = cl.q8_activations_ref(x)
    assert got[0, :4].tolist() == [127.0, 0.0, 2.0, -2.0]
    assert torch.equal(got[0, 32:], torch.zeros(32))


@needs_lib
@pytest.mark.parametrize("qtype", list(KQTYPES))
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 512), (5, 37, 1536), (16, 9, 256)])
def test_kquant_matches_gguf_dequantize(qtype: int, m: int, n: int, k: int) -> None:
    """Q4_K/Q5_K/Q6_K super-blocks: the block kernel (decode) and the de-quantisers (prefill,
    torch reference) against `gguf.quants.dequantize` + a torch matmul."""
    blocks = torch.from_numpy(random_kquant_blocks(np.random.default_rng(qtype + n), n, k, qtype))
    assert blocks.shape == (n, cl.row_bytes(qtype, k))
    want_w = torch.from_numpy(
        gguf_dequantize(blocks.numpy(), GGMLQuantizationType[KQTYPES[qtype]])
    ).reshape(n, k)
    assert want_w.abs().max() < 16 and want_w.std() > 0.1  # the blocks hold sensible values
    torch.testing.assert_close(cl.dequant_ref(blocks, qtype, k), want_w)
    torch.testing.assert_close(cl.dequant(blocks, qtype, k), want_w)
    x = torch.randn(m, k)
    y = cl.linear_quant(x, blocks, qtype, k)
    assert y is not None
    torch.testing.assert_close(y, x @ want_w.t(), rtol=1e-4, atol=2e-3)
    torch.testing.assert_close(cl.linear_quant_ref(x, blocks, qtype, k), x @ want_w.t())


@needs_lib
@pytest.mark.parametrize("qtype", list(cl.PACKABLE))
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 576), (13, 48, 1536), (3, 16, 32)])
def test_packed_blocks_match_gguf_dequantize(qtype: int, m: int, n: int, k: int) -> None:
    """The 16-row packed form (q8pack.h): the same bytes moved, undone by `unpack_blocks`, and its
    kernel computes what gguf's de-quantiser and the Q8 activations give."""
    blocks = _blocks(torch.randn(n, k), qtype)
    packed, ptype = cl.pack_blocks(blocks, qtype)
    assert ptype == cl.QPACK + qtype and packed.shape == blocks.shape
    assert not torch.equal(packed, blocks)
    assert torch.equal(packed.flatten().sort().values, blocks.flatten().sort().values)
    unpacked, utype = cl.unpack_blocks(packed, ptype)
    assert utype == qtype and torch.equal(unpacked, blocks)
    want_w = torch.from_numpy(
        gguf_dequantize(blocks.numpy(), GGMLQuantizationType[QTYPES[qtype]])
    ).reshape(n, k)
    x = torch.randn(m, k)
    y = cl.linear_quant(x, packed, ptype, k)
    assert y is not None
    torch.testing.assert_close(y, cl.q8_activations_ref(x) @ want_w.t(), rtol=1e-4, atol=2e-3)


@needs_lib
@pytest.mark.parametrize("library", ["loaded", "avx2"])
@pytest.mark.parametrize("qtype", [cl.Q4_0, cl.Q4_1])
def test_packed_q4_extreme_codes_do_not_saturate(library: str, qtype: int) -> None:
    """Codes all 15 against activations all at +-127: the largest integer sums of a block (the
    8-lane and non-VNNI builds add a block's `vpmaddubsw` pair sums in int16: 16 x 15 x 127 =
    30480 per lane must not wrap or saturate)."""
    import ctypes

    lib = (
        build.load()
        if library == "loaded"
        else build._bind(ctypes.CDLL(build.build("avx2", build.compiler())))
    )
    n, k = 32, 256
    bb = cl.BLOCK_BYTES[qtype]
    blocks = torch.full((n, k // 32, bb), 0xFF, dtype=torch.uint8)
    hdr = [1.0, 0.0] if qtype == cl.Q4_1 else [1.0]
    blocks[:, :, : 2 * len(hdr)] = torch.tensor(hdr, dtype=torch.float16).view(torch.uint8)
    blocks = blocks.view(n, -1).contiguous()
    packed, ptype = cl.pack_blocks(blocks, qtype)
    want_w = torch.from_numpy(
        gguf_dequantize(blocks.numpy(), GGMLQuantizationType[QTYPES[qtype]])
    ).reshape(n, k)
    sign = torch.tensor([1.0, -1.0]).repeat(4).view(-1, 1)
    for x in (torch.ones(8, k) * sign, torch.ones(1, k), -torch.ones(3, k)):
        m = x.shape[0]
        y = torch.empty(m, n)
        assert (
            lib.rl_linear_quant(x.data_ptr(), m, k, packed.data_ptr(), ptype, n, y.data_ptr()) == 0
        )
        torch.testing.assert_close(y, cl.q8_activations_ref(x) @ want_w.t(), rtol=1e-5, atol=1e-3)


@needs_lib
def test_packing_needs_whole_groups() -> None:
    blocks = _blocks(torch.randn(24, 64), cl.Q4_1)
    assert cl.pack_blocks(blocks, cl.Q4_1) == (blocks, cl.Q4_1)  # 24 rows: not whole groups
    assert cl.pack_blocks(_blocks(torch.randn(16, 64), cl.Q5_0), cl.Q5_0)[1] == cl.Q5_0
    lib = build.load()
    x, y = torch.randn(1, 64), torch.empty(1, 24)
    p = (x.data_ptr(), 1, 64, blocks.data_ptr(), cl.QPACK + cl.Q4_1, 24, y.data_ptr())
    assert lib.rl_linear_quant(*p) == -2  # the kernel refuses a packed N that is not 16 | N


@needs_lib
def test_avx2_library_block_kernels() -> None:
    """The 8-lane (AVX2) build, which an AVX-512 machine never loads, computes every block type
    like the 16-lane one: both match `gguf`'s de-quantiser + a torch matmul."""
    import ctypes

    lib = build._bind(ctypes.CDLL(build.build("avx2", build.compiler())))
    assert lib.rl_simd_width() == 8
    rng = np.random.default_rng(7)
    m, n, k = 7, 11, 512  # 4 + 2 + 1 rows: every batched-row path of the 8-lane build
    x = torch.randn(m, k)
    for qtype, name in {**QTYPES, **KQTYPES}.items():
        if qtype in KQTYPES:
            blocks = torch.from_numpy(random_kquant_blocks(rng, n, k, qtype))
        else:
            blocks = _blocks(torch.randn(n, k), qtype)
        want_w = torch.from_numpy(
            gguf_dequantize(blocks.numpy(), GGMLQuantizationType[name])
        ).reshape(n, k)
        y, w = torch.empty(m, n), torch.empty(n, k)
        assert (
            lib.rl_linear_quant(x.data_ptr(), m, k, blocks.data_ptr(), qtype, n, y.data_ptr()) == 0
        )
        assert lib.rl_dequant(blocks.data_ptr(), qtype, n, k, w.data_ptr()) == 0
        torch.testing.assert_close(w, want_w, msg=name)
        xq = x if qtype in KQTYPES else cl.q8_activations_ref(x)
        torch.testing.assert_close(y, xq @ want_w.t(), rtol=1e-4, atol=2e-3, msg=name)


def test_without_compiler_falls_back_with_one_log_line(tmp_path) -> None:
    """No compiler: every entry point returns None and one warning names the reason."""
    code = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n"
        "from radixlm.kernels.cpu import linear as cl\n"
        "x, w = torch.randn(1, 64), torch.randn(8, 64)\n"
        "assert cl.linear_dense(x, w) is None and cl.dequant(torch.zeros(1, 34, dtype=torch.uint8), 8, 32) is None\n"
        "assert not cl.available()\n"
        "print('FALLBACK-OK')\n"
    )
    env = {
        "CXX": "/nonexistent/c++",
        "RADIXLM_CACHE_DIR": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # where radixlm is importable that way
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert "FALLBACK-OK" in out.stdout
    lines = [ln for ln in out.stderr.splitlines() if "CPU kernels unavailable" in ln]
    assert len(lines) == 1 and "no C++ compiler" in lines[0], out.stderr


def test_disabled_by_env(monkeypatch, caplog) -> None:
    build.load.cache_clear()
    monkeypatch.setenv(build.DISABLE_ENV, "0")
    try:
        with caplog.at_level(logging.WARNING):
            assert build.load() is None
        assert "RADIXLM_CPU_KERNELS=0" in caplog.text
    finally:
        build.load.cache_clear()


@needs_lib
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_attention_matches_reference(dtype: torch.dtype) -> None:
    from radixlm.kernels.cpu.attention import decode_attention, decode_attention_ref

    slots_total, kvh, d, h = 300, 3, 64, 9
    k_pool = torch.randn(slots_total, kvh, d).to(dtype)
    v_pool = torch.randn(slots_total, kvh, d).to(dtype)
    table = torch.zeros(4, 128, dtype=torch.int32)
    lens = [1, 37, 128]
    perm = torch.randperm(slots_total - 1)[: sum(lens)] + 1
    start = 0
    for row, n in enumerate(lens):
        table[row + 1, :n] = perm[start : start + n].int()
        start += n
    rows, seq_lens = torch.tensor([3, 1, 2]), torch.tensor([128, 1, 37])
    table[3] = table[3].clone()
    table[3, :128] = (torch.arange(128) + 1).int()
    q = torch.randn(3, h, d)
    got = decode_attention(q, k_pool, v_pool, table, rows, seq_lens, d**-0.5)
    want = decode_attention_ref(q, k_pool, v_pool, table, rows, seq_lens, d**-0.5)
    assert got is not None
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@needs_lib
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("rows", [1, 40])
def test_rmsnorm_matches_reference(with_residual: bool, rows: int) -> None:
    from radixlm.kernels.cpu.norm import rmsnorm, rmsnorm_ref

    x, w = torch.randn(rows, 576), torch.randn(576)
    res = torch.randn(rows, 576) if with_residual else None
    got, want = rmsnorm(x, res, w, 1e-5), rmsnorm_ref(x, res, w, 1e-5)
    assert got is not None
    if with_residual:
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(got[1], want[1])  # the residual sum is exact
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_lib
@pytest.mark.parametrize("shape", [(1, 2 * 1536), (40, 2 * 100)])  # 100: a tail of 4 lanes
def test_silu_mul_matches_torch(shape: tuple[int, int]) -> None:
    from radixlm.kernels.cpu.activation import silu_mul

    y = torch.randn(*shape) * 8
    y[0, :3] = torch.tensor([-200.0, 200.0, 0.0])  # exp's clamps, and zero
    gate, up = y.chunk(2, dim=-1)
    got = silu_mul(y)
    assert got is not None
    torch.testing.assert_close(got, torch.nn.functional.silu(gate) * up, rtol=2e-6, atol=1e-30)
