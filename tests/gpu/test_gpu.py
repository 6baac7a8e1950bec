"""GPU-only code on a CUDA device (skipped on CPU machines; the lead runs it on the H200 and
records each run in docs/benchmarks.md): CUDA-graph capture and replay with padding against the
eager path (decode, and the speculative verify step's graphs), the H2D/D2H transfer streams, and
the decode-GEMM choice between cuBLAS and the Triton GEMV. Their device-free logic is tested on
CPU in tests/runtime/test_gpu_logic_on_cpu.py and test_verify_graphs_on_cpu.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPTS = [[1, 5, 9, 11], [1, 7], [1, 3, 3, 3, 3, 3, 8], [1, 2, 4], [1, 9, 9]]
TINY = {"model_path": "tiny-llama", "load_format": "dummy", "skip_tokenizer_init": True}


def _greedy(batch: list[list[int]], **kwargs) -> list[list[int]]:
    return _greedy_info(batch, **kwargs)[0]


def _greedy_info(batch: list[list[int]], **kwargs) -> tuple[list[list[int]], dict]:
    """Greedy outputs of `batch` (one call, batched) and the server info after it."""
    from radixlm.runtime.frontend.engine import Engine

    with Engine(**TINY, dtype="float32", random_seed=0, **kwargs) as eng:
        assert str(eng.get_server_info()["device"]).startswith("cuda")
        outs = eng.generate(
            input_ids=batch,
            sampling_params={"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
        )
        info = eng.get_server_info()
    return [o["output_ids"] for o in outs], info


@pytest.mark.parametrize("bs", [1, 3, 5])  # 3 and 5 replay the 4- and 8-graphs with padding
def test_cuda_graph_replay_equals_eager(bs):
    batch = PROMPTS[:bs]
    graphs = _greedy(batch, cuda_graph_max_bs=8)
    eager = _greedy(batch, disable_cuda_graph=True)
    assert graphs == eager


def test_host_transfer_streams():
    from radixlm.runtime.executor.host_transfer import HostTransfer

    transfer = HostTransfer(torch.device("cuda"))
    dev = transfer.to_device([[1, 2, 3], [4, 5, 6]])
    assert dev.is_cuda and dev.dtype == torch.int64
    doubled = dev * 2  # on the compute stream, after the H2D copy
    host, event = transfer.to_host(doubled)
    assert event is not None and not host.is_cuda and host.is_pinned()
    event.synchronize()
    assert host.tolist() == [[2, 4, 6], [8, 10, 12]]


def test_decode_gemm_choice_sets_every_layer_and_keeps_results():
    from radixlm.kernels.gemv import GEMV_CONFIGS
    from radixlm.runtime.models.gemm_select import BUCKETS, select_decode_gemms
    from radixlm.runtime.models.llama import Linear

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = torch.nn.ModuleList(
            [Linear(2048, 1024), Linear(2048, 1024), Linear(1024, 2048, gated_output=True)]
        ).to(torch.bfloat16)
        for layer in model:
            layer.weight.normal_(0, 0.02)
    summary = select_decode_gemms(model, Linear, torch.bfloat16)
    assert set(summary) == {"1024x2048", "4096x1024_gated"}
    for layer in model:
        assert len(layer.small_m_cfg) == len(BUCKETS)
        assert all(c is None or c in GEMV_CONFIGS for c in layer.small_m_cfg)
        for m in BUCKETS:
            x = torch.randn(m, layer.weight.shape[1], device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(layer(x), layer.forward_default(x), atol=2e-2, rtol=2e-2)


def test_first_batches_after_start_up_compile_nothing(tmp_path, monkeypatch):
    """The start-up warm-up compiles every Triton kernel a batch runs (extend shapes, the
    sampler's argmax, both decode-input variants): a fresh Triton cache gains no entry from the
    first batches (on the H200 a cold first batch of 64 x 512 took 1.87 s against 0.83 s)."""
    import os
    import random

    from radixlm.runtime.frontend.engine import Engine

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # the children inherit it
    rng = random.Random(0)
    with Engine(**TINY, random_seed=0) as eng:
        warmed = set(os.listdir(tmp_path))
        assert warmed, "the warm-up compiled nothing into TRITON_CACHE_DIR"
        for count, length in [(64, 100), (3, 37), (1, 5), (17, 211)]:
            prompts = [[rng.randrange(3, 200) for _ in range(length)] for _ in range(count)]
            eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 9, "temperature": 0})
        eng.generate(input_ids=[prompts[0] + [7, 7, 7]], sampling_params={"max_new_tokens": 3})
        new = sorted(set(os.listdir(tmp_path)) - warmed)
    files = [f for d in new for f in os.listdir(tmp_path / d)]
    kernels = sorted({f[:-5] for f in files if f.endswith(".json") and not f.startswith("__grp")})
    assert not new, f"compiled after start-up: {kernels}"


SPEC_BATCH = [[1, 5, 9, 5, 9, 5, 9, 5, 9], [1, 7, 7, 7, 7], [1, 2, 4], [1, 3, 3, 3, 3, 3, 8]]
NGRAM = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 6}


@pytest.mark.parametrize("bs", [1, 4])
def test_speculative_ngram_verify_graphs_equal_eager_and_plain(bs):
    """The speculative step on the device (verify forward with the Triton tree-mask attention,
    acceptance and commit on device tensors): greedy tokens equal plain decoding's with the
    verify forwards replaying their CUDA graphs (executor/verify_graphs.py; batch 4 pads the
    smaller batches left when requests finish, and trees cut short pad their nodes) and with
    --disable-cuda-graph (eager verify)."""
    batch = SPEC_BATCH[:bs]
    plain = _greedy(batch, cuda_graph_max_bs=8)
    graphs, info = _greedy_info(batch, cuda_graph_max_bs=8, **NGRAM)
    eager, eager_info = _greedy_info(batch, disable_cuda_graph=True, **NGRAM)
    assert graphs == eager == plain
    assert info["spec_draft_tokens"] > 0 and info["spec_verify_graph_steps"] > 0
    assert eager_info["spec_draft_tokens"] > 0 and eager_info["spec_verify_graph_steps"] == 0
