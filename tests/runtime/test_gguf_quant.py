"""GGUF block-quantised execution on CPU (`quantization="gguf"`): tiny Llama files written by the
`gguf` package, one per quant type, run with their weights kept in blocks and give the logits and
greedy tokens of the same file de-quantised to fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize

from radixlm.bench.cpu_profile import decode_steps
from radixlm.kernels.cpu import build
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

pytestmark = pytest.mark.skipif(
    build.isa() is None or build.compiler() is None, reason="no AVX2 CPU or no C++ compiler"
)
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 320
IDS = [5, 17, 250, 3, 99, 42, 7, 7, 7, 128, 64, 1, 2, 3, 299, 0, 11, 12, 13, 14]


def write_gguf(path, qtype: str) -> None:
    """A random tiny Llama whose linear weights (and token embedding) are `qtype` blocks."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_context_length(512)
    w.add_vocab_size(VOCAB)
    q = GGMLQuantizationType[qtype]

    def add(name: str, rows: int, cols: int, scale: float = 0.05) -> None:
        data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if q == GGMLQuantizationType.Q6_K:  # NOTE: gguf has no K-quant quantiser: random blocks
            blocks = rng.integers(0, 256, (rows, cols // 256, 210), dtype=np.uint8)
            blocks[..., 208:210] = np.array([scale / 64], dtype=np.float16).view(np.uint8)
            w.add_tensor(name, blocks.reshape(rows, -1), raw_dtype=q)
            return
        w.add_tensor(name, quantize(data, q), raw_dtype=q)

    add("token_embd.weight", VOCAB, HIDDEN, 1.0)
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        p = f"blk.{i}."
        add(p + "attn_q.weight", HIDDEN, HIDDEN)
        add(p + "attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        add(p + "attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        add(p + "attn_output.weight", HIDDEN, HIDDEN)
        add(p + "ffn_gate.weight", INTER, HIDDEN)
        add(p + "ffn_up.weight", INTER, HIDDEN)
        add(p + "ffn_down.weight", HIDDEN, INTER)
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(p + norm + ".weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _runner(path, **kwargs) -> ModelRunner:
    args = ServerArgs(
        model_path=str(path), device="cpu", max_total_tokens=256, max_running_requests=2, **kwargs
    )
    return ModelRunner(args, resolve_model(str(path)))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_blocks_stay_quantised_and_match_fp32(tmp_path, qtype: str) -> None:
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_gguf(path, qtype)
    dense = _runner(path, dtype="float32")
    quant = _runner(path, quantization="gguf")
    assert dense.weight_mode == "float32"
    assert quant.weight_mode == qtype and quant.cpu.layers == {qtype: 4 * LAYERS}
    qkv = quant.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.numel() == 0 and qkv.cpu_impl.blocks.dtype == torch.uint8
    assert quant.cpu.head is not None and quant.cpu.head.mode == qtype
    # Prefill (20 rows: the de-quantise + GEMM path) and decode (the block kernels).
    want, got = runner_logits(dense, IDS), runner_logits(quant, IDS)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    assert decode_steps(quant, IDS, 8)[0] == decode_steps(dense, IDS, 8)[0]


def test_k_quants_load_dequantised(tmp_path) -> None:
    """Q6_K (no block kernel yet) runs de-quantised, and says so in its mode."""
    path = tmp_path / "tiny-Q6_K.gguf"
    write_gguf(path, "Q6_K")
    runner = _runner(path, quantization="gguf")
    assert runner.weight_mode == "float32"
    assert torch.isfinite(runner_logits(runner, IDS)).all()
