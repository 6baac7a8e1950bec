"""The whole-step CPU decode kernel (kernels/cpu/decode.cpp) against its torch reference
(`decode_step_ref`): dense fp32/fp16/bf16 weights and KV pools, GGUF block parts of every type
(stacked parts of different types in one layer, as llama.cpp's mixed files have), a qkv bias,
batches whose requests have different lengths; the AVX2 build on an AVX-512 machine too."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize
from kquant_blocks import random_kquant_blocks

from radixlm.kernels.cpu import build
from radixlm.kernels.cpu import decode as dk
from radixlm.kernels.cpu import linear as cl

needs_lib = pytest.mark.skipif(
    build.isa() is None or build.compiler() is None, reason="no AVX2 CPU or no C++ compiler"
)
H, KVH, DH = 4, 2, 32


def _part(n: int, k: int, form: int | torch.dtype, rng: np.random.Generator):
    if isinstance(form, torch.dtype):
        return (torch.randn(n, k) * 0.2).to(form), -1
    if form in (cl.Q4_K, cl.Q5_K, cl.Q6_K):  # values up to ~16: the norms' weights are small
        return torch.from_numpy(random_kquant_blocks(rng, n, k, form)), form
    w = (torch.randn(n, k) * 0.2).numpy()
    q = gguf_quantize(w, GGMLQuantizationType[cl.QTYPE_NAMES[form]])
    blocks = torch.from_numpy(np.ascontiguousarray(q))
    return cl.pack_blocks(blocks, form - cl.QPACK) if form > cl.QPACK else (blocks, form)


def _linear(sizes: list[int], k: int, forms: list, rng, bias: bool = False) -> dk.LinearSpec:
    parts = [_part(n, k, f, rng) for n, f in zip(sizes, forms)]
    b = torch.randn(sum(sizes)) * 0.1 if bias else None
    return dk.LinearSpec(parts, k, b)


def _model(hidden: int, inter: int, forms: list, kv_dtype: torch.dtype, bias: bool, layers=2):
    rng = np.random.default_rng(0)
    slots, table = 256, torch.zeros(12, 40, dtype=torch.int32)
    specs = []
    for _ in range(layers):
        norm = 0.05 if isinstance(forms[0], int) and forms[0] >= 12 else 1.0
        specs.append(
            dk.LayerSpec(
                _linear([H * DH, KVH * DH, KVH * DH], hidden, forms[:3], rng, bias),
                _linear([hidden], H * DH, forms[3:4], rng),
                _linear([inter, inter], hidden, forms[4:6], rng),
                _linear([hidden], inter, forms[6:7], rng),
                torch.rand(hidden) * norm + 0.5 * norm,
                torch.rand(hidden) * norm + 0.5 * norm,
                torch.randn(slots, KVH, DH).to(kv_dtype),
                torch.randn(slots, KVH, DH).to(kv_dtype),
            )
        )
    freqs = torch.arange(64.0)[:, None] * (1e4 ** (-torch.arange(0, DH, 2) / DH))[None, :]
    return dk.DecodeModel(
        specs, torch.randn(100, hidden) * 0.5, torch.rand(hidden) + 0.5, freqs.cos(), freqs.sin(),
        table, H, KVH, DH, inter, 1e-5, DH**-0.5,
    )  # fmt: skip


def _batch(model: dk.DecodeModel, lens: list[int]):
    """Requests in table rows 1.. with distinct slots; the last position is the new token."""
    slot = 1
    for row, n in enumerate(lens, start=1):
        model.table[row, :n] = torch.arange(slot, slot + n, dtype=torch.int32)
        slot += n
    rows = torch.arange(1, len(lens) + 1)
    lens_t = torch.tensor(lens)
    loc = model.table[rows, lens_t - 1].long()
    ids = torch.tensor([7, 42, 99, 3, 5, 8, 13, 21, 34, 55, 89][: len(lens)])
    return ids, lens_t - 1, loc, rows, lens_t


def _check(model: dk.DecodeModel, lens: list[int], lib=None, atol: float = 2e-3) -> None:
    ids, pos, loc, rows, lens_t = _batch(model, lens)
    pools = [(lay.k_pool.clone(), lay.v_pool.clone()) for lay in model.layers]
    want = dk.decode_step_ref(model, ids, pos, loc, rows, lens_t)
    want_pools = [(lay.k_pool.clone(), lay.v_pool.clone()) for lay in model.layers]
    for lay, (k, v) in zip(model.layers, pools):
        lay.k_pool.copy_(k)
        lay.v_pool.copy_(v)
    step = dk.DecodeStep(model)
    if lib is None:
        got = step.step(ids, pos, loc, rows, lens_t)
    else:  # another build of the library (AVX2 on an AVX-512 machine)
        got = torch.empty(len(lens), model.emb.shape[1])
        buf = torch.empty(lib.rl_decode_scratch(ctypes.byref(step._model), len(lens)))
        args = [t.long().contiguous().data_ptr() for t in (ids, pos, loc, rows, lens_t)]
        keep = [ids, pos, loc, rows, lens_t]  # noqa: F841 (the pointers' tensors stay alive)
        rc = lib.rl_decode_step(
            ctypes.byref(step._model), *args, len(lens), got.data_ptr(), buf.data_ptr()
        )
        assert rc == 0
    torch.testing.assert_close(got, want, rtol=1e-3, atol=atol)
    for lay, (k, v) in zip(model.layers, want_pools):  # the same K/V stored
        torch.testing.assert_close(lay.k_pool.float(), k.float(), rtol=1e-3, atol=2e-3)
        torch.testing.assert_close(lay.v_pool.float(), v.float(), rtol=1e-3, atol=2e-3)


@needs_lib
@pytest.mark.parametrize("lens", [[5], [1, 17, 33]])
def test_dense_fp32_with_bias(lens: list[int]) -> None:
    _check(_model(64, 96, [torch.float32] * 7, torch.float32, bias=True), lens)


@needs_lib
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dense_16bit_weights_and_pool(dtype: torch.dtype) -> None:
    _check(_model(64, 96, [dtype] * 7, dtype, bias=False), [3, 9])


@needs_lib
def test_gguf_blocks_mixed_parts() -> None:
    forms = [cl.Q4_1, cl.Q5_0, cl.Q8_0, cl.Q4_0, cl.Q5_1, cl.Q4_1, cl.Q5_0]
    _check(_model(64, 96, forms, torch.float32, bias=False), [2, 30])


# the 16-row packed forms (q8pack.h) beside other parts: each part starts on a group of 16 rows
PACKED = [cl.QPACK + cl.Q4_1, cl.QPACK + cl.Q8_0, cl.QPACK + cl.Q4_0]


@needs_lib
def test_packed_blocks_beside_other_parts() -> None:
    forms = [PACKED[0], cl.Q5_0, PACKED[1], PACKED[2], PACKED[0], cl.Q4_1, PACKED[1]]
    _check(_model(64, 96, forms, torch.float32, bias=False), [3, 1, 9, 17, 2, 25, 4, 6, 11])


@needs_lib
def test_batch_of_nine_requests() -> None:
    """8 + 1 requests: the batched block path (each block unpacked once for a tile of rows) and the
    single-row one in the same step."""
    forms = [cl.Q4_1, cl.Q5_1, cl.Q8_0, cl.Q4_0, cl.Q5_0, cl.Q4_1, torch.float16]
    _check(_model(64, 96, forms, torch.float32, bias=False), [3, 1, 9, 17, 2, 25, 4, 6, 11])


@needs_lib
def test_kquant_blocks() -> None:
    forms = [cl.Q4_K, cl.Q4_K, cl.Q6_K, cl.Q8_0, cl.Q4_K, cl.Q5_K, cl.Q6_K]  # o: K = 128
    _check(_model(256, 256, forms, torch.float32, bias=False), [4, 11], atol=5e-3)


@needs_lib
def test_avx2_library() -> None:
    """The 8-lane build (never loaded on an AVX-512 machine) computes the same step."""
    lib = build._bind(ctypes.CDLL(build.build("avx2", build.compiler())))
    assert lib.rl_simd_width() == 8
    forms = [cl.Q4_1, cl.Q5_1, cl.Q8_0, torch.bfloat16, cl.Q5_0, cl.Q4_0, torch.float32]
    _check(_model(64, 96, forms, torch.float16, bias=True), [1, 6, 20], lib=lib)
    _check(_model(64, 96, PACKED * 2 + PACKED[:1], torch.float32, bias=False), [1, 6, 20], lib=lib)


@needs_lib
@pytest.mark.parametrize(
    "forms", [[cl.Q4_1] * 7, [PACKED[0]] * 7, [torch.float32] * 7, [torch.bfloat16] * 7]
)
def test_step_rows_alone_equal_the_batch(forms: list) -> None:
    """Batch invariance of the whole step: each request decoded alone gives bitwise the output
    (and the K/V) it gets in a batch of nine (Q4_1 blocks, packed or not, fp32, bf16 weights)."""
    model = _model(64, 96, forms, torch.float32, bias=False)
    lens = [3, 1, 9, 17, 2, 25, 4, 6, 11]
    ids, pos, loc, rows, lens_t = _batch(model, lens)
    step = dk.DecodeStep(model)
    batch = step.step(ids, pos, loc, rows, lens_t)
    pools = [(lay.k_pool.clone(), lay.v_pool.clone()) for lay in model.layers]
    for b in range(len(lens)):
        one = step.step(ids[b : b + 1], pos[b : b + 1], loc[b : b + 1], rows[b : b + 1],
                        lens_t[b : b + 1])  # fmt: skip
        assert torch.equal(one[0], batch[b]), f"request {b}"
    for lay, (k, v) in zip(model.layers, pools):
        assert torch.equal(lay.k_pool, k) and torch.equal(lay.v_pool, v)
