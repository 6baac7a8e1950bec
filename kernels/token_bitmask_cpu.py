"""Applying the packed grammar bitmask to CPU logits with numpy: the sampler's CPU path
(runtime/sampling/sampler.py), beside the Triton kernel and its torch reference (token_bitmask.py).

Same semantics as `token_bitmask.apply_token_bitmask_inplace_ref` (bit j of word w
allows token 32 * w + j; columns past the mask are disallowed), but single-threaded numpy per
constrained row (a byte -> 8 values table): torch's version runs multi-threaded over the whole `[B, V]` batch, and on a
busy 2-core machine its OpenMP barriers cost tens of milliseconds per step (measured: 0.4 ms on
one thread, 80 ms on two threads while other processes use the cores). Called from the
scheduler loop thread only.
"""

from __future__ import annotations

import numpy as np
import torch

_ADD = np.array([-np.inf, 0.0], dtype=np.float32)  # bit -> what to add to the logit
# Byte value -> the 8 values to add to its 8 logits (bit k of the byte is logit 8 * byte + k).
_BYTE_ADD = _ADD.take(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
)


def apply_bitmask_cpu(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """In place on float32 CPU `logits [B, V]` (contiguous); `bitmask [B, W]` int32."""
    vocab = logits.shape[1]
    lg = logits.numpy()
    words = bitmask.numpy().view(np.uint8)  # NOTE: little-endian: byte k of word w = bits 8k..8k+7
    width = min(vocab, words.shape[1] * 8)
    full = width // 8  # whole mask bytes inside the vocab
    adds = np.empty((full, 8), dtype=np.float32)
    for i in range(logits.shape[0]) if rows is None else rows.tolist():
        row = lg[i]
        # NOTE: one table lookup per mask byte (8 logits) and one branch-free add of -inf/0:
        # ~25 us per 49k row, whatever the mask's density (unpacking the bits first cost ~60 us;
        # a boolean-indexed store costs up to 6x more on half-allowed rows).
        np.take(_BYTE_ADD, words[i, :full], axis=0, out=adds)
        head = row[: full * 8].reshape(full, 8)
        np.add(head, adds, out=head)
        if width > full * 8:  # a vocab that ends inside a mask byte
            bits = np.unpackbits(words[i, full : full + 1], bitorder="little", count=width % 8)
            row[full * 8 : width] += _ADD.take(bits)
        row[width:] = -np.inf


def refused_rows(ids: np.ndarray, bitmask: torch.Tensor, rows: list[int]) -> list[int]:
    """The rows among `rows` whose token `ids[i]` the packed `bitmask [B, W]` refuses (a token past
    the mask's width is refused)."""
    words = bitmask.numpy().view(np.uint32)
    width = words.shape[1] * 32
    return [
        i
        for i in rows
        if ids[i] >= width or not (int(words[i, ids[i] >> 5]) >> int(ids[i] & 31)) & 1
    ]
