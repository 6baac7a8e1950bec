"""Token-granular KV storage: the per-layer K/V pool, its slot allocator and the `req_to_token` table.

Ownership: the scheduler process owns every object here and uses them from its one thread; no
locking. A slot is owned by exactly one of: the free list, the radix cache (a tree node's value),
or a running request (tokens it computed but has not inserted into the cache yet).
"""

from __future__ import annotations

import torch


class KVPool:
    """K and V tensors of `[num_slots + 1, kv_heads, head_dim]` per layer; slot 0 is padding.

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
        self.device = torch.device(device)
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
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new K/V `[T, kv_heads, head_dim]` at slots `loc` `[T]`."""
        self.k[layer][loc] = k.to(self.dtype)
        self.v[layer][loc] = v.to(self.dtype)


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
