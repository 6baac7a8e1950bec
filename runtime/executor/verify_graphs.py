"""CUDA graphs for the speculative verify forward: one graph per (batch size, nodes per request),
replayed with padding; the step's one path is `ModelRunner.forward`, which replays a graph when
one fits the batch and runs eager otherwise.

A verify batch (runtime/speculative/tree.py `verify_forward_batch`: B requests x n nodes, row
i * n + j = node j of request i, `tree_mask` set, every row's output) replays the graph of
(size, nodes) = (the smallest captured batch size >= B, the smallest captured node count >= n)
(`VerifyGraphRunner.key`); above the largest of either it runs eager. The server captures one
node count, its proposer's N (`speculative.shapes.verify_graph_nodes`: NGRAM's
`num_draft_tokens`, a draft model's tree size) and the batch sizes of decode's ladder up to the
decode graphs' bound (`cuda_graph_max_bs`, the running requests), optionally cut to
`size x nodes <= max_rows`; `radixlm bench gpu --sections spec` captures one per k.

Capture (graph_capture.py, into the decode graphs' pool: one pool for every graph of the runner,
largest graph first): static buffers (`VerifyInputs`) hold the inputs of the largest shape, and
each (size, nodes) graph runs the model over views of their first rows, with the attention
backend's verify workspace (`init_verify_graph_state`, `prepare_capture`); the warm-up and
capture run over all-padding inputs.
Replay (`VerifyInputs.stage`): the batch's tokens, positions, slots, request rows, prefix and
sequence lengths and packed mask are copied into the static buffers as a [size, nodes] grid;
padding is zeros: a padding node (j >= n of a real request) writes its K/V to slot 0 (the pool's
padding slot, never a real token's) and its mask row is empty (it attends to its request's prefix
only, and nobody attends to it); a padding request (i >= B) has row 0, prefix 0 and an empty
mask, so it reads nothing and outputs zeros. Every graph copies its output rows into one static
buffer (`output`, the largest graph's rows), and the rows of the real nodes are returned from it
in the batch's own [B * n] order (a copy only when n < nodes).

A draft head's target (EAGLE / EAGLE3: `ModelRunner.set_hidden_capture`) verifies through graphs
captured with its capture on: each graph also copies the captured layers' rows into one static
buffer (`features`), and a replay hands their real rows to `take_hidden` as the eager forward
would. Graphs serve only the capture they were captured with (`can_run`).

Ownership: belongs to the ModelRunner; the static buffers and outputs are overwritten by every
replay (and the pool is shared with the decode graphs): callers consume the returned tensor
before the next forward.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import Any

import torch

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.executor.cuda_graph_runner import batch_size_ladder
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.graph_capture import Capture, Replayable
from radixlm.runtime.speculative.tree import mask_words

logger = logging.getLogger(__name__)

# The verify batch's per-node inputs ([B * n] each) and per-request inputs ([B] each), in the
# order of the static buffers' rows.
VERIFY_NODE_INPUTS = ("input_ids", "positions", "out_cache_loc")
VERIFY_REQ_INPUTS = ("req_pool_indices", "extend_prefix_lens", "seq_lens")


def verify_batch_sizes(max_bs: int, nodes: int, max_rows: int | None = None) -> list[int]:
    """The verify graphs' batch sizes for `nodes` per request: decode's ladder up to `max_bs`,
    cut to those whose padded rows (size x nodes) fit `max_rows` (None: no cut); may be []."""
    return [bs for bs in batch_size_ladder(max_bs) if max_rows is None or bs * nodes <= max_rows]


def real_rows(out: torch.Tensor, bs: int, nodes: int, size: int, width: int) -> torch.Tensor:
    """The `[bs * nodes, H]` rows of a (size, width) graph's output `[size * width, H]` that
    belong to the batch's real nodes, in the batch's own row order (a view when nodes == width)."""
    if nodes == width:
        return out[: bs * nodes]
    return out.view(size, width, -1)[:bs, :nodes].reshape(bs * nodes, -1)


class VerifyInputs:
    """The static inputs of every verify graph: `nodes_in` [3, max_bs * max_nodes] int64 (rows
    `VERIFY_NODE_INPUTS`), `reqs_in` [3, max_bs] int64 (rows `VERIFY_REQ_INPUTS`) and `mask`
    (max_bs * max_nodes * words(max_nodes) int32); the (size, nodes) graph reads the first
    size * nodes / size / size * nodes * words(nodes) of them."""

    def __init__(self, max_bs: int, max_nodes: int, device: torch.device) -> None:
        self.max_bs, self.max_nodes = max_bs, max_nodes
        i64 = torch.int64
        self.nodes_in = torch.zeros(len(VERIFY_NODE_INPUTS), max_bs * max_nodes, dtype=i64,
                                    device=device)  # fmt: skip
        self.reqs_in = torch.zeros(len(VERIFY_REQ_INPUTS), max_bs, dtype=i64, device=device)
        words = mask_words(max_nodes)
        self.mask = torch.zeros(max_bs * max_nodes * words, dtype=torch.int32, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.nodes_in, self.reqs_in, self.mask))

    def grid(self, size: int, nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The (size, nodes) graph's views: node inputs [3, size, nodes], request inputs
        [3, size], mask [size, nodes, words(nodes)]."""
        assert size <= self.max_bs and nodes <= self.max_nodes
        rows = size * nodes
        node_in = self.nodes_in[:, :rows].view(len(VERIFY_NODE_INPUTS), size, nodes)
        mask = self.mask[: rows * mask_words(nodes)].view(size, nodes, mask_words(nodes))
        return node_in, self.reqs_in[:, :size], mask

    def batch(self, size: int, nodes: int) -> ForwardBatch:
        """The verify batch a (size, nodes) graph is captured with: views of the static inputs
        (and its constant extend lengths, which the verify attention does not read)."""
        node_in, reqs_in, mask = self.grid(size, nodes)
        ids, positions, loc = node_in.reshape(len(VERIFY_NODE_INPUTS), size * nodes)
        rows, prefix, seq = reqs_in
        device = ids.device
        return ForwardBatch(
            mode=ForwardMode.EXTEND, batch_size=size, input_ids=ids, positions=positions,
            out_cache_loc=loc, req_pool_indices=rows, seq_lens=seq, seq_lens_cpu=[nodes] * size,
            extend_prefix_lens_cpu=[0] * size, extend_seq_lens_cpu=[nodes] * size,
            extend_prefix_lens=prefix,
            extend_seq_lens=torch.full((size,), nodes, dtype=torch.int64, device=device),
            extend_start_loc=torch.arange(size, dtype=torch.int64, device=device) * nodes,
            tree_mask=mask,
        )  # fmt: skip

    def stage(self, batch: ForwardBatch, size: int, nodes: int) -> None:
        """Copy the verify `batch` (B x n, B <= size, n <= nodes) into the (size, nodes) grid and
        zero the rest of it (padding nodes and requests: module docstring)."""
        assert batch.tree_mask is not None
        bs, n, words = batch.tree_mask.shape
        node_in, reqs_in, mask = self.grid(size, nodes)
        for row, name in zip(node_in, VERIFY_NODE_INPUTS):
            row[:bs, :n].copy_(getattr(batch, name).reshape(bs, n))
        if n < nodes:
            node_in[:, :bs, n:].zero_()
        for row, name in zip(reqs_in, VERIFY_REQ_INPUTS):
            row[:bs].copy_(getattr(batch, name))
        if bs < size:
            node_in[:, bs:].zero_()
            reqs_in[:, bs:].zero_()
        if (bs, n) != (size, nodes):
            mask.zero_()
        mask[:bs, :n, :words].copy_(batch.tree_mask)


