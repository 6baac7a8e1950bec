"""GGUF block-quantised execution on CPU (`quantization="gguf"`): tiny Llama files written by the
`gguf` package, one per quant type (K-quants: hand-built random super-blocks), run with their
weights kept in blocks and give the logits (K-quants: and greedy tokens) of the same file
de-quantised to fp32; the 32-value block types run on Q8 activations, within 2 % of those logits.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize
from kquant_blocks import random_kquant_blocks

from radixlm.bench.cpu_profile import decode_steps
from radixlm.kernels.cpu import build, hugepages
from radixlm.kernels.cpu import linear as cl
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

pytestmark = pytest.mark.skipif(
    build.isa() is None or build.compiler() is None, reason="no AVX2 CPU or no C++ compiler"
)
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 320
IDS = [5, 17, 250, 3, 99, 42, 7, 7, 7, 128, 64, 1, 2, 3, 299, 0, 11, 12, 13, 14]


def write_gguf(path, qtype: str, overrides: dict[str, str] | None = None) -> None:
    """A random tiny Llama whose linear weights (and token embedding) are `qtype` blocks; names
    in `overrides` (e.g. "attn_v") get another type, as llama.cpp's mixed K-quant files do."""
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

    def add(name: str, rows: int, cols: int, scale: float = 0.05) -> None:
        part = name.split(".")[-2]
        q = GGMLQuantizationType[(overrides or {}).get(part, qtype)]
        if q.name.endswith("_K"):  # NOTE: gguf has no K-quant quantiser: random valid blocks
            blocks = random_kquant_blocks(rng, rows, cols, q.value, scale)
            w.add_tensor(name, blocks, raw_dtype=q)
            return
        data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
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


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
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
    if hugepages.supported():  # the streamed weights live in the 2 MB-page arena
        arena = quant.model.cpu_weight_arena
        assert arena is not None and arena.mappings
        lo = min(ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in arena.mappings)
        assert qkv.cpu_impl.blocks.data_ptr() >= lo
        o_proj = dense.model.layers[0].self_attn.o_proj  # a dense weight: its parameter shares it
        assert o_proj.weight.data_ptr() == o_proj.cpu_impl.weight.data_ptr()
        assert dense.model.cpu_weight_arena is not None
    want, got = runner_logits(dense, IDS), runner_logits(quant, IDS)
    if quant.cpu.head.qtype in cl.Q8_BLOCK_TYPES:
        # NOTE: these run on Q8-quantised activations (kernels/cpu/q8dot.h), as llama.cpp does:
        # close to the fp32 path's logits, not equal (the quality gate bounds the default model)
        err = float((got - want).norm() / want.norm())
        assert 0 < err < 0.02, err
    else:  # K-quants: fp32 activations, equal up to float rounding, the same greedy tokens
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        assert decode_steps(quant, IDS, 8)[0] == decode_steps(dense, IDS, 8)[0]


def test_mixed_k_quant_file(tmp_path) -> None:
    """A Q4_K_M-like file: attn_v and ffn_down in Q6_K, the rest Q4_K, plus attn_output in F16
    (no block kernel). The fused qkv (Q4_K q/k + Q6_K v) runs two block kernels, o_proj runs
    de-quantised; the mode names every form, and logits and greedy tokens equal the fp32 path's."""
    path = tmp_path / "tiny-mixed.gguf"
    write_gguf(path, "Q4_K", {"attn_v": "Q6_K", "ffn_down": "Q6_K", "attn_output": "F16"})
    dense = _runner(path, dtype="float32")
    quant = _runner(path, quantization="gguf")
    assert quant.cpu.layers == {"Q4_K": 2 * LAYERS, "Q6_K": 2 * LAYERS, "float32": LAYERS}
    assert quant.weight_mode == "Q4_K+Q6_K+float32"
    qkv = quant.model.layers[0].self_attn.qkv_proj
    assert [p.mode for p in qkv.cpu_impl.parts] == ["Q4_K", "Q6_K"] and qkv.weight.numel() == 0
    want, got = runner_logits(dense, IDS), runner_logits(quant, IDS)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    assert decode_steps(quant, IDS, 8)[0] == decode_steps(dense, IDS, 8)[0]
