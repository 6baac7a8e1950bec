"""Token-granular KV storage: the per-layer K/V pool, its slot allocator and the `req_to_token` table.

Ownership: the scheduler process owns every object here and uses them from its one thread; no
locking. A slot is owned by exactly one of: the free list, the radix cache (a tree node's value),
or a running request (tokens it computed but has not inserted into the cache yet).
"""

from __future__ import annotations

import torch

from radixlm.kernels.store_kv import is_fp8, quantize_kv


class KVPool:
    """K and V tensors of `[num_slots + 1, kv_heads, head_dim]` per layer; slot 0 is padding.

    `dtype` is the model dtype, or float8_e4m3fn / float8_e5m2 for an FP8 KV cache
    (`kv_cache_dtype`): then K/V are stored quantised, `fp8(clamp(x / scale, +-finfo.max))`
    (computed as x * (1 / scale), see kernels/store_kv.py), and every reader dequantises,
    `x ~= fp8.to(compute dtype) * scale`. The per-layer scales `k_scale[layer]` /
    `v_scale[layer]` are python floats, 1.0 unless set (the SGLang/vLLM default when a checkpoint
    carries no calibrated KV scales); set them before the first forward: CUDA graphs bake them in
    at capture. A pool in any other dtype keeps them 1.0.

    NOTE: slot 0 never holds a real token: padded lanes (CUDA-graph replay, padded decode batches)
    read and write it freely.
    """

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.dtype = dtype
        self.quantized = is_fp8(dtype)
        self.device = torch.device(device)
        self.k_scale = [1.0] * num_layers
        self.v_scale = [1.0] * num_layers
        shape = (num_slots + 1, num_kv_heads, head_dim)
        # NOTE: uninitialised on purpose (zeroing a large pool costs seconds on CPU): a slot is
        # always written before it is read, except the padding slot 0, which is zeroed.
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        for t in (*self.k, *self.v):
            t[0].zero_()
        self.allocator = SlotAllocator(num_slots, self.device)

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """K and V bytes of one token over all layers (1-byte elements for an fp8 `dtype`)."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new K/V `[T, kv_heads, head_dim]` at slots `loc` `[T]` (quantised if fp8)."""
        self.k[layer][loc] = quantize_kv(k, self.dtype, self.k_scale[layer])
        self.v[layer][loc] = quantize_kv(v, self.dtype, self.v_scale[layer])


class SlotAllocator:
    """Free list of KV slots 1..num_slots, kept as a tensor on the pool's device."""

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.capacity = num_slots
        self.device = device
        self.clear()

    def clear(self) -> None:
        self._free = torch.arange(1, self.capacity + 1, dtype=torch.int64, device=self.device)
        self._pending: list[torch.Tensor] = []

    def available(self) -> int:
        return self._free.numel() + sum(t.numel() for t in self._pending)

    def alloc(self, n: int) -> torch.Tensor | None:
        """`n` free slots, or None when fewer are free (the caller evicts or retracts first)."""
        if n > self._free.numel() and self._pending:
            self._free = torch.cat([self._free, *self._pending])
            self._pending = []
        if n > self._free.numel():
            return None
        out, self._free = self._free[:n], self._free[n:]
        return out

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel():
            # NOTE: frees are batched and merged lazily; one cat per alloc miss, not per free.
            self._pending.append(slots.to(torch.int64))


class ReqToTokenPool:
    """`req_to_token[row, pos]` = KV slot of position `pos` of the request holding `row` (int32)."""

    def __init__(self, max_requests: int, max_context: int, device: torch.device | str) -> None:
        self.size = max_requests
        self.max_context = max_context
        self.table = torch.zeros((max_requests, max_context), dtype=torch.int32, device=device)
        self._free_rows = list(range(max_requests))

    def available(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.table[row, start : start + slots.numel()] = slots.to(torch.int32)
