"""The logic of the GPU-only modules, run on the CPU: the CUDA-graph ladder, the choice of the
captured size and the staging/padding of a batch into the static inputs (cuda_graph_runner.py);
the CPU path of the host <-> device transfers (host_transfer.py); the decode-GEMM bucket, the
per-shape grouping and the "clearly faster or cuBLAS" rule (models/gemm_select.py). What needs a
device (capture, replay, streams, timing) is in tests/gpu/test_gpu.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from radixlm.kernels.decode_inputs import DECODE_INPUT_ROWS
from radixlm.runtime.executor.cuda_graph_runner import (
    assembled_in_place,
    batch_size_ladder,
    graph_size,
    stage_inputs,
)
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.executor.host_transfer import HostTransfer
from radixlm.runtime.models.gemm_select import (
    BUCKETS,
    MIN_GAIN,
    bucket_of,
    group_by_shape,
    pick_config,
)
from radixlm.runtime.models.llama import Linear


@pytest.mark.parametrize("max_bs", [1, 3, 16, 31, 32, 100, 160, 256])
def test_ladder_covers_every_batch_size_with_the_smallest_graph(max_bs):
    sizes = batch_size_ladder(max_bs)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == max_bs
    for bs in range(1, max_bs + 1):
        size = graph_size(sizes, bs)
        assert size >= bs and not [s for s in sizes if bs <= s < size]
    with pytest.raises(ValueError, match="above the largest"):
        graph_size(sizes, max_bs + 1)


def _batch(rows: torch.Tensor) -> ForwardBatch:
    views = dict(zip(DECODE_INPUT_ROWS, rows))
    bs = rows.shape[1]
    return ForwardBatch(ForwardMode.DECODE, bs, **views, seq_lens_cpu=[1] * bs)


def test_stage_copies_a_batch_in_and_pads_up_to_the_graph():
    inputs = torch.full((len(DECODE_INPUT_ROWS), 8), 99, dtype=torch.int64)
    rows = torch.arange(1, 1 + len(DECODE_INPUT_ROWS) * 3).view(len(DECODE_INPUT_ROWS), 3)
    batch = _batch(rows.clone())
    assert not assembled_in_place(inputs, batch)
    stage_inputs(inputs, batch, graph_size(batch_size_ladder(8), 3))  # the size-4 graph
    assert torch.equal(inputs[:, :3], rows)
    # the padding lane writes slot 0 and attends over nothing (seq_len 0)
    assert torch.equal(inputs[:, 3], torch.zeros(len(DECODE_INPUT_ROWS), dtype=torch.int64))
    assert (inputs[:, 4:] == 99).all()  # beyond the graph's size: untouched


def test_stage_uses_a_batch_assembled_in_place_as_is():
    inputs = torch.zeros((len(DECODE_INPUT_ROWS), 8), dtype=torch.int64)
    inputs[:, :2] = torch.tensor([[7, 8]] * len(DECODE_INPUT_ROWS))
    batch = _batch(inputs[:, :2])  # views of the static rows, as `input_buffer` gives them
    assert assembled_in_place(inputs, batch)
    inputs[:, 2] = 5  # stale lane of an earlier, larger batch
    stage_inputs(inputs, batch, 2)
    assert (inputs[:, :2] == torch.tensor([7, 8])).all() and (inputs[:, 2] == 5).all()
    stage_inputs(inputs, batch, 4)
    assert (inputs[:, 2:4] == 0).all()


def test_host_transfer_on_cpu_is_plain_tensors():
    transfer = HostTransfer(torch.device("cpu"))
    t = transfer.to_device([[1, 2], [3, 4]])
    assert t.dtype == torch.int64 and t.tolist() == [[1, 2], [3, 4]]
    host, event = transfer.to_host(t)
    assert host is t and event is None


def test_decode_bucket_of_each_batch_size():
    assert [bucket_of(m) for m in range(1, BUCKETS[-1] + 2)] == [
        next((i for i, b in enumerate(BUCKETS) if m <= b), None) for m in range(1, BUCKETS[-1] + 2)
    ]
    assert bucket_of(1) == 0 and bucket_of(BUCKETS[-1]) == len(BUCKETS) - 1
    assert bucket_of(BUCKETS[-1] + 1) is None  # larger batches: cuBLAS
    layer = Linear(16, 8)
    assert layer.gemv_cfg(1) is None  # nothing chosen (CPU): cuBLAS/torch
    layer.small_m_cfg = [{"b": 1}, None, {"b": 8}]
    assert [layer.gemv_cfg(m) for m in (1, 2, 4, 5, 8, 9)] == [
        {"b": 1}, None, None, {"b": 8}, {"b": 8}, None,
    ]  # fmt: skip


def test_a_triton_config_is_kept_only_when_clearly_faster():
    a, b, c = {"cfg": "a"}, {"cfg": "b"}, {"cfg": "c"}
    assert pick_config(10.0, []) == (None, 10.0)
    # within the noise margin of cuBLAS: cuBLAS stays
    assert pick_config(10.0, [(a, 10.0 * MIN_GAIN + 1e-6)]) == (None, 10.0)
    assert pick_config(10.0, [(a, 9.0), (b, None), (c, 8.0)]) == (c, 8.0)
    assert pick_config(10.0, [(a, 8.0), (b, 9.0), (c, None)]) == (a, 8.0)
    assert pick_config(10.0, [(a, None), (b, 11.0)]) == (None, 10.0)


def test_layers_are_grouped_by_shape_gating_and_dtype():
    model = nn.ModuleList(
        [Linear(16, 8), Linear(16, 8), Linear(16, 8, gated_output=True), Linear(8, 16)]
    )
    model.append(nn.Linear(16, 8))  # not a radixlm Linear: never chosen for
    groups = group_by_shape(model, Linear)
    assert {k: len(v) for k, v in groups.items()} == {
        (8, 16, False, torch.float32): 2,
        (16, 16, True, torch.float32): 1,
        (16, 8, False, torch.float32): 1,
    }
