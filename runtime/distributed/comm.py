"""Collectives on the tensor-parallel group (`parallel_state().group`): NCCL on GPU, gloo on CPU.

Every function is a no-op (returns its input, touches no torch.distributed) at TP=1, so single-rank
code paths never need a process group. Every rank of the group must make the same calls in the
same order with tensors of the same shapes: the model's forward and `compute_logits` are such
calls (see runtime/distributed/layers.py).
"""

from __future__ import annotations

from typing import Any

import torch

from radixlm.runtime.distributed.state import parallel_state


def _dist():
    import torch.distributed as dist

    return dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum of `x` over the group, in place (returns `x`)."""
    state = parallel_state()
    if not state.is_parallel:
        return x
    _dist().all_reduce(x, group=state.group)
    return x


def all_reduce_min(value: int) -> int:
    """The smallest `value` of any rank (e.g. a KV capacity every rank can hold)."""
    state = parallel_state()
    if not state.is_parallel:
        return value
    dist = _dist()
    t = torch.tensor([value], dtype=torch.int64, device=_comm_device(state.group))
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=state.group)
    return int(t.item())


def all_gather(x: torch.Tensor, dim: int = -1, sizes: list[int] | None = None) -> torch.Tensor:
    """The ranks' `x` concatenated along `dim` in rank order. `sizes` (each rank's extent along
    `dim`) allows uneven pieces: each is padded to the largest for the collective, then trimmed."""
    state = parallel_state()
    if not state.is_parallel:
        return x
    dim = dim % x.dim()
    width = x.shape[dim] if sizes is None else max(sizes)
    if x.shape[dim] < width:
        pad = list(x.shape)
        pad[dim] = width - x.shape[dim]
        x = torch.cat([x, x.new_zeros(pad)], dim=dim)
    parts = [torch.empty_like(x) for _ in range(state.tp_size)]
    _dist().all_gather(parts, x.contiguous(), group=state.group)
    if sizes is not None:
        parts = [p.narrow(dim, 0, n) for p, n in zip(parts, sizes)]
    return torch.cat(parts, dim=dim)


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """`x` of group rank `src` on every rank, in place (returns `x`)."""
    state = parallel_state()
    if not state.is_parallel:
        return x
    dist = _dist()
    dist.broadcast(x, src=_global_rank(state.group, src), group=state.group)
    return x


def broadcast_host(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """`broadcast` of a CPU tensor over the gloo control group (`cpu_group`): no device work."""
    state = parallel_state()
    if not state.is_parallel:
        return x
    group = state.cpu_group if state.cpu_group is not None else state.group
    _dist().broadcast(x, src=_global_rank(group, src), group=group)
    return x


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """A picklable `obj` of group rank `src` on every rank (the others pass anything)."""
    state = parallel_state()
    if not state.is_parallel:
        return obj
    box = [obj]
    _dist().broadcast_object_list(box, src=_global_rank(state.group, src), group=state.group)
    return box[0]


def _global_rank(group: Any, rank: int) -> int:
    return rank if group is None else _dist().get_global_rank(group, rank)


def _comm_device(group: Any) -> torch.device:
    """Where a small control tensor must live for this group's backend (NCCL: the current GPU)."""
    backend = _dist().get_backend(group)
    if "nccl" in str(backend) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
