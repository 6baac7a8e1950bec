"""The CPU linear seam: which kernel a `Linear` (and a tied LM head) runs on CPU.

`attach_cpu_linears(model, linear_cls, gguf)` runs once after the weights are loaded on CPU. Each
linear layer gets a `CpuLinear` in its `cpu_impl` attribute, which its `forward` calls instead of
`F.linear`; the model code knows nothing else about CPU kernels. A `CpuLinear` holds the weight
in one of two forms:

- dense (fp32, fp16, bf16: the model dtype): every input, decode row or prefill chunk, runs the
  C++ GEMV / GEMM (`kernels/cpu/linear.py`);
- GGUF blocks (`quantization="gguf"`, Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 and the K-quants Q4_K /
  Q5_K / Q6_K, as stored in the file): the weight stays quantised in memory (Q4_0 / Q4_1 / Q8_0
  rows repacked in groups of 16 where the kernels run: `cl.pack_blocks`). The 32-value block
  types run their block kernel (on Q8 activations) for every input; K-quant layers run it for
  decode-sized inputs (<= `SMALL_M` rows) and de-quantise the layer once per call for larger ones
  (torch's GEMM on an fp32 scratch matrix). A fused layer whose parts differ in type (a Q4_K_M
  file's q/k in Q4_K and v in Q6_K) is a `StackedCpuLinear`: one block `CpuLinear` per run of
  same-typed parts.

# NOTE: batch invariance (speculative decoding's exactness: a verify step computes k + 1 rows per
# request where plain decode computes one): wherever the C++ kernels take every input size, a row's
# output is bitwise the same alone, in a decode batch or in a prefill chunk (kernels/cpu/gemv.h).

Where the kernel library is unavailable (`kernels.cpu.build.load()` logs why, once), a layer keeps
torch's path (a quantised layer: de-quantised once at attach time, so it still runs).
Data flow: x [M, K] (model dtype) -> kernel (fp32 out) -> y [M, N] in x's dtype (+ bias).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu import linear as cl
from radixlm.kernels.cpu.hugepages import HugeArena
from radixlm.runtime.distributed.state import parallel_state

if TYPE_CHECKING:
    from radixlm.runtime.models.gguf_file import GGUFFile

logger = logging.getLogger(__name__)

SMALL_M = 16  # rows up to which K-quant layers run their block kernel (decode batches)


class CpuLinear:
    """One layer's CPU weight and the kernel choice for it (see the module docstring)."""

    def __init__(
        self,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None = None,
        blocks: torch.Tensor | None = None,
        qtype: int = 0,
        k: int = 0,
    ) -> None:
        assert (weight is None) != (blocks is None)
        self.fast = cl.available()
        if blocks is not None and self.fast:  # NOTE: the kernels' 16-row form where it applies
            blocks, qtype = cl.pack_blocks(blocks, qtype)
        self.weight, self.bias, self.blocks, self.qtype, self.k = weight, bias, blocks, qtype, k

    @property
    def mode(self) -> str:
        if self.blocks is not None:
            return cl.QTYPE_NAMES[self.qtype]
        assert self.weight is not None
        return str(self.weight.dtype).replace("torch.", "")

    def nbytes(self) -> int:
        t = self.blocks if self.blocks is not None else self.weight
        assert t is not None
        return t.numel() * t.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead, m = x.shape[:-1], x.numel() // max(x.shape[-1], 1)
        y = None
        if self.blocks is not None:
            if self.fast and (m <= SMALL_M or self.qtype in cl.Q8_BLOCK_TYPES):
                y = cl.linear_quant(x, self.blocks, self.qtype, self.k)
            if y is None:
                w = cl.dequant(self.blocks, self.qtype, self.k) if self.fast else None
                if w is None:
                    w = cl.dequant_ref(self.blocks, self.qtype, self.k)
                y = F.linear(x.reshape(-1, x.shape[-1]).float(), w)
        else:
            assert self.weight is not None
            if self.fast and m > 0:
                y = cl.linear_dense(x, self.weight)
            if y is None:
                return F.linear(x, self.weight, self.bias)
        y = y.view(*lead, y.shape[-1]).to(x.dtype)
        return y if self.bias is None else y + self.bias


