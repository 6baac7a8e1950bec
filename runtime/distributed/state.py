"""`ParallelState`: this process's place in the tensor-parallel group.

One per process, set once by the rank's entry (`set_parallel_state`) before the model is built;
read by the parallel layers and the loader (which shard to load). The default is a single rank
with no process group: TP=1 code paths never touch torch.distributed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple


class ParallelState(NamedTuple):
    tp_rank: int = 0
    tp_size: int = 1
    group: Any = None  # torch.distributed ProcessGroup (None: TP=1)
    # gloo group over the same ranks for host-side control messages (runtime/distributed/
    # lockstep.py); on the CPU it is `group` itself
    cpu_group: Any = None

    @property
    def is_parallel(self) -> bool:
        return self.tp_size > 1


_STATE = ParallelState()


def set_parallel_state(state: ParallelState) -> None:
    global _STATE
    _STATE = state


def parallel_state() -> ParallelState:
    return _STATE


@contextmanager
def single_rank() -> Iterator[None]:
    """This process as a single rank (no group) inside the block: for a model only rank 0 holds
    and runs (a speculative draft model, runtime/speculative/draft_setup.py): built inside it, its
    layers are plain, it loads whole tensors and its runner makes no collective call, so the
    other ranks need not join anything."""
    global _STATE
    saved, _STATE = _STATE, ParallelState()
    try:
        yield
    finally:
        _STATE = saved
