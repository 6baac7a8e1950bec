"""Hand-built GGUF K-quant super-blocks for tests: the `gguf` package de-quantises Q4_K, Q5_K and
Q6_K but cannot quantise them, so tests build random valid blocks (layouts: kernels/cpu/kquants.h).
"""

from __future__ import annotations

import numpy as np

from radixlm.kernels.cpu.kquants import BLOCK_BYTES, Q6_K


def random_kquant_blocks(
    rng: np.random.Generator, n: int, k: int, qtype: int, scale: float = 1.0
) -> np.ndarray:
    """`[n, row bytes]` uint8 of random valid K-quant super-blocks of `n` rows of `k` values (every
    bit pattern of the quants and packed scales is valid), with fp16 scales that keep the values
    near `scale` in size."""
    nb = k // 256
    blocks = rng.integers(0, 256, (n, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    if qtype == Q6_K:  # int8 scales[16] at 192, fp16 d at 208: |value| <= 128 * 32 * d
        d = (rng.uniform(0.5, 1.5, (n, nb)) * scale / 1024).astype(np.float16)
        blocks[..., 208:210] = d[..., None].view(np.uint8)
        return blocks.reshape(n, -1)
    # Q4_K/Q5_K: fp16 d at 0, fp16 dmin at 2 (x = d * sc * q - dmin * m, sc/m/q 6/6/4-5 bits)
    d = (rng.uniform(0.5, 1.5, (n, nb)) * scale / 256).astype(np.float16)
    dmin = (rng.uniform(0.5, 1.5, (n, nb)) * scale / 64).astype(np.float16)
    blocks[..., 0:2] = d[..., None].view(np.uint8)
    blocks[..., 2:4] = dmin[..., None].view(np.uint8)
    return blocks.reshape(n, -1)
