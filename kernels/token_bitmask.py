"""Apply a packed allowed-token bitmask to logits, in place (constrained decoding).

Layouts:
    logits:  [B, V] fp32/bf16/fp16, row stride free, last dim contiguous; modified in place.
    bitmask: [B, W] int32 (W = ceil(V_grammar / 32)): bit j of word w (LSB first) allows token
             32 * w + j; 1 = allowed, 0 = set to -inf. Same number of rows as logits.
    indices: optional [K] int rows to mask (of both logits and bitmask); other rows untouched.
Vocab columns >= 32 * W are disallowed (the model's vocab may be padded past the tokenizer's);
bits past V are ignored.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import cdiv, jit, require_triton, tl

_SHIFTS_CACHE: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    shifts = _SHIFTS_CACHE.get(device)
    if shifts is None:
        shifts = _SHIFTS_CACHE[device] = torch.arange(32, dtype=torch.int32, device=device)
    return shifts


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, W] int32 -> [B, vocab_size] bool allowed (columns >= 32 * W are False)."""
    rows, words = bitmask.shape
    # NOTE: arithmetic right shift of a negative word (bit 31 set) keeps bit j in place, so
    # `(w >> j) & 1` is the j-th bit for every j in 0..31.
    bits = (bitmask.unsqueeze(-1) >> _shifts(bitmask.device)) & 1  # [B, W, 32]
    allowed = bits.view(rows, words * 32).bool()
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    pad = allowed.new_zeros(rows, vocab_size - allowed.shape[1])
    return torch.cat([allowed, pad], dim=1)


def apply_token_bitmask_inplace_ref(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | None = None,
) -> None:
    """Vectorised torch version (the runtime's CPU path): one masked_fill over the batch."""
    vocab = logits.shape[-1]
    if indices is None:
        logits.masked_fill_(~unpack_bitmask(bitmask, vocab), float("-inf"))
        return
    idx = indices.long()
    rows = logits[idx]
    rows.masked_fill_(~unpack_bitmask(bitmask[idx], vocab), float("-inf"))
    logits[idx] = rows


@jit
def _bitmask_kernel(
    Logits,
    Bitmask,
    Indices,
    vocab_size,
    num_words,
    stride_l,
    stride_m,
    HAS_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if HAS_INDICES:
        row = tl.load(Indices + pid).to(tl.int64)
    else:
        row = pid.to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = offs < vocab_size
    word_idx = offs // 32
    has_word = in_vocab & (word_idx < num_words)
    words = tl.load(Bitmask + row * stride_m + word_idx, mask=has_word, other=0)
    allowed = ((words >> (offs % 32)) & 1) != 0
    ptrs = Logits + row * stride_l + offs
    # NOTE: only the disallowed entries are written (masked store); no read of logits needed.
    neg_inf = tl.full([BLOCK], float("-inf"), dtype=Logits.dtype.element_ty)
    tl.store(ptrs, neg_inf, mask=in_vocab & ~allowed)


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | None = None,
) -> None:
    """Triton version of `apply_token_bitmask_inplace_ref` (same semantics)."""
    require_triton()
    assert logits.dim() == 2 and bitmask.dim() == 2 and bitmask.dtype == torch.int32
    assert logits.shape[0] == bitmask.shape[0], "bitmask needs one row per logits row"
    assert logits.stride(1) == 1 and bitmask.stride(1) == 1
    rows = logits.shape[0] if indices is None else indices.shape[0]
    vocab = logits.shape[1]
    if rows == 0 or vocab == 0:
        return
    block = 4096
    grid = (rows, cdiv(vocab, block))
    _bitmask_kernel[grid](
        logits,
        bitmask,
        indices if indices is not None else bitmask,  # dummy pointer when unused
        vocab,
        bitmask.shape[1],
        logits.stride(0),
        bitmask.stride(0),
        HAS_INDICES=indices is not None,
        BLOCK=block,
        num_warps=4,
    )
