"""Random paged batches for the kernel tests and `radixlm bench kernels` (pure torch, no triton).

`make_paged_batch` lays out a batch exactly as the runtime does: a KV pool with padding slot 0,
a `req_to_token` table whose rows are scattered (shuffled request rows, shuffled non-contiguous
slots), and the flattened extend tensors. The pool already holds every token of every request
(prefix and new tokens), so the same batch serves extend attention (new K/V read from
`k_extend`/`v_extend`) and, for extend length 1, decode attention (everything read from the pool).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, H, D] queries of the new tokens (T = sum(extend_lens))
    k_extend: torch.Tensor  # [T, kvH, D]
    v_extend: torch.Tensor  # [T, kvH, D]
    k_buffer: torch.Tensor  # [num_slots, kvH, D]
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor  # [max_reqs, max_context] int32
    req_pool_indices: torch.Tensor  # [B] int64
    prefix_lens: torch.Tensor  # [B] int32
    extend_lens: torch.Tensor  # [B] int32
    seq_lens: torch.Tensor  # [B] int32 = prefix_lens + extend_lens
    extend_start_loc: torch.Tensor  # [B] int32, exclusive cumsum of extend_lens
    out_cache_loc: torch.Tensor  # [T] int64 slots of the new tokens
    max_extend_len: int

    def extend_args(self) -> tuple[torch.Tensor, ...]:
        """Positional tensor arguments of `extend_attention` / `extend_attention_ref`."""
        return (
            self.q,
            self.k_extend,
            self.v_extend,
            self.k_buffer,
            self.v_buffer,
            self.req_to_token,
            self.req_pool_indices,
            self.prefix_lens,
            self.extend_lens,
            self.extend_start_loc,
        )

    def decode_args(self) -> tuple[torch.Tensor, ...]:
        """Positional tensor arguments of the decode functions (needs every extend length == 1)."""
        assert self.q.shape[0] == self.req_pool_indices.shape[0], "decode needs extend_lens == 1"
        return (
            self.q,
            self.k_buffer,
            self.v_buffer,
            self.req_to_token,
            self.req_pool_indices,
            self.seq_lens,
        )


def make_paged_batch(
    prefix_lens: list[int],
    extend_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    shuffle: bool = True,
    poison_unused: bool = True,
) -> PagedBatch:
    """Build a random paged batch.

    shuffle: scatter slots and request rows randomly (else contiguous slots from 1, rows 0..B-1).
    poison_unused: fill slot 0 and every slot no request owns with NaN, so a kernel that reads
    a slot it should not (padding lanes, positions past seq_len) produces NaN and fails its test.
    """
    assert len(prefix_lens) == len(extend_lens)
    gen = torch.Generator().manual_seed(seed)
    batch = len(prefix_lens)
    seq = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    total = sum(seq)
    spare = 7 if shuffle else 0  # a few slots nobody owns
    num_slots = 1 + total + spare
    max_reqs = batch + (3 if shuffle else 0)
    max_context = max(seq, default=1) + 5

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    k_buffer = rand(num_slots, num_kv_heads, head_dim)
    v_buffer = rand(num_slots, num_kv_heads, head_dim)
    if poison_unused:
        k_buffer.fill_(float("nan"))
        v_buffer.fill_(float("nan"))
    if shuffle:
        slot_order = torch.randperm(num_slots - 1, generator=gen)[:total] + 1
        rows = torch.randperm(max_reqs, generator=gen)[:batch]
    else:
        slot_order = torch.arange(1, total + 1)
        rows = torch.arange(batch)
    req_to_token = torch.zeros(max_reqs, max_context, dtype=torch.int32)
    num_tokens = sum(extend_lens)
    q = rand(num_tokens, num_heads, head_dim)
    k_extend = rand(num_tokens, num_kv_heads, head_dim)
    v_extend = rand(num_tokens, num_kv_heads, head_dim)
    out_cache_loc = torch.empty(num_tokens, dtype=torch.int64)
    offset, tok = 0, 0
    for b in range(batch):
        slots = slot_order[offset : offset + seq[b]]
        offset += seq[b]
        req_to_token[rows[b], : seq[b]] = slots.to(torch.int32)
        pre, ext = prefix_lens[b], extend_lens[b]
        k_buffer[slots[:pre]] = rand(pre, num_kv_heads, head_dim)
        v_buffer[slots[:pre]] = rand(pre, num_kv_heads, head_dim)
        k_buffer[slots[pre:]] = k_extend[tok : tok + ext]
        v_buffer[slots[pre:]] = v_extend[tok : tok + ext]
        out_cache_loc[tok : tok + ext] = slots[pre:]
        tok += ext
    ext_t = torch.tensor(extend_lens, dtype=torch.int32)
    to = lambda t: t.to(device)  # noqa: E731
    return PagedBatch(
        q=to(q),
        k_extend=to(k_extend),
        v_extend=to(v_extend),
        k_buffer=to(k_buffer),
        v_buffer=to(v_buffer),
        req_to_token=to(req_to_token),
        req_pool_indices=to(rows.to(torch.int64)),
        prefix_lens=to(torch.tensor(prefix_lens, dtype=torch.int32)),
        extend_lens=to(ext_t),
        seq_lens=to(torch.tensor(seq, dtype=torch.int32)),
        extend_start_loc=to((torch.cumsum(ext_t, 0) - ext_t).to(torch.int32)),
        out_cache_loc=to(out_cache_loc),
        max_extend_len=max(extend_lens, default=0),
    )


def dense_attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None
) -> torch.Tensor:
    """Oracle for one request on a contiguous layout: q [E, H, D], k/v [S, kvH, D], S >= E.

    Query i sits at position S - E + i and sees keys 0..S-E+i (lower-right causal), computed by
    `torch.nn.functional.scaled_dot_product_attention` in fp32 with an explicit boolean mask.
    """
    group = q.shape[1] // k.shape[1]
    e, s = q.shape[0], k.shape[0]
    qh = q.float().transpose(0, 1)  # [H, E, D]
    kh = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vh = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    mask = torch.ones(e, s, dtype=torch.bool, device=q.device).tril(diagonal=s - e)
    out = torch.nn.functional.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, scale=sm_scale
    )
    return out.transpose(0, 1).to(q.dtype)


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str
) -> None:
    """Compare with a tolerance chosen by dtype; NaN anywhere fails."""
    atol, rtol = {
        torch.float32: (1e-4, 1e-4),
        torch.float16: (3e-3, 3e-3),
        torch.bfloat16: (2e-2, 2e-2),
    }[dtype]
    assert not torch.isnan(actual).any(), f"{what}: NaN in output (unwritten or bad read)"
    torch.testing.assert_close(
        actual.float(), expected.float(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}"
    )
