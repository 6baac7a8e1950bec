"""The CPU decode seam: a Llama-family model's whole decode step as one C++ call.

`CpuDecode(model)` is set on a `LlamaForCausalLM` by `setup_cpu_model` (cpu_linear.py) as
`model.cpu_decode`; the model's `forward` calls it for a DECODE batch and uses its result unless it
returns None. On first use with an attention backend it describes the model for
`kernels/cpu/decode.py` (`DecodeModel`: the layers' `CpuLinear` weights as they are in memory,
dense or GGUF blocks, the norms in fp32, the rotary tables, the KV pool's tensors and
`req_to_token`) and keeps the resulting `DecodeStep`; every step then costs one C++ call and a few
torch operators, instead of the ~4,000 operators and ~300 module calls of the layer-by-layer path
(which stays the reference: the same math, tests/runtime/test_cpu_decode_step.py).

It applies only where the C++ step computes exactly what the model does (`describe` returns None
otherwise and the model keeps its torch path, logged once): a plain `LlamaForCausalLM` (Llama,
Mistral without a window, Qwen2 with its qkv bias, SmolLM; silu MLP), the torch attention backend
with its C++ decode attention, no sliding window or soft cap, an fp32/fp16/bf16 KV pool, every
linear with a `CpuLinear` / `StackedCpuLinear` (no FP8 layer), and batches of <= `MAX_BATCH`
requests (larger ones are GEMM-shaped: torch's kernels take them).

# NOTE: at tensor parallelism > 1 it is never attached (cpu_linear.setup_cpu_model): the C++ step
# runs all layers in one call and cannot all-reduce after o_proj / down_proj inside it, so the
# layer-by-layer path (with its row-parallel all-reduces) runs the decode step there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from radixlm.kernels.cpu import decode as dk

if TYPE_CHECKING:
    from radixlm.runtime.attention.base import AttentionBackend
    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.models.linear import Linear
    from radixlm.runtime.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

MAX_BATCH = 16  # = cpu_linear.SMALL_M: larger batches are GEMM-shaped (torch's kernels)


def _linear_spec(linear: Linear) -> dk.LinearSpec | None:
    impl = linear.cpu_impl
    if linear.fp8 or impl is None:
        return None
    # NOTE: a `StackedCpuLinear` has `parts`, a `CpuLinear` `blocks` / `weight` (cpu_linear.py;
    # not imported: it imports this module to attach `CpuDecode`).
    parts = getattr(impl, "parts", [impl])
    if not all(hasattr(p, "blocks") and hasattr(p, "weight") for p in parts):
        return None
    specs = []
    for p in parts:
        if p.blocks is not None:
            specs.append((p.blocks, p.qtype))
        else:
            assert p.weight is not None
            specs.append((p.weight, -1))
    k = parts[0].k if parts[0].blocks is not None else linear.weight.shape[1]
    bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
    return dk.LinearSpec(specs, k, bias)


def describe(model: LlamaForCausalLM, attn: AttentionBackend) -> dk.DecodeModel | None:
    """The `DecodeModel` of `model` over `attn`'s pool, or None where the C++ step does not apply
    (see the module docstring)."""
    from radixlm.runtime.attention.torch_backend import TorchAttnBackend
    from radixlm.runtime.models.llama import (
        Embedding,
        LlamaAttention,
        LlamaDecoderLayer,
        LlamaForCausalLM,
        LlamaMLP,
        RMSNorm,
    )
    from radixlm.runtime.models.rotary import RotaryEmbedding

    cfg = model.config
    if type(model) is not LlamaForCausalLM or cfg.hidden_act != "silu":
        return None
    if not isinstance(attn, TorchAttnBackend) or not attn.cpu_decode or not attn.layers_plain():
        return None
    if attn.kv_pool.quantized or type(model.rotary) is not RotaryEmbedding or model.rotary.fused:
        return None
    if type(model.embed_tokens) is not Embedding or type(model.norm) is not RMSNorm:
        return None

    def norm(n: RMSNorm) -> torch.Tensor:
        return n.weight.detach().float().contiguous()

    layers = []
    for i, layer in enumerate(model.layers):
        plain = (type(layer), type(layer.self_attn), type(layer.mlp)) == (
            LlamaDecoderLayer, LlamaAttention, LlamaMLP,
        )  # fmt: skip
        if not plain:
            return None
        lins = [
            _linear_spec(m)
            for m in (
                layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                layer.mlp.gate_up_proj, layer.mlp.down_proj,
            )
        ]  # fmt: skip
        if any(s is None for s in lins):
            return None
        k_pool, v_pool = attn.kv_pool.k[i], attn.kv_pool.v[i]
        norms = (norm(layer.input_layernorm), norm(layer.post_attention_layernorm))
        layers.append(dk.LayerSpec(*lins, *norms, k_pool, v_pool))  # type: ignore[arg-type]
    spec = dk.DecodeModel(
        layers, model.embed_tokens.weight.detach().contiguous(), norm(model.norm),
        model.rotary.cos.contiguous(), model.rotary.sin.contiguous(), attn.req_to_token,
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size,
        float(model.norm.eps), float(attn.layer(0).scale),
    )  # fmt: skip
    return spec if dk.supported(spec) else None


class CpuDecode:
    """`model.cpu_decode`: runs a DECODE batch's whole forward in C++ (see the module docstring)."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model  # NOTE: a plain reference (this is no nn.Module): no submodule
        self._attn: AttentionBackend | None = None
        self._step: dk.DecodeStep | None = None
        self.dtype = model.embed_tokens.weight.dtype

    def __call__(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor | None:
        """Final hidden states of the batch's `logits_indices` rows (all rows when None), or None
        where the C++ step does not apply (the caller runs its torch path)."""
        step = self._step_for(attn)
        if step is None or batch.batch_size > MAX_BATCH:
            return None
        out = step.step(
            batch.input_ids, batch.positions, batch.out_cache_loc, batch.req_pool_indices,
            batch.seq_lens,
        )  # fmt: skip
        if batch.logits_indices is not None:
            out = out.index_select(0, batch.logits_indices)
        return out if self.dtype == torch.float32 else out.to(self.dtype)

    def verify(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor | None:
        """A speculative verify forward (an EXTEND batch with a `tree_mask`) as one decode step
        over its tree nodes: node j of request i is a decode query over the slots its path will
        have once committed (the torch backend's per-node table, `_VerifyMeta.node_table`), so
        each row is computed exactly as the decode step of that token would compute it. Padding
        nodes (the rows past each request's real nodes, slot 0) are not run: their rows are 0.
        Hidden states of every row [B * N, D], or None where the C++ step does not apply.
        # NOTE: the C++ step stores every row's K/V of a layer before any row attends, so a node
        # sees its ancestors' K/V written in this same call."""
        meta = batch.attn_metadata
        table = getattr(meta, "node_table", None)
        step = self._step_for(attn)
        if step is None or table is None or batch.tree_mask is None:
            return None
        loc = batch.out_cache_loc
        real = (loc != 0).nonzero().view(-1)  # NOTE: alloc_draft_slots gives padding slot 0
        if real.numel() > MAX_BATCH or batch.logits_indices is not None:
            return None
        out = step.step(
            batch.input_ids.index_select(0, real), batch.positions.index_select(0, real),
            loc.index_select(0, real), real, meta.node_lens.index_select(0, real), table,
        )  # fmt: skip
        full = out.new_zeros(loc.shape[0], out.shape[1])
        full.index_copy_(0, real, out)
        return full if self.dtype == torch.float32 else full.to(self.dtype)

    def _step_for(self, attn: AttentionBackend) -> dk.DecodeStep | None:
        if attn is not self._attn:
            self._attn = attn
            spec = describe(self.model, attn)
            self._step = None if spec is None else dk.DecodeStep(spec)
            logger.info(
                "CPU decode: %s",
                "one C++ call per step" if spec else "layer by layer (model or pool not covered)",
            )
        return self._step
