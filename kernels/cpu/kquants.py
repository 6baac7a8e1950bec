"""Torch reference de-quantisation of GGUF K-quant super-blocks (Q4_K, Q5_K, Q6_K).

The C++ kernels of `kquants.h` (dot and de-quantisation) are tested against these, and these
against `gguf.quants.dequantize`; `linear.dequant_ref` dispatches here for the K-quant type ids.
Layouts (256 values per super-block) are described in `kquants.h`'s header.
"""

from __future__ import annotations

import torch

Q4_K, Q5_K, Q6_K = 12, 13, 14
BLOCK_BYTES = {Q4_K: 144, Q5_K: 176, Q6_K: 210}


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _shifts(*s: int) -> torch.Tensor:
    return torch.tensor(s, dtype=torch.uint8).view(1, 1, -1, 1)


def scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins `[B, 8]` of Q4_K/Q5_K super-blocks from their 12 bytes."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 63, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


def dequant_ref(blocks: torch.Tensor, qtype: int) -> torch.Tensor:
    """fp32 `[B, 256]` of the super-blocks in `blocks` (uint8, any shape of whole blocks)."""
    b = blocks.reshape(-1, BLOCK_BYTES[qtype])
    nb = b.shape[0]
    if qtype == Q6_K:
        ql = (b[:, :128].reshape(nb, 2, 1, 64) >> _shifts(0, 4)) & 0x0F
        qh = (b[:, 128:192].reshape(nb, 2, 1, 32) >> _shifts(0, 2, 4, 6)) & 3
        q = (ql.reshape(nb, 8, 32) | (qh.reshape(nb, 8, 32) << 4)).float() - 32.0
        d = _f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float()
        return (d.view(nb, 16, 1) * q.view(nb, 16, 16)).view(nb, 256)
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = scale_min(b[:, 4:16])
    qs = b[:, 48:] if qtype == Q5_K else b[:, 16:]
    q = ((qs.reshape(nb, 4, 1, 32) >> _shifts(0, 4)) & 0x0F).reshape(nb, 8, 32)
    if qtype == Q5_K:
        qh = (b[:, 16:48].reshape(nb, 1, 1, 32) >> _shifts(*range(8))) & 1
        q = q | (qh.reshape(nb, 8, 32) << 4)
    out = (d * sc).view(nb, 8, 1) * q.float() - (dmin * mn).view(nb, 8, 1)
    return out.view(nb, 256)
