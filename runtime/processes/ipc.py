"""ZMQ plumbing shared by the three processes: socket addresses and typed send/recv helpers.

Sockets are PUSH/PULL over `ipc://` paths in a private temporary directory (mode 0700), so no
other user and nothing on the network can reach them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from radixlm.runtime.processes import io


@dataclass(frozen=True)
class PortArgs:
    tokenizer_ipc: str  # tokenizer manager binds (PULL): detokenizer and scheduler push here
    scheduler_ipc: str  # scheduler binds (PULL): tokenizer manager pushes requests here
    detokenizer_ipc: str  # detokenizer binds (PULL): scheduler pushes token outputs here

    @classmethod
    def new(cls) -> PortArgs:
        base = tempfile.mkdtemp(prefix="radixlm-")
        os.chmod(base, 0o700)
        return cls(*(f"ipc://{os.path.join(base, name)}" for name in ("tok", "sched", "detok")))

    def cleanup(self) -> None:
        for addr in (self.tokenizer_ipc, self.scheduler_ipc, self.detokenizer_ipc):
            path = addr.removeprefix("ipc://")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.tokenizer_ipc.removeprefix("ipc://")))


def pull_socket(ctx: zmq.Context, addr: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(addr)
    return sock


def push_socket(ctx: zmq.Context, addr: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(addr)
    return sock


class TypedReceiver:
    """Decodes msgpack frames into the tagged message union `kind`."""

    def __init__(self, sock: zmq.Socket, kind: Any) -> None:
        self.sock = sock
        self.decoder = io.decoder(kind)

    def recv_all(self) -> list[Any]:
        """Every message available now (non-blocking)."""
        out = []
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return out
            out.append(self.decode(frame))

    def poll(self, timeout_ms: int) -> bool:
        return bool(self.sock.poll(timeout_ms, zmq.POLLIN))

    def decode(self, frame: bytes) -> Any:
        try:
            return self.decoder.decode(frame)
        except msgspec.DecodeError as exc:  # NOTE: never trust a frame; drop malformed ones
            raise ValueError(f"malformed IPC message: {exc}") from exc


def send(sock: zmq.Socket, msg: msgspec.Struct) -> None:
    sock.send(io.encode(msg))
