"""A rank's process group and its watchdog.

`RankSpec` says where a rank process stands (global rank, the GPU index on its node, the group
size, rank 0's rendezvous `host:port`); `init_group` joins the group (NCCL on GPU, gloo on CPU)
through a TCP store hosted by rank 0's process, plus a gloo group of the same ranks on GPU for
host-side control messages (lockstep.py), and sets this process's `ParallelState`.

`GroupWatchdog` (a daemon thread per rank) turns a failure anywhere into a stop everywhere, within
seconds, instead of a hang in a collective:
- every rank beats (`hb/<rank>` += 1 in the store) every `BEAT_S`; a rank that fails with an
  exception stores its error (`err/<rank>`) before it exits;
- rank 0 watches every other rank: an error, or no beat for `STALE_S`, calls its `on_failure`
  with a message naming the rank (the scheduler then tells the tokenizer manager and exits);
- a follower watches rank 0: a store that no longer answers (rank 0's process is gone) or a
  `stopped` key (an orderly shutdown: acknowledged with `bye/<rank>` before rank 0 exits) ends
  the follower.
Collectives also time out after `COLLECTIVE_TIMEOUT_S` (the backstop for a group that is alive but
stuck); rank 0 sends keep-alives while idle (leader.py), so a wait never reaches it normally.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from radixlm.runtime.distributed.state import ParallelState, set_parallel_state

logger = logging.getLogger(__name__)

BEAT_S = 0.5
STALE_S = 5.0
STOP_WAIT_S = 3.0  # an orderly stop waits this long at most for other nodes' ranks to see it
RENDEZVOUS_TIMEOUT_S = 600.0  # every rank must join within this (other nodes start by hand)
COLLECTIVE_TIMEOUT_S = 300.0
_PREFIX = "radixlm/"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class RankSpec:
    rank: int  # global rank in 0..tp_size-1 (rank 0 runs the scheduler)
    local_rank: int  # index on this node (its GPU)
    tp_size: int
    nnodes: int
    init_addr: str  # "host:port" of rank 0's store

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.init_addr.rpartition(":")
        return host.strip("[]"), int(port)

    def node_of(self, rank: int) -> int:
        return rank // (self.tp_size // self.nnodes)

    def describe(self, rank: int) -> str:
        where = f" on node {self.node_of(rank)}" if self.nnodes > 1 else ""
        return f"tensor-parallel rank {rank}{where}"


def rank_device(device: str, local_rank: int) -> str:
    """A rank's device: `cuda` becomes this rank's GPU on its node; the CPU stays the CPU."""
    return f"cuda:{local_rank}" if device == "cuda" else device


def init_group(spec: RankSpec, device: str) -> tuple[ParallelState, object]:
    """Join the group (blocks until every rank has joined); returns the state and the store."""
    import torch
    import torch.distributed as dist

    host, port = spec.host_port
    if host in _LOOPBACK:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(torch.device(device))
    store = dist.TCPStore(
        host, port, spec.tp_size, is_master=spec.rank == 0,
        timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S),
    )  # fmt: skip
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    dist.init_process_group(
        "nccl" if cuda else "gloo", store=store, rank=spec.rank, world_size=spec.tp_size,
        timeout=timeout,
    )  # fmt: skip
    world = dist.group.WORLD
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if cuda else world
    state = ParallelState(spec.rank, spec.tp_size, world, cpu_group)
    set_parallel_state(state)
    return state, store


class GroupWatchdog:
    def __init__(self, spec: RankSpec, on_failure: Callable[[str], None]) -> None:
        import torch.distributed as dist

        self.spec = spec
        self.on_failure = on_failure
        host, port = spec.host_port
        # NOTE: its own connection: the main thread's store client is never shared across threads
        self.store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=STALE_S))
        self.diagnosis: str | None = None
        self._found = threading.Event()
        threading.Thread(target=self._run, name="tp-watchdog", daemon=True).start()

    def report_error(self, message: str) -> None:
        """This rank failed with `message` (called before it exits)."""
        self.store.set(f"{_PREFIX}err/{self.spec.rank}", message)

    def announce_stop(self) -> None:
        """Rank 0 stops in order (called from its main thread): followers exit without an
        error. Waits up to `STOP_WAIT_S` for the ranks of other nodes to see it (while this
        process, which hosts the store, still runs); this node's ranks are stopped by their
        launcher."""
        import torch.distributed as dist

        host, port = self.spec.host_port
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=STALE_S))
        store.set(f"{_PREFIX}stopped", "1")
        remote = [r for r in range(1, self.spec.tp_size) if self.spec.node_of(r) != 0]
        deadline = time.monotonic() + STOP_WAIT_S
        while remote and time.monotonic() < deadline:
            remote = [r for r in remote if not store.check([f"{_PREFIX}bye/{r}"])]
            time.sleep(0.05)

    def wait_diagnosis(self, timeout: float) -> str | None:
        """Which rank failed, once the watchdog knows (None: no rank found within `timeout`)."""
        self._found.wait(timeout)
        return self.diagnosis

    def _fail(self, message: str) -> None:
        self.diagnosis = message
        self.on_failure(message)  # NOTE: in a rank process this exits
        self._found.set()

    def _run(self) -> None:
        rank = self.spec.rank
        others = range(1, self.spec.tp_size) if rank == 0 else ()
        seen = {r: (-1, time.monotonic()) for r in others}
        while True:
            try:
                self.store.add(f"{_PREFIX}hb/{rank}", 1)
                if rank != 0 and self.store.check([f"{_PREFIX}stopped"]):
                    self.store.set(f"{_PREFIX}bye/{rank}", "1")
                    self.on_failure("")
                    return
                for r in others:
                    message = self._check_rank(r, seen)
                    if message:
                        self._fail(message)
                        return
            except Exception as exc:  # the store (rank 0's process) is gone
                if rank != 0:
                    self._fail(f"{self.spec.describe(0)} is gone ({type(exc).__name__}: {exc})")
                    return
                logger.warning("tensor-parallel watchdog: %s", exc)
            time.sleep(BEAT_S)

    def _check_rank(self, r: int, seen: dict[int, tuple[int, float]]) -> str:
        if self.store.check([f"{_PREFIX}err/{r}"]):
            error = self.store.get(f"{_PREFIX}err/{r}").decode(errors="replace")
            return f"{self.spec.describe(r)} failed: {error}"
        beats = self.store.add(f"{_PREFIX}hb/{r}", 0)
        last, since = seen[r]
        now = time.monotonic()
        if beats != last:
            seen[r] = (beats, now)
        elif now - since > STALE_S:
            return (
                f"{self.spec.describe(r)} stopped: no heartbeat for {now - since:.0f} s "
                "(its process was killed or its node is unreachable)"
            )
        return ""