class VerifyGraphRunner:
    """The verify graphs of one model runner (module docstring). `replays` counts the verify
    forwards that replayed a graph."""

    def __init__(
        self,
        model: torch.nn.Module,
        attn: AttentionBackend,
        max_bs: int,
        node_counts: Sequence[int],
        device: torch.device,
        capture: Capture,
        max_rows: int | None = None,
    ) -> None:
        """Captures at once: for each node count N of `node_counts`, decode's ladder of batch
        sizes up to `max_bs`, cut to size x N <= `max_rows` (a row budget such as the draft
        gate's `max_rows`; None on GPU, where every draft is verified); a node count left with
        no size is dropped (ValueError when none is left)."""
        self.model, self.attn, self.capture = model, attn, capture
        sizes = {n: verify_batch_sizes(max_bs, n, max_rows) for n in sorted(set(node_counts))}
        self.sizes = {n: s for n, s in sizes.items() if s}  # node count -> its batch sizes
        self.node_counts = sorted(self.sizes)
        if not self.node_counts:
            raise ValueError(f"no verify graph fits max_bs={max_bs}, max_rows={max_rows}")
        self.max_bs = max(s[-1] for s in self.sizes.values())
        self.inputs = VerifyInputs(self.max_bs, self.node_counts[-1], device)
        self.graphs: dict[tuple[int, int], Replayable] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.batches: dict[tuple[int, int], ForwardBatch] = {}
        self.output: torch.Tensor | None = None  # every graph's output rows (`_forward`)
        # A draft head's target: the layers its graphs capture, and their rows (`_forward`)
        self.capture_layers: tuple[int, ...] | None = getattr(model, "capture", None)
        self.features: torch.Tensor | None = None
        self.replays = 0
        attn.init_verify_graph_state(self.max_bs, self.node_counts)
        self._capture_all()

    @property
    def static_bytes(self) -> int:
        """Device memory the graphs hold outside their pool: static inputs, the output rows and
        (a head's target) the captured rows."""
        out = sum(
            t.numel() * t.element_size() for t in (self.output, self.features) if t is not None
        )
        return self.inputs.nbytes + out

    @property
    def captured(self) -> list[tuple[int, int]]:
        """The (batch size, nodes) shapes captured, sorted."""
        return sorted(self.graphs)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # NOTE: largest first (rows), so that the smaller graphs reuse the pool's blocks; the
        # static inputs are all zeros: every lane is padding (writes slot 0, reads nothing).
        keys = [(bs, n) for n, sizes in self.sizes.items() for bs in sizes]
        for key in sorted(keys, key=lambda k: (k[0] * k[1], k), reverse=True):
            batch = self.inputs.batch(*key)
            self.attn.prepare_capture(key[0], batch)
            graph, out = self.capture.capture(lambda batch=batch: self._forward(batch))
            self.graphs[key], self.outputs[key], self.batches[key] = graph, out, batch
        if self.capture_layers is not None:
            self.model.captured = None  # NOTE: the padding capture's rows are nobody's
        logger.info(
            "captured CUDA graphs for verify steps (nodes: batch sizes) %s; static inputs and "
            "output %.1f MB; graph pool (with decode's) %.1f MB",
            self.sizes, self.static_bytes / 1e6, self.capture.pool_bytes / 1e6,
        )  # fmt: skip

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The model's forward of a captured batch, its rows copied into the one static output
        buffer of the largest shape (allocated by the first warm-up call, outside the graphs).
        NOTE: so the graphs share one output ([max rows, H]) instead of keeping one each (with
        B x N rows per graph, that sum would be ~10x the largest graph's output)."""
        out = self.model(batch, self.attn)
        rows = self.max_bs * self.node_counts[-1]
        if self.output is None:
            self.output = out.new_empty(rows, *out.shape[1:])
        if self.capture_layers is not None:  # the captured layers' rows, into `features` too
            feats = self.model.captured
            if self.features is None:
                self.features = feats.new_empty(rows, feats.shape[1])
            self.features[: feats.shape[0]].copy_(feats)
        return self.output[: out.shape[0]].copy_(out)

    def key(self, bs: int, nodes: int) -> tuple[int, int] | None:
        """The (size, nodes) graph a verify batch of bs x nodes replays; None above them all."""
        i = bisect.bisect_left(self.node_counts, nodes)
        if i == len(self.node_counts):
            return None
        width = self.node_counts[i]
        sizes = self.sizes[width]
        j = bisect.bisect_left(sizes, bs)
        return None if j == len(sizes) else (sizes[j], width)

    def can_run(self, batch: ForwardBatch) -> bool:
        """A verify batch of every row's output (no features) that some graph fits, with the
        model's hidden-state capture the graphs were captured with."""
        mask = batch.tree_mask
        return (
            mask is not None
            and getattr(self.model, "capture", None) == self.capture_layers
            and batch.logits_indices is None
            and batch.spec_features is None
            and batch.extend_prefix_lens is not None
            and self.key(int(mask.shape[0]), int(mask.shape[1])) is not None
        )

    @torch.inference_mode()
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states `[B * n, H]` of the verify batch's rows, in its order (static memory,
        or a copy of it when the graph has more nodes than the batch)."""
        assert batch.tree_mask is not None
        bs, n = int(batch.tree_mask.shape[0]), int(batch.tree_mask.shape[1])
        key = self.key(bs, n)
        assert key is not None, f"no verify graph for {bs} x {n}"
        self.inputs.stage(batch, *key)
        self.attn.prepare_replay(self.batches[key])
        self.graphs[key].replay()
        self.replays += 1
        if self.features is not None:  # NOTE: what the eager forward leaves for `take_hidden`
            self.model.captured = real_rows(self.features[: key[0] * key[1]], bs, n, *key)
        return real_rows(self.outputs[key], bs, n, *key)


def build_verify_graphs(
    runner: Any,  # model_runner.py `ModelRunner`
    node_counts: Sequence[int],
    max_bs: int | None = None,
    capture: Capture | None = None,
) -> VerifyGraphRunner | None:
    """`runner`'s verify graphs (`ModelRunner.capture_verify_graphs`): up to `max_bs` requests
    (None: its decode graphs' bound; never above its running requests), captured by `capture`
    (None: its decode graphs' capture and pool); None without decode graphs or `capture` (CPU,
    --disable-cuda-graph, a draft head's target before draft_setup.py captures its own), with a
    backend that has no verify graphs, or
    when the capture fails (logged as a warning: the step stays exact, eager)."""
    graphs = runner.graphs
    if capture is None:
        if graphs is None:
            return None
        capture = graphs.capture
    bound = graphs.max_bs if graphs is not None else runner.max_running
    limit = min(max_bs or bound, runner.max_running)
    try:
        return VerifyGraphRunner(runner.model, runner.attn, limit, node_counts, runner.device,
                                 capture)  # fmt: skip
    except NotImplementedError as err:
        logger.info("verify steps run eager: %s", err)
    except RuntimeError as err:  # NOTE: a model whose verify forward cannot be captured
        logger.warning("verify CUDA graphs not captured, verify steps run eager: %s", err)
    return None