class StackedCpuLinear:
    """A fused layer whose GGUF parts differ in type: one block `CpuLinear` per run of same-typed
    parts, their outputs concatenated along the last dim (the parts' row order)."""

    def __init__(self, parts: list[CpuLinear]) -> None:
        self.parts = parts

    @property
    def mode(self) -> str:  # e.g. "Q4_K+Q6_K"
        return "+".join(sorted({p.mode for p in self.parts}))

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


# ---- attach -------------------------------------------------------------------------------------
# Decoder linears: module suffix -> the GGUF parts stacked into its rows, in order.
_GGUF_PARTS = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}


def gguf_blocks(
    gguf: GGUFFile, layer: int, parts: tuple[str, ...], heads: dict[str, int], permute: bool
) -> list[tuple[torch.Tensor, int]] | None:
    """A layer's GGUF parts as block rows `[N, cl.row_bytes(qtype, K)]` with their ggml type, one
    entry per run of consecutive same-typed parts (stacked in row order), or None unless every
    part is in the file with a type of `cl.BLOCK_BYTES`."""
    from radixlm.runtime.models.loader import unpermute_rows

    names = [f"blk.{layer}.{p}.weight" for p in parts]
    if any(name not in gguf.tensors for name in names):
        return None  # NOTE: another layout (Phi-3's fused attn_qkv): the layer stays dense
    tensors = [gguf.tensors[name] for name in names]
    if any(t.ggml_type not in cl.BLOCK_BYTES for t in tensors):
        return None
    runs: list[tuple[list[torch.Tensor], int]] = []
    for part, t in zip(parts, tensors):
        n, k = t.shape
        r = torch.from_numpy(t.data.copy()).view(n, cl.row_bytes(t.ggml_type, k))
        if permute and part in heads:  # llama.cpp's rope row order (see loader.py)
            r = unpermute_rows(r, heads[part])
        if runs and runs[-1][1] == t.ggml_type:
            runs[-1][0].append(r)
        else:
            runs.append(([r], t.ggml_type))
    return [(torch.cat(rows).contiguous(), qtype) for rows, qtype in runs]


def attach_cpu_linears(
    model: nn.Module,
    linear_cls: type,
    gguf: GGUFFile | None = None,
    num_heads: tuple[int, int] = (0, 0),
) -> dict[str, int]:
    """Give every `linear_cls` module of `model` its `cpu_impl`; with `gguf`, decoder layers whose
    parts are all of types of `cl.BLOCK_BYTES` (Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K) keep those blocks
    and drop their dense weight. Returns the number of layers holding each weight form (e.g.
    {"Q4_1": 120}; a layer of Q4_K and Q6_K parts counts under both)."""
    modes: dict[str, int] = {}
    heads = {"attn_q": num_heads[0], "attn_k": num_heads[1]}
    permute = gguf is not None and gguf.architecture == "llama"
    for name, module in model.named_modules():
        if not isinstance(module, linear_cls) or module.fp8:
            continue  # NOTE: an FP8 layer keeps its emulation (inputs quantised per token)
        impl: CpuLinear | StackedCpuLinear | None = None
        _, _, suffix = name.partition("layers.")
        layer_s, _, rest = suffix.partition(".")
        if gguf is not None and rest in _GGUF_PARTS and cl.available():
            got = gguf_blocks(gguf, int(layer_s), _GGUF_PARTS[rest], heads, permute)
            if got is not None and module.bias is None:
                k = module.weight.shape[1]
                parts = [CpuLinear(None, blocks=b, qtype=q, k=k) for b, q in got]
                impl = parts[0] if len(parts) == 1 else StackedCpuLinear(parts)
                # NOTE: the dense copy made at load is dropped: the layer now lives in its blocks.
                module.weight = nn.Parameter(torch.empty(0, k), requires_grad=False)
        if impl is None:
            impl = CpuLinear(module.weight.data.contiguous(), module.bias)
        module.cpu_impl = impl
        for mode in impl.mode.split("+"):
            modes[mode] = modes.get(mode, 0) + 1
    return modes


