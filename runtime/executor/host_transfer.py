"""The scheduler's small host <-> device copies, kept off the compute stream.

Each decode step copies a few int64 columns to the device (request rows, positions) and its
sampled tokens back. Queued on the compute stream, every such copy would sit between two steps:
a copy engine starts several microseconds after the kernel before it ends. On CUDA each direction
has its own stream instead:
    `to_device`: pinned host tensor -> device on the H2D stream; the compute stream waits for it
        (issued while the previous step computes, it is long done when the wait is reached; a
        copy from pageable memory would first synchronise with the device);
    `to_host`: device -> pinned host on the D2H stream, after everything queued so far on the
        compute stream; the returned event tells when the host tensor is valid, and the next step
        on the compute stream does not wait for the copy.
# NOTE: two streams, not one: an H2D copy queued behind a D2H copy that waits for the in-flight
# step would make the following step wait for that step's tokens to reach the host.
On the CPU both are plain tensors (no copy, no event).

Ownership: one per scheduler process, used from its single thread only.
"""

from __future__ import annotations

import torch


class HostTransfer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        cuda = device.type == "cuda"
        self._h2d = torch.cuda.Stream(device) if cuda else None
        self._d2h = torch.cuda.Stream(device) if cuda else None

    def to_device(self, values: list) -> torch.Tensor:
        """int64 tensor of `values` (nested lists allowed), ready for use on the current stream."""
        if self._h2d is None:
            return torch.tensor(values, dtype=torch.int64, device=self.device)
        host = torch.tensor(values, dtype=torch.int64, pin_memory=True)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._h2d):
            out = host.to(self.device, non_blocking=True)
        out.record_stream(compute)  # its memory is not reused before the compute stream is done
        compute.wait_stream(self._h2d)
        return out

    def to_host(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """(host copy of `t`, event after which it is valid; None: valid now)."""
        if self._d2h is None:
            return t, None
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self._d2h.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._d2h):
            host.copy_(t, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        t.record_stream(self._d2h)
        return host, copied
