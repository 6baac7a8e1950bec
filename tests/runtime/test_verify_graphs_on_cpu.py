"""The verify CUDA graphs' logic on CPU (executor/verify_graphs.py): the batch sizes and the graph a
verify batch replays, the staging of a batch into the static grid with padding (nodes and
requests), the real rows of a padded output, the capture bookkeeping (which shapes, in which
order, the attention backend's workspace), and, through the real model runner with the triton
backend in the interpreter and a capture that re-runs the recorded forward on replay
(`RerunCapture`), the graph path against the eager one: the same hidden states, padding lanes
writing no real KV slot, and the replay counter. Capture and replay on a device:
tests/gpu/test_gpu.py and tests/speculative/test_draft_gpu.py. With a CUDA device the runner tests
run there (real Triton kernels, still the re-running capture)."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from rerun_capture import RerunCapture, RerunGraph

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.executor.verify_graphs import (
    VerifyGraphRunner,
    VerifyInputs,
    build_verify_graphs,
    real_rows,
    verify_batch_sizes,
)
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.setup import make_proposer
from radixlm.runtime.speculative.shapes import verify_graph_nodes
from radixlm.runtime.speculative.tree import alloc_draft_slots, build_tree, verify_forward_batch

# NOTE: on CPU the triton backend runs in the interpreter (tests/conftest.py sets it)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tree_batch(parents: list[list[int]], prefixes: list[int], slots: torch.Tensor) -> ForwardBatch:
    b, n = len(parents), len(parents[0])
    ids = torch.arange(1, b * n + 1, dtype=torch.int64)
    tree = build_tree(torch.tensor(parents), torch.tensor(prefixes), check=True)
    return verify_forward_batch(ids, torch.arange(2, 2 + b), prefixes, slots.view(b, n), tree)


def test_batch_sizes_are_decodes_ladder_cut_by_rows() -> None:
    assert verify_batch_sizes(16, 8) == [1, 2, 4, 8, 12, 16]
    assert verify_batch_sizes(16, 8, max_rows=64) == [1, 2, 4, 8]
    assert verify_batch_sizes(3, 12) == [1, 2, 3]
    assert verify_batch_sizes(4, 12, max_rows=8) == []


def test_stage_pads_nodes_and_requests_with_zeros() -> None:
    inputs = VerifyInputs(4, 6, torch.device("cpu"))
    for t in (inputs.nodes_in, inputs.reqs_in, inputs.mask):
        t.fill_(99)  # a previous replay's leftovers
    parents = [[-1, 0, 1, -1], [-1, 0, 0, 1]]
    slots = torch.tensor([[7, 8, 9, 0], [10, 11, 12, 13]])
    batch = _tree_batch(parents, [5, 9], slots.view(-1))
    inputs.stage(batch, 4, 6)
    node_in, reqs_in, mask = inputs.grid(4, 6)
    ids, pos, loc = node_in
    assert torch.equal(ids[:2, :4], batch.input_ids.view(2, 4))
    assert torch.equal(pos[:2, :4], batch.positions.view(2, 4))
    assert torch.equal(loc[:2, :4], slots)
    # padding nodes and requests: slot 0 (never a real token's), position 0, token 0
    assert (node_in[:, :2, 4:] == 0).all() and (node_in[:, 2:] == 0).all()
    assert reqs_in[:, :2].tolist() == [[2, 3], [5, 9], [9, 13]]
    assert (reqs_in[:, 2:] == 0).all()  # row 0, prefix 0: reads nothing
    assert torch.equal(mask[:2, :4], batch.tree_mask)
    assert (mask[:2, 4:] == 0).all() and (mask[2:] == 0).all()  # nobody sees a padding node
    # beyond the (4, 6) grid: untouched
    assert (inputs.nodes_in[:, 24:] == 99).all() and (inputs.mask[24:] == 99).all()
    # the captured batch views exactly this grid
    static = inputs.batch(4, 6)
    assert static.input_ids.data_ptr() == ids.data_ptr() and static.tree_mask.shape == (4, 6, 1)
    assert static.extend_prefix_lens.data_ptr() == reqs_in[1].data_ptr()


def test_real_rows_of_a_padded_output() -> None:
    out = torch.arange(4 * 6 * 2, dtype=torch.float32).view(24, 2)
    got = real_rows(out, 2, 4, 4, 6)
    want = torch.cat([out[j * 6 : j * 6 + 4] for j in range(2)])
    assert torch.equal(got, want)
    same = real_rows(out, 3, 6, 4, 6)
    assert same.data_ptr() == out.data_ptr() and same.shape == (18, 2)


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, int]] = []

    def forward(self, batch: ForwardBatch, attn: object) -> torch.Tensor:
        assert batch.tree_mask is not None and batch.attn_metadata == ("captured", batch.batch_size)
        self.shapes.append(tuple(batch.tree_mask.shape[:2]))
        return batch.input_ids.float()[:, None] + 1.0  # row r's output: its token + 1


class _Attn:
    def __init__(self) -> None:
        self.init: tuple[int, list[int]] | None = None

    def init_verify_graph_state(self, max_bs: int, node_counts: list[int]) -> None:
        self.init = (max_bs, list(node_counts))

    def prepare_capture(self, bs: int, batch: ForwardBatch) -> None:
        batch.attn_metadata = ("captured", bs)

    def prepare_replay(self, batch: ForwardBatch) -> None:
        pass


def test_capture_bookkeeping_and_replay_with_a_fake_graph() -> None:
    model, attn, capture = _Model(), _Attn(), RerunCapture()
    runner = VerifyGraphRunner(model, attn, 8, [3, 6, 6], torch.device("cpu"), capture,  # type: ignore[arg-type]
                               max_rows=30)  # fmt: skip
    assert runner.sizes == {3: [1, 2, 4, 8], 6: [1, 2, 4]}
    assert runner.captured == [(1, 3), (1, 6), (2, 3), (2, 6), (4, 3), (4, 6), (8, 3)]
    assert attn.init == (8, [3, 6]) and capture.calls == 7
    rows = [b * n for b, n in model.shapes]
    assert rows == sorted(rows, reverse=True) and rows[0] == 24  # largest first
    assert runner.inputs.nbytes == (3 * 8 * 6 + 3 * 8) * 8 + 8 * 6 * 4
    # one output buffer for every graph (the largest grid's rows), outside the pool
    assert runner.output is not None and runner.output.shape == (48, 1)
    assert all(o.data_ptr() == runner.output.data_ptr() for o in runner.outputs.values())
    assert runner.static_bytes == runner.inputs.nbytes + 48 * 4
    for (b, n), key in {(1, 2): (1, 3), (3, 3): (4, 3), (3, 5): (4, 6), (5, 3): (8, 3)}.items():
        assert runner.key(b, n) == key
    assert runner.key(5, 4) is None and runner.key(1, 7) is None and runner.key(9, 1) is None
    batch = _tree_batch([[-1, 0, 1, -1], [-1, 0, 0, 1]], [5, 9], torch.arange(20, 28))
    assert runner.can_run(batch)
    out = runner.replay(batch)  # the (4, 6) graph: both dims padded
    assert torch.equal(out[:, 0], batch.input_ids.float() + 1.0) and runner.replays == 1


class _FailingCapture(RerunCapture):
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[RerunGraph, torch.Tensor]:
        raise RuntimeError("operation not permitted when stream is capturing")


def test_no_graphs_without_a_capture_or_when_capture_fails(caplog) -> None:
    runner = SimpleNamespace(graphs=None, max_running=4, model=_Model(), attn=_Attn(),
                             device=torch.device("cpu"))  # fmt: skip
    assert build_verify_graphs(runner, [6]) is None  # no decode graphs (CPU, disabled)
    assert build_verify_graphs(runner, [6], capture=_FailingCapture()) is None
    assert "verify steps run eager" in caplog.text
    built = build_verify_graphs(runner, [6], max_bs=16, capture=RerunCapture())
    assert built is not None and built.max_bs == 4  # never above the running requests


def _runner() -> ModelRunner:
    args = ServerArgs(
        model_path="tiny-llama", load_format="dummy", attention_backend="triton", device=DEVICE,
        max_total_tokens=512, max_running_requests=4, disable_cuda_graph=True, dtype="float32",
    )  # fmt: skip
    runner = ModelRunner(args, resolve_model("tiny-llama", "dummy"))
    runner.model.cpu_decode = None  # NOTE: the layer path, as on a GPU
    for layer in runner.model.layers:  # sharper attention: a wrong mask or position shows
        layer.self_attn.qkv_proj.weight.mul_(40.0)
    return runner


def _verify_batches(runner: ModelRunner) -> list[ForwardBatch]:
    """A 3 x 5 and a 2 x 6 tree batch over three requests with random prefix KV."""
    rng = random.Random(4)
    rows = [runner.req_to_token.alloc() for _ in range(3)]
    prefixes = [6, 11, 3]
    pool = runner.kv_pool
    for row, pre in zip(rows, prefixes):
        slots = pool.allocator.alloc(pre)
        runner.req_to_token.write(row, 0, slots)
        for layer in range(len(runner.model.layers)):
            kv = torch.randn(2, pre, pool.k[layer].shape[1], pool.k[layer].shape[2]).to(DEVICE)
            pool.store(layer, slots, kv[0], kv[1])
    cases = [
        ([[-1, 0, 1, 1, -1], [-1, 0, 0, 2, 3], [-1, -1, -1, -1, -1]], prefixes),
        ([[-1, 0, 1, 2, 3, 4], [-1, 0, 0, 1, 1, 2]], prefixes[:2]),
    ]
    batches = []
    for parents, pre in cases:
        counts = [1 + sum(p >= 0 for p in row[1:]) for row in parents]
        loc = alloc_draft_slots(pool.allocator, counts, len(parents[0]))
        tree = build_tree(torch.tensor(parents), torch.tensor(pre), check=True)
        ids = torch.tensor([rng.randrange(3, 500) for _ in range(loc.numel())], device=DEVICE)
        batches.append(verify_forward_batch(ids, torch.tensor(rows[: len(pre)]), pre, loc, tree))
    return batches


def test_verify_graph_equals_eager_in_the_model_runner() -> None:
    """Triton attention (interpreter), tiny model: a 3 x 5 tree batch replays the (4, 6) graph
    and a 2 x 6 batch the (2, 6) one; each gives the eager hidden states, and the padding lanes
    write no KV slot but slot 0."""
    runner = _runner()
    assert runner.verify_graphs is None  # CPU: no graphs unless a capture is given
    pool = runner.kv_pool
    batches = _verify_batches(runner)
    eager = [runner.forward(batch).clone() for batch in batches]
    capture = RerunCapture()
    runner.capture_verify_graphs([6], max_bs=4, capture=capture)
    graphs = runner.verify_graphs
    assert graphs is not None and graphs.captured == [(1, 6), (2, 6), (4, 6)]
    before = [(k.clone(), v.clone()) for k, v in zip(pool.k, pool.v)]
    for i, (batch, want) in enumerate(zip(batches, eager)):
        assert graphs.key(*batch.tree_mask.shape[:2]) == [(4, 6), (2, 6)][i]
        got = runner.forward(batch)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert runner.verify_graph_replays == i + 1
    written = torch.cat([b.out_cache_loc for b in batches]).unique()
    keep = torch.ones(pool.k[0].shape[0], dtype=torch.bool, device=DEVICE)
    keep[written] = False  # the draft slots (rewritten) and slot 0 (the padding lanes')
    bits = lambda t: t[keep].view(torch.int32)  # noqa: E731  (never-written slots: any bits)
    for (k0, v0), k1, v1 in zip(before, pool.k, pool.v):
        assert torch.equal(bits(k0), bits(k1)) and torch.equal(bits(v0), bits(v1))
    too_big = [[-1, 0]] * 5  # 5 requests: above the largest graph, eager
    loc = alloc_draft_slots(pool.allocator, [2] * 5, 2)
    tree = build_tree(torch.tensor(too_big), torch.tensor([1] * 5))
    ones = torch.ones(10, dtype=torch.int64, device=DEVICE)
    big = verify_forward_batch(ones, torch.zeros(5), [1] * 5, loc, tree)
    assert not graphs.can_run(big)


def test_a_draft_heads_target_verifies_through_graphs_with_its_capture() -> None:
    """EAGLE's target (the hidden-state capture on): graphs captured with the capture give the
    eager forward's hidden states and captured rows (`take_hidden`, padded shapes cut to the real
    nodes); with another capture (or none) the graphs do not run."""
    runner = _runner()
    layers = (1, len(runner.model.layers))
    runner.set_hidden_capture(layers)
    batches = _verify_batches(runner)
    eager = []
    for batch in batches:
        hidden = runner.forward(batch).clone()
        eager.append((hidden, runner.take_hidden()))
    runner.capture_verify_graphs([6], max_bs=4, capture=RerunCapture())
    graphs = runner.verify_graphs
    assert graphs is not None and graphs.capture_layers == layers
    assert runner.take_hidden() is None  # the capture's padding rows are handed to nobody
    for i, (batch, (hidden, captured)) in enumerate(zip(batches, eager)):
        assert graphs.can_run(batch)
        torch.testing.assert_close(runner.forward(batch), hidden, rtol=1e-4, atol=1e-4)
        got = runner.take_hidden()
        assert got is not None and got.shape == captured.shape
        torch.testing.assert_close(got, captured, rtol=1e-4, atol=1e-4)
        assert runner.verify_graph_replays == i + 1
    runner.set_hidden_capture((0,))
    assert not graphs.can_run(batches[0])
    runner.set_hidden_capture(None)
    assert not graphs.can_run(batches[0])


@pytest.mark.parametrize(
    "flags,nodes",
    [
        ({"speculative_algorithm": "NGRAM"}, 12),
        ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 6}, 6),
        ({"speculative_algorithm": None}, None),
    ],
)
def test_the_server_captures_its_proposers_node_count(flags, nodes) -> None:
    args = ServerArgs(model_path="tiny-llama", load_format="dummy", **flags)
    assert verify_graph_nodes(args) == nodes
    proposer = make_proposer(args, None)
    assert (proposer.num_nodes if proposer is not None else None) == nodes


def test_draft_models_verify_graph_nodes() -> None:
    draft = {"speculative_draft_model_path": "/nonexistent"}
    standalone = ServerArgs(model_path="tiny-llama", speculative_algorithm="STANDALONE",
                            speculative_num_steps=4, **draft)  # fmt: skip
    assert verify_graph_nodes(standalone) == 5  # a chain of 4 drafts and its root
    eagle = ServerArgs(model_path="tiny-llama", speculative_algorithm="EAGLE", **draft)
    assert verify_graph_nodes(eagle) is None  # the head's target runs eager (hidden capture)
    too_many = ServerArgs(model_path="tiny-llama", speculative_algorithm="NGRAM",
                          speculative_num_draft_tokens=65)  # fmt: skip
    assert verify_graph_nodes(too_many) is None  # no capture: make_proposer refuses it by name
    with pytest.raises(InvalidRequestError, match="at most 64"):
        make_proposer(too_many, None)


def test_the_speculative_step_through_verify_graphs() -> None:
    """The real scheduler's speculative step on the graph path (triton in the interpreter, a
    re-running capture of 1..8 requests x 6 nodes): scripted drafts of every quality in a batch
    of 5 (the 8-graph, then smaller ones as requests finish; trees cut near max_new_tokens pad
    their nodes) give the plain tokens, and the step counts the verify forwards that replayed."""
    from speculative.test_spec_scheduler import REQS, Scripted, every_draft, gen, ids_of, run_all

    from radixlm.runtime.scheduler.scheduler import Scheduler

    args = ServerArgs(
        model_path="tiny-qwen2", load_format="dummy", device=DEVICE, dtype="float32",
        attention_backend="triton", skip_tokenizer_init=True, random_seed=0,
        max_total_tokens=2048, max_running_requests=8, num_threads=1,
        speculative_algorithm="NGRAM", speculative_num_draft_tokens=6, disable_cuda_graph=True,
    )  # fmt: skip
    runner = ModelRunner(args, resolve_model("tiny-qwen2", "dummy"))
    runner.model.cpu_decode = None  # NOTE: the layer path, as on a GPU

    def submit(s: Scheduler) -> dict[str, list[int]]:
        for rid, ids, max_new in REQS:
            s.handle(gen(rid, ids, max_new_tokens=max_new))
        return ids_of(run_all(s))

    plain = submit(Scheduler(args.replace(speculative_algorithm=None), runner))
    runner.capture_verify_graphs([6], 8, capture=RerunCapture())
    runner.kv_pool.allocator.clear()  # NOTE: the plain run's radix cache went with its scheduler
    s = Scheduler(args, runner)
    every_draft(s)
    s.spec.proposer = Scripted(plain, 6, {"r0": 0, "r1": 1, "r2": 3, "r3": 99})
    assert submit(s) == plain
    assert s.stats["spec_verify_graph_steps"] == runner.verify_graph_replays > 0
    assert s.stats["spec_committed_tokens"] > s.stats["spec_verify_steps"]
