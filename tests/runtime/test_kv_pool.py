"""The KV pool's dtypes: `kv_cache_dtype` -> pool dtype, FP8 sizing, quantised stores."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.store_kv import dequantize_kv
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.executor.model_runner import check_fp8_support, resolve_kv_cache_dtype
from radixlm.runtime.mem.kv_pool import KVPool
from radixlm.runtime.server_args import ServerArgs


def test_kv_cache_dtype_resolves_and_halves_bytes() -> None:
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("fp8_e4m3", torch.bfloat16) == torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("fp8_e5m2", torch.float32) == torch.float8_e5m2
    bf16 = KVPool.bytes_per_token(32, 8, 128, torch.bfloat16)
    assert bf16 == 2 * 32 * 8 * 128 * 2
    assert KVPool.bytes_per_token(32, 8, 128, torch.float8_e4m3fn) == bf16 // 2
    assert KVPool.bytes_per_token(32, 8, 128, torch.float8_e5m2) == bf16 // 2


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_pool_stores_quantised_with_its_layer_scales(fp8: torch.dtype) -> None:
    pool = KVPool(16, 2, 2, 8, fp8, "cpu")
    assert pool.quantized and pool.k_scale == [1.0, 1.0] and pool.v_scale == [1.0, 1.0]
    assert pool.k[1].dtype == fp8 and not pool.k[1][0].float().any()  # padding slot 0 zeroed
    pool.k_scale[1], pool.v_scale[1] = 0.25, 3.0
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    k[0, 0, 0], v[2, 1, 7] = 1e9, -1e9  # beyond the fp8 range: saturated, not NaN / inf
    loc = torch.tensor([4, 9, 2])
    pool.store(1, loc, k, v)
    info = torch.finfo(fp8)
    k_read = dequantize_kv(pool.k[1][loc], torch.float32, pool.k_scale[1])
    v_read = dequantize_kv(pool.v[1][loc], torch.float32, pool.v_scale[1])
    assert k_read[0, 0, 0] == info.max * 0.25 and v_read[2, 1, 7] == -info.max * 3.0
    k[0, 0, 0], v[2, 1, 7] = k_read[0, 0, 0], v_read[2, 1, 7]
    torch.testing.assert_close(k_read, k, rtol=info.eps / 2, atol=info.tiny * info.eps * 0.25)
    torch.testing.assert_close(v_read, v, rtol=info.eps / 2, atol=info.tiny * info.eps * 3.0)


def test_scales_need_an_fp8_pool() -> None:
    pool = KVPool(4, 1, 1, 8, torch.bfloat16, "cpu")
    assert not pool.quantized
    pool.store(0, torch.tensor([1]), torch.ones(1, 1, 8), torch.ones(1, 1, 8))
    assert pool.k[0][1].dtype == torch.bfloat16 and bool((pool.k[0][1] == 1).all())
    pool.k_scale[0] = 2.0
    with pytest.raises(AssertionError, match="fp8"):
        pool.store(0, torch.tensor([1]), torch.ones(1, 1, 8), torch.ones(1, 1, 8))


def test_fp8_needs_ada_or_hopper_on_a_gpu() -> None:
    fp8_kv, fp8_w = ServerArgs(kv_cache_dtype="fp8_e5m2"), ServerArgs(quantization="fp8")
    for args in (fp8_kv, fp8_w, ServerArgs()):
        check_fp8_support(args, None)  # CPU: emulated
        check_fp8_support(args, (9, 0))
        check_fp8_support(args, (8, 9))
    check_fp8_support(ServerArgs(), (8, 0))
    with pytest.raises(InvalidRequestError, match=r"kv_cache_dtype='fp8_e5m2' .* 8\.0"):
        check_fp8_support(fp8_kv, (8, 0))
    with pytest.raises(InvalidRequestError, match="quantization='fp8'"):
        check_fp8_support(fp8_w, (7, 5))
