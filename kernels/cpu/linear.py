"""Small-batch linear layers on CPU: `y = x W^T` with W in fp32, fp16, bf16 or GGUF blocks.

`linear_dense(x, w)` and `linear_quant(x, blocks, qtype, k)` call the C++ kernels of
`linear.cpp` (a GEMV at batch 1, a tiled GEMM for more rows: at decode each weight row is read
from memory once per call); `dequant(blocks, qtype, k)` expands GGUF blocks to fp32 for a torch
GEMM (the K-quants' prefill). Each has a torch reference (`*_ref`) with the same math. All return
None when the kernel library is unavailable (`build.load()`), so callers fall back to the
references.

Batch invariance: a row of `linear_dense` / `linear_quant` (types of `Q8_BLOCK_TYPES`, and the
K-quants up to any M) is bitwise the same whatever the other rows of x are or how many there are
(`gemv.h`). The 32-value block types run on x quantised to int8 per 32 values, as llama.cpp does
(`q8dot.h`; `q8_activations_ref` is that rounding in torch).

GGUF blocks arrive as a uint8 tensor `[N, row_bytes(qtype, K)]`: one row of blocks per output
row (as read from the file), ggml type ids `Q8_0 = 8`, `Q4_0 = 2`, `Q4_1 = 3`, `Q5_0 = 6`,
`Q5_1 = 7` (32 values per block) and the K-quants `Q4_K = 12`, `Q5_K = 13`, `Q6_K = 14` (256 per super-block; their torch
references live in `kquants.py`).
"""

from __future__ import annotations

import torch

