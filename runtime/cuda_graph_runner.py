"""CUDA graphs for decode: one graph per batch size of a ladder, replayed with padding.

Capture: static input buffers (`input_ids`, `positions`, `out_cache_loc`, `req_pool_indices`,
`seq_lens`) sized for the largest batch; for each ladder size (largest first, all sharing one
memory pool) the model's forward over views of those buffers is captured after a warm-up.
Replay: the real batch is copied into the buffers, padded up to the next captured size with lanes
that write the padding slot 0 and attend over nothing (seq_len 0), and the graph is replayed; the
hidden states of the real rows are returned.

Ownership: belongs to the ModelRunner; the static buffers and graph outputs are overwritten by
every replay, so callers must consume the returned tensor before the next forward.
"""

from __future__ import annotations

import bisect
import logging

import torch

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)


def batch_size_ladder(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 12, 16, 24, *list(range(32, max_bs + 1, 16))]
    return sorted({s for s in sizes if s <= max_bs} | {max_bs})


class CudaGraphRunner:
    def __init__(
        self, model: torch.nn.Module, attn: AttentionBackend, max_bs: int, device: torch.device
    ) -> None:
        self.model = model
        self.attn = attn
        self.device = device
        self.sizes = batch_size_ladder(max_bs)
        self.max_bs = self.sizes[-1]
        n = self.max_bs
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=device)
        self.req_pool_indices = torch.zeros(n, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.batches: dict[int, ForwardBatch] = {}
        attn.init_graph_state(self.max_bs)
        self._capture_all()

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=[1] * bs,
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        # NOTE: warm-up and capture lanes write slot 0 and read one token (seq_len 1) of row 0.
        self.seq_lens.fill_(1)
        for bs in reversed(self.sizes):
            batch = self._static_batch(bs)
            self.attn.prepare_capture(bs, batch)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # compile Triton kernels, settle allocator and cuBLAS
                    self.model(batch, self.attn)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = self.model(batch, self.attn)
            self.graphs[bs] = graph
            self.outputs[bs] = out
            self.batches[bs] = batch
        torch.cuda.synchronize(self.device)
        self.seq_lens.zero_()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.is_decode and batch.batch_size <= self.max_bs

    @torch.inference_mode()
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states `[batch_size, hidden]` of a decode batch (a view of static memory)."""
        bs = batch.batch_size
        size = self.sizes[bisect.bisect_left(self.sizes, bs)]
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_cache_loc[:bs].copy_(batch.out_cache_loc)
        self.req_pool_indices[:bs].copy_(batch.req_pool_indices)
        self.seq_lens[:bs].copy_(batch.seq_lens)
        if size > bs:
            self.input_ids[bs:size].zero_()
            self.positions[bs:size].zero_()
            self.out_cache_loc[bs:size].zero_()  # the padding slot
            self.req_pool_indices[bs:size].zero_()
            self.seq_lens[bs:size].zero_()  # attend over nothing
        self.attn.prepare_replay(self.batches[size])
        self.graphs[size].replay()
        return self.outputs[size][:bs]