class CpuSetup(NamedTuple):
    mode: str  # what the decoder linears run: "float32", "bfloat16", "Q4_1", "Q4_K+Q6_K", ...
    layers: dict[str, int]  # linear layers holding each weight form (a mixed layer: under each)
    head: CpuLinear | None  # the tied LM head (None: the model's own `compute_logits`)


def setup_cpu_model(
    model: nn.Module, linear_cls: type, gguf: GGUFFile | None, quantize: bool
) -> CpuSetup:
    """Attach the CPU kernels to a loaded model (see `attach_cpu_linears`); `quantize` keeps a
    GGUF file's blocks (`quantization="gguf"`). A tied LM head gets the token embedding's blocks
    where those are of a type of `cl.BLOCK_BYTES`, else the dense embedding matrix."""
    cfg = model.config
    # NOTE: at TP > 1 a rank's layers hold slices of the checkpoint's tensors, de-quantised at
    # load (a row-parallel slice of GGUF blocks would cut them mid-block): dense kernels only, the
    # tied LM head is the model's own (it all-gathers the vocabulary), and there is no one-call
    # decode step (kernels/cpu/decode.cpp cannot all-reduce inside: the layer path runs).
    tp = parallel_state().is_parallel
    source = gguf if quantize and not tp else None
    layers = attach_cpu_linears(
        model, linear_cls, source, (cfg.num_attention_heads, cfg.num_key_value_heads)
    )
    head = None
    if not tp and getattr(model, "lm_head", None) is None and hasattr(model, "embed_tokens"):
        emb = model.embed_tokens.weight.data
        t = None if source is None else source.tensors.get("token_embd.weight")
        if t is not None and t.ggml_type in cl.BLOCK_BYTES and cl.available():
            n, k = t.shape
            blocks = torch.from_numpy(t.data.copy()).view(n, cl.row_bytes(t.ggml_type, k))
            head = CpuLinear(None, blocks=blocks, qtype=t.ggml_type, k=k)
        else:
            head = CpuLinear(emb.contiguous())
    mode = "+".join(sorted(layers, key=lambda m: (-layers[m], m)))  # most layers first
    if cl.available():
        model.cpu_weight_arena = _weights_to_huge_pages(model, linear_cls, head)
    if cl.available() and hasattr(model, "cpu_decode") and not tp:
        from radixlm.runtime.models.cpu_decode import CpuDecode

        model.cpu_decode = CpuDecode(model)  # NOTE: decides on first use (needs the KV pool)
    return CpuSetup(mode, layers, head)


def _weights_to_huge_pages(
    model: nn.Module, linear_cls: type, head: CpuLinear | None
) -> HugeArena | None:
    """Move the weights the CPU kernels stream (every `CpuLinear`'s dense weight or blocks, the
    tied head's) into one 2 MB-page arena (kernels/cpu/hugepages.py); a dense weight's module
    parameter (and a tied head's embedding) is pointed at the same copy. Returns the arena, whose
    owner (the model) keeps it, or None where huge pages are not available."""
    owners: list[tuple[CpuLinear, nn.Parameter | None]] = []
    for module in model.modules():
        impl = getattr(module, "cpu_impl", None) if isinstance(module, linear_cls) else None
        for part in getattr(impl, "parts", [impl] if impl is not None else []):
            tied = part.weight is not None and part.weight.data_ptr() == module.weight.data_ptr()
            owners.append((part, module.weight if tied else None))
    if head is not None:
        emb = getattr(getattr(model, "embed_tokens", None), "weight", None)
        tied = emb is not None and head.weight is not None
        owners.append((head, emb if tied and head.weight.data_ptr() == emb.data_ptr() else None))
    tensors = [p.blocks if p.blocks is not None else p.weight for p, _ in owners]
    keep = [i for i, t in enumerate(tensors) if t is not None and t.numel() and t.is_contiguous()]
    arena = HugeArena()
    moved = arena.rehome([tensors[i] for i in keep])
    if moved is None:
        logger.info("CPU weights: huge pages unavailable, 4 KB pages")
        return None
    for i, new in zip(keep, moved):
        part, param = owners[i]
        if part.blocks is not None:
            part.blocks = new
        else:
            part.weight = new
            if param is not None:
                param.data = new
    logger.info("CPU weights: %.0f MB in 2 MB pages", arena.nbytes / 2**20)
    return arena