from radixlm.kernels.cpu import build, kquants

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 2, 3, 6, 7, 8
Q4_K, Q5_K, Q6_K = kquants.Q4_K, kquants.Q5_K, kquants.Q6_K
# the types with a kernel (gemv.h's layouts)
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24, Q8_0: 34, **kquants.BLOCK_BYTES}
BLOCK_ELEMS = {Q4_0: 32, Q4_1: 32, Q5_0: 32, Q5_1: 32, Q8_0: 32, Q4_K: 256, Q5_K: 256, Q6_K: 256}
QTYPE_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0"}
QTYPE_NAMES.update({Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"})
# The 16-row packed forms of Q4_0 / Q4_1 / Q8_0 (q8pack.h, `pack_blocks`): type id QPACK + ggml id.
QPACK, PACK_ROWS = 64, 16
PACKABLE = (Q4_0, Q4_1, Q8_0)
for _q in PACKABLE:
    BLOCK_BYTES[QPACK + _q], BLOCK_ELEMS[QPACK + _q] = BLOCK_BYTES[_q], BLOCK_ELEMS[_q]
    QTYPE_NAMES[QPACK + _q] = QTYPE_NAMES[_q]
# computed on Q8 activations (q8dot.h, q8pack.h), any M
Q8_BLOCK_TYPES = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, *(QPACK + q for q in PACKABLE))
MAX_K = 32 * 4096  # q8dot.h's Q8_MAX_BLOCKS
_WTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_threads = 0


def _lib():
    global _threads
    lib = build.load()
    if lib is not None and _threads != torch.get_num_threads():
        # NOTE: the library's OpenMP pool follows torch's thread count (set by the model runner).
        _threads = torch.get_num_threads()
        lib.rl_set_threads(_threads)
    return lib


def row_bytes(qtype: int, k: int) -> int:
    """Bytes of one row of `k` values in blocks of `qtype`."""
    return k // BLOCK_ELEMS[qtype] * BLOCK_BYTES[qtype]


def available() -> bool:
    return build.load() is not None


def _as_x(x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(-1, x.shape[-1])
    if x.dtype != torch.float32:
        x = x.float()
    return x if x.is_contiguous() else x.contiguous()


def linear_dense(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """fp32 `[M, N]` = x `[M, K]` @ w `[N, K]`^T (w fp32/fp16/bf16, contiguous)."""
    lib = _lib()
    if lib is None or w.dtype not in _WTYPES:
        return None
    x2 = _as_x(x)
    y = torch.empty(x2.shape[0], w.shape[0], dtype=torch.float32)
    rc = lib.rl_linear_dense(
        x2.data_ptr(),
        x2.shape[0],
        x2.shape[1],
        w.data_ptr(),
        _WTYPES[w.dtype],
        w.shape[0],
        y.data_ptr(),
    )
    assert rc == 0, rc
    return y


def linear_dense_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _as_x(x) @ w.float().t()


def linear_quant(x: torch.Tensor, blocks: torch.Tensor, qtype: int, k: int) -> torch.Tensor | None:
    """fp32 `[M, N]` = x `[M, k]` @ dequant(blocks)^T; blocks `[N, row_bytes(qtype, k)]`."""
    lib = _lib()
    if lib is None or k > MAX_K:
        return None
    x2 = _as_x(x)
    y = torch.empty(x2.shape[0], blocks.shape[0], dtype=torch.float32)
    rc = lib.rl_linear_quant(
        x2.data_ptr(), x2.shape[0], k, blocks.data_ptr(), qtype, blocks.shape[0], y.data_ptr()
    )
    assert rc == 0, rc
    return y


def dequant(blocks: torch.Tensor, qtype: int, k: int) -> torch.Tensor | None:
    """fp32 `[N, k]` of GGUF block rows."""
    lib = _lib()
    if lib is None:
        return None
    out = torch.empty(blocks.shape[0], k, dtype=torch.float32)
    assert lib.rl_dequant(blocks.data_ptr(), qtype, blocks.shape[0], k, out.data_ptr()) == 0
    return out


def _code_chunks(qtype: int) -> int:
    return 8 if qtype == Q8_0 else 4  # 4-byte chunks per row and block (q8pack.h)


def pack_blocks(blocks: torch.Tensor, qtype: int) -> tuple[torch.Tensor, int]:
    """GGUF block rows `[N, row_bytes]` in q8pack.h's 16-row groups (same shape and bytes) with
    their packed type id, or the input unchanged where the type or N does not take the form."""
    n, rb = blocks.shape
    if qtype not in PACKABLE or n % PACK_ROWS:
        return blocks, qtype
    bb, hdr = BLOCK_BYTES[qtype], 4 if qtype == Q4_1 else 2
    b = blocks.view(n // PACK_ROWS, PACK_ROWS, rb // bb, bb).transpose(1, 2)  # [g, nb, 16, bb]
    scales = [b[..., i : i + 2].flatten(-2) for i in range(0, hdr, 2)]  # d[16] (, m[16])
    codes = b[..., hdr:].unflatten(-1, (_code_chunks(qtype), 4)).transpose(2, 3).flatten(-3)
    return torch.cat([*scales, codes], dim=-1).reshape(n, rb).contiguous(), QPACK + qtype


def unpack_blocks(packed: torch.Tensor, ptype: int) -> tuple[torch.Tensor, int]:
    """The inverse of `pack_blocks`: GGUF block rows and their ggml type."""
    if ptype < QPACK:
        return packed, ptype
    qtype = ptype - QPACK
    n, rb = packed.shape
    bb, hdr = BLOCK_BYTES[qtype], 4 if qtype == Q4_1 else 2
    g = packed.view(n // PACK_ROWS, rb // bb, PACK_ROWS * bb)  # [g, nb, 16 bb]
    scales = [g[..., i * 16 : i * 16 + 32].unflatten(-1, (PACK_ROWS, 2)) for i in range(0, hdr, 2)]
    codes = g[..., hdr * PACK_ROWS :].unflatten(-1, (_code_chunks(qtype), PACK_ROWS, 4))
    codes = codes.transpose(2, 3).flatten(-2)  # [g, nb, 16, codes]
    b = torch.cat([*scales, codes], dim=-1)  # [g, nb, 16, bb]
    return b.transpose(1, 2).reshape(n, rb).contiguous(), qtype


def dequant_ref(blocks: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    """The same blocks expanded with torch ops (the layouts in `gemv.h`'s header)."""
    blocks, qtype = unpack_blocks(blocks, qtype)
    n = blocks.shape[0]
    if qtype in kquants.BLOCK_BYTES:
        return kquants.dequant_ref(blocks, qtype).view(n, k)
    b = blocks.reshape(-1, BLOCK_BYTES[qtype])
    d = b[:, :2].contiguous().view(torch.float16).float()
    if qtype == Q8_0:
        return (b[:, 2:].contiguous().view(torch.int8).float() * d).view(n, k)
    has_min, five = qtype in (Q4_1, Q5_1), qtype in (Q5_0, Q5_1)
    start = (4 if has_min else 2) + (4 if five else 0)
    qs = b[:, start:]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1)
    if five:  # bit j of the little-endian uint32 qh is bit 4 of element j
        qh = b[:, start - 4 : start].to(torch.int64)
        bits = qh[:, 0] | qh[:, 1] << 8 | qh[:, 2] << 16 | qh[:, 3] << 24
        q = q | (((bits[:, None] >> torch.arange(32)) & 1) << 4).to(torch.uint8)
    if has_min:
        m = b[:, 2:4].contiguous().view(torch.float16).float()
    else:
        m = (-16.0 if five else -8.0) * d
    return (q.float() * d + m).view(n, k)


def q8_activations_ref(x: torch.Tensor) -> torch.Tensor:
    """x `[M, K]` fp32 as the 32-value block kernels see it: per 32 values, amax = max |x|,
    round-half-even(x * (127 / amax)) * (amax / 127)."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax != 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(xb * inv) * (amax / 127.0)).view(x.shape)


def linear_quant_ref(x: torch.Tensor, blocks: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    x2 = _as_x(x)
    if qtype in Q8_BLOCK_TYPES:
        x2 = q8_activations_ref(x2)
    return x2 @ dequant_ref(blocks, qtype, k).t()
