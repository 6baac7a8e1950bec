"""The detokenizer process: token ids -> text deltas, incrementally and UTF-8 safe.

For each request it keeps the text decoded so far and two offsets (SGLang's scheme): the text of
`ids[surr:]` minus the text of `ids[surr:read]` is the new text, unless it ends in an incomplete
UTF-8 sequence (U+FFFD), in which case it waits for more tokens. Stop strings: text that could be
the start of a stop string is held back while streaming, and at the end the output is cut where the
matched stop string begins (unless `no_stop_trim`), so no partial stop text ever reaches a caller.
Which occurrence is the matched one follows stop_match.py's rule, shared with the scheduler.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import zmq

from radixlm.runtime.processes import io
from radixlm.runtime.processes.ipc import PortArgs, TypedReceiver, pull_socket, push_socket, send
from radixlm.runtime.sampling.stop_match import complete_len
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass
class DecodeState:
    ids: list[int] = field(default_factory=list)
    text: str = ""  # decoded text so far (complete characters only)
    surr: int = 0
    read: int = 0
    sent: int = 0  # characters of `text` already emitted
    stop: list[str] = field(default_factory=list)
    skip_special: bool = True
    spaces_between_special: bool = True
    no_stop_trim: bool = False


class Detokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, DecodeState] = {}

    def _decode(self, st: DecodeState, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=st.skip_special,
            spaces_between_special_tokens=st.spaces_between_special,
        )

    def process(self, out: io.ReqOut) -> io.TextOut:
        st = self.states.get(out.rid)
        if st is None:
            st = self.states[out.rid] = DecodeState(
                stop=out.stop or [],
                skip_special=out.skip_special_tokens,
                spaces_between_special=out.spaces_between_special_tokens,
                no_stop_trim=out.no_stop_trim,
            )
        if self.tokenizer is None:
            st.ids.extend(out.new_ids)
            if out.finished:
                del self.states[out.rid]
            return io.TextOut(out.rid, "", out.new_ids, out)
        st.ids.extend(out.new_ids)
        surr_text = self._decode(st, st.ids[st.surr : st.read])
        new_text = self._decode(st, st.ids[st.surr :])
        if out.finished or (len(new_text) > len(surr_text) and not new_text.endswith("\ufffd")):
            st.text += new_text[len(surr_text) :]
            st.surr, st.read = st.read, len(st.ids)
        if out.finished:
            matched = (out.finish_reason or {}).get("matched")
            if isinstance(matched, str) and not st.no_stop_trim:
                # NOTE: the scheduler matched a stop that ends in the last token's text
                # (stop_match.py): trim at its earliest such occurrence, never at an earlier one
                # (e.g. one before min_new_tokens), whether or not the request streamed.
                before = complete_len(self._decode(st, st.ids[:-1]))
                pos = st.text.find(matched, max(st.sent, before - len(matched) + 1))
                if pos >= 0:
                    st.text = st.text[:pos]
            end = len(st.text)
            del self.states[out.rid]
        else:
            end = len(st.text) - _stop_prefix_len(st.text, st.stop)
        end = max(end, st.sent)
        delta = st.text[st.sent : end]
        st.sent = end
        return io.TextOut(out.rid, delta, out.new_ids, out)


def _stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


def run_detokenizer_process(args: ServerArgs, ports: PortArgs, pipe: Any) -> None:
    from radixlm.runtime.frontend.tokenizer import load_server_tokenizer
    from radixlm.runtime.processes.process_utils import configure_child_process

    configure_child_process("detokenizer", args.log_level)
    try:
        tokenizer = load_server_tokenizer(args)
        ctx = zmq.Context(1)
        recv = TypedReceiver(pull_socket(ctx, ports.detokenizer_ipc), io.BatchTokenOut)
        out_sock = push_socket(ctx, ports.tokenizer_ipc)
    except Exception as exc:
        logger.exception("detokenizer failed to start")
        pipe.send({"status": "error", "error": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(1) from exc
    pipe.send({"status": "ready"})
    detok = Detokenizer(tokenizer)
    while True:
        frame = recv.sock.recv()
        batch = recv.decode(frame)
        send(out_sock, io.BatchTextOut([detok.process(o) for o in batch.outs]))
