"""CUDA graphs for decode: one graph per batch size of a ladder, replayed with padding.

Capture: one static int64 input buffer `inputs` of `[5, max_bs]` (rows `input_ids`, `positions`,
`out_cache_loc`, `req_pool_indices`, `seq_lens`: `kernels.decode_inputs.DECODE_INPUT_ROWS`); for
each ladder size (largest first, all sharing one memory pool) the model's forward over views of
those buffers is captured after a warm-up (graph_capture.py: the procedure and the pool, shared
with the speculative verify graphs, verify_graphs.py).
Replay: a batch assembled in place (its tensors are views of `inputs`, see `input_buffer`) is
used as is, any other batch is copied in; the batch is padded up to the next captured size with
lanes that write the padding slot 0 and attend over nothing (seq_len 0), and the graph is
replayed; the hidden states of the real rows are returned.

A draft head (runtime/models/eagle.py) also reads one feature row per token: with `features`
(width, dtype) the runner keeps a static `[max_bs, width]` buffer that the captured batches'
`spec_features` view, and a replay copies the batch's features in.

Ownership: belongs to the ModelRunner; the static buffers and graph outputs are overwritten by
every replay, so callers must consume the returned tensor before the next forward.
"""

from __future__ import annotations

import bisect
import logging

import torch

from radixlm.kernels.decode_inputs import DECODE_INPUT_ROWS
from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.graph_capture import Capture, GraphCapture, Replayable

logger = logging.getLogger(__name__)


def batch_size_ladder(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 12, 16, 24, *list(range(32, max_bs + 1, 16))]
    return sorted({s for s in sizes if s <= max_bs} | {max_bs})


def graph_size(sizes: list[int], bs: int) -> int:
    """The captured batch size a batch of `bs` rows replays with: the smallest one >= bs."""
    i = bisect.bisect_left(sizes, bs)
    if i == len(sizes):
        raise ValueError(f"batch size {bs} above the largest captured size {sizes[-1]}")
    return sizes[i]


def assembled_in_place(inputs: torch.Tensor, batch: ForwardBatch) -> bool:
    """Whether every decode input of `batch` is a view of its row of the static `inputs`."""
    return all(
        getattr(batch, name).data_ptr() == row.data_ptr()
        for name, row in zip(DECODE_INPUT_ROWS, inputs)
    )


def stage_inputs(inputs: torch.Tensor, batch: ForwardBatch, size: int) -> None:
    """Bring `batch` into the static `inputs` `[5, max_bs]` for a replay of the `size` graph:
    copied in unless assembled there, and the lanes bs..size zeroed (padding: they write the
    padding slot 0 and attend over nothing, seq_len 0)."""
    bs = batch.batch_size
    if not assembled_in_place(inputs, batch):
        for name, row in zip(DECODE_INPUT_ROWS, inputs):
            row[:bs].copy_(getattr(batch, name))
    if size > bs:
        inputs[:, bs:size].zero_()


class CudaGraphRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        attn: AttentionBackend,
        max_bs: int,
        device: torch.device,
        features: tuple[int, torch.dtype] | None = None,
        capture: Capture | None = None,
    ) -> None:
        """`capture`: the graph capture (and memory pool) to use, a new `GraphCapture` when None;
        the verify graphs (verify_graphs.py) capture into the same one, `self.capture`."""
        self.model = model
        self.attn = attn
        self.device = device
        self.sizes = batch_size_ladder(max_bs)
        self.max_bs = self.sizes[-1]
        rows = len(DECODE_INPUT_ROWS)
        self.inputs = torch.zeros(rows, self.max_bs, dtype=torch.int64, device=device)
        self.seq_lens = self.inputs[DECODE_INPUT_ROWS.index("seq_lens")]
        self.features = None
        if features is not None:
            width, dtype = features
            self.features = torch.zeros(self.max_bs, width, dtype=dtype, device=device)
        self.capture: Capture = capture if capture is not None else GraphCapture(device)
        self.graphs: dict[int, Replayable] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.batches: dict[int, ForwardBatch] = {}
        attn.init_graph_state(self.max_bs)
        self._capture_all()

    def _static_batch(self, bs: int) -> ForwardBatch:
        views = dict(zip(DECODE_INPUT_ROWS, self.inputs[:, :bs]))
        feats = None if self.features is None else self.features[:bs]
        return ForwardBatch(
            ForwardMode.DECODE, bs, **views, seq_lens_cpu=[1] * bs, spec_features=feats
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # NOTE: warm-up and capture lanes write slot 0 and read one token (seq_len 1) of row 0.
        self.seq_lens.fill_(1)
        for bs in reversed(self.sizes):
            batch = self._static_batch(bs)
            self.attn.prepare_capture(bs, batch)
            graph, out = self.capture.capture(lambda batch=batch: self.model(batch, self.attn))
            self.graphs[bs] = graph
            self.outputs[bs] = out
            self.batches[bs] = batch
        self.seq_lens.zero_()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.is_decode and batch.batch_size <= self.max_bs

    def input_buffer(self, bs: int) -> torch.Tensor:
        """`[5, bs]` view of the static inputs: a batch assembled there is replayed without
        copies. Write it on the compute stream: the graphs read it when they run."""
        assert bs <= self.max_bs
        return self.inputs[:, :bs]

    @torch.inference_mode()
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states `[batch_size, hidden]` of a decode batch (a view of static memory)."""
        size = graph_size(self.sizes, batch.batch_size)
        stage_inputs(self.inputs, batch, size)
        if self.features is not None and batch.spec_features is not None:
            self.features[: batch.batch_size].copy_(batch.spec_features)
        self.attn.prepare_replay(self.batches[size])
        self.graphs[size].replay()
        return self.outputs[size][: batch.batch_size]
