"""The start-up extend warm-up (runtime/executor/warmup.py): its shape list and a run on CPU that leaves
no KV slot or req_to_token row behind."""

from __future__ import annotations

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.executor.warmup import ExtendShape, extend_shapes, warm_extend
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs


def test_shapes_cover_prefix_batch_and_the_chunk_within_capacity() -> None:
    shapes = extend_shapes(chunk=8192, max_running=512, capacity=1_000_000, row_len=32_768)
    assert ExtendShape(1, 8192, 0) in shapes
    assert any(s.prefix > 0 for s in shapes) and any(s.requests > 1 for s in shapes)
    small = extend_shapes(chunk=8192, max_running=2, capacity=600, row_len=32_768)
    assert all(s.requests <= 2 and s.requests * (s.new_tokens + s.prefix) <= 600 for s in small)
    assert ExtendShape(1, 8192, 0) not in small


def test_shapes_fit_a_request_row() -> None:
    """A context shorter than the prefill chunk: no warm-up request is longer than a row (the
    H200 run crashed at start-up writing 8192 slots into a 2049-token row)."""
    shapes = extend_shapes(chunk=8192, max_running=64, capacity=1_000_000, row_len=2049)
    assert ExtendShape(1, 2049, 0) in shapes
    assert all(s.new_tokens + s.prefix <= 2049 for s in shapes)


def test_warm_extend_runs_and_frees_everything() -> None:
    args = ServerArgs(
        model_path="tiny-llama", load_format="dummy", device="cpu", max_total_tokens=2048,
        max_running_requests=8,
    )  # fmt: skip
    runner = ModelRunner(args, resolve_model("tiny-llama", "dummy"))
    free_slots = runner.kv_pool.allocator.available()
    free_rows = runner.req_to_token.available()
    row_len = runner.req_to_token.table.shape[1]
    shapes = extend_shapes(256, runner.max_running, free_slots, row_len)
    assert warm_extend(runner, shapes) > 0
    assert runner.kv_pool.allocator.available() == free_slots
    assert runner.req_to_token.available() == free_rows
