"""The start-up extend warm-up (runtime/warmup.py): its shape list and a run on CPU that leaves
no KV slot or req_to_token row behind."""

from __future__ import annotations

from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.warmup import ExtendShape, extend_shapes, warm_extend


def test_shapes_cover_prefix_batch_and_the_chunk_within_capacity() -> None:
    shapes = extend_shapes(chunk=8192, max_running=512, capacity=1_000_000)
    assert ExtendShape(1, 8192, 0) in shapes
    assert any(s.prefix > 0 for s in shapes) and any(s.requests > 1 for s in shapes)
    small = extend_shapes(chunk=8192, max_running=2, capacity=600)
    assert all(s.requests <= 2 and s.requests * (s.new_tokens + s.prefix) <= 600 for s in small)
    assert ExtendShape(1, 8192, 0) not in small


def test_warm_extend_runs_and_frees_everything() -> None:
    args = ServerArgs(
        model_path="tiny-llama", load_format="dummy", device="cpu", max_total_tokens=2048,
        max_running_requests=8,
    )  # fmt: skip
    runner = ModelRunner(args, resolve_model("tiny-llama", "dummy"))
    free_slots = runner.kv_pool.allocator.available()
    free_rows = runner.req_to_token.available()
    shapes = extend_shapes(chunk=256, max_running=runner.max_running, capacity=free_slots)
    assert warm_extend(runner, shapes) > 0
    assert runner.kv_pool.allocator.available() == free_slots
    assert runner.req_to_token.available() == free_rows
