"""Checkpoint tensors into a `LlamaForCausalLM`: Hugging Face names, fused matrices, FP8 parts.

Names: `model.layers.N.self_attn.{q,k,v}_proj.*` fill row ranges of `qkv_proj`, `mlp.{gate,up}_proj.*`
of `gate_up_proj`; everything else maps one to one (`model.` dropped; a tied LM head skips
`lm_head.weight`). Every expected tensor must arrive exactly once.

FP8 checkpoints (`ModelConfig.quantization == "fp8"`, per-tensor or per-channel scales):
    `*.weight` float8_e4m3fn + `*.weight_scale` ([], [1], [N] or [N, 1]) -> the Linear's FP8
        storage (`Linear.prepare_fp8_storage`: FP8 rows and one fp32 scale per row, a part's
        per-tensor scale broadcast over its rows); every FP8 part needs its scale and vice versa;
    `*.input_scale` (static activation scales): ignored, inputs are quantised per token;
    `layers.N.self_attn.{k,v}_scale` (vLLM, llm-compressor), `kv_scale` (AutoFP8, both) or
        `{k,v}_proj.output_scale`: per-layer KV-cache scales, returned to the caller.
What an FP8 layer becomes on the device is decided after loading (`fp8.finish_fp8_checkpoint`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.linear import Linear

if TYPE_CHECKING:
    from radixlm.runtime.models.llama import LlamaForCausalLM

_FP8 = torch.float8_e4m3fn
_KV_SCALE = re.compile(
    r"layers\.(?P<layer>\d+)\.self_attn\."
    r"(?:(?P<which>k|v|kv)_scale|(?P<proj>k|v)_proj\.output_scale)$"
)


def load_hf_weights(
    model: LlamaForCausalLM, weights: Iterable[tuple[str, torch.Tensor]]
) -> dict[int, list[float]]:
    """Copy `weights` into `model`; returns the checkpoint's KV-cache scales,
    {layer: [k_scale, v_scale]} (empty for a checkpoint without)."""
    cfg = model.config
    loaded: set[str] = set()
    fp8_parts: set[str] = set()
    scale_parts: set[str] = set()
    kv_scales: dict[int, list[float]] = {}
    qkv_offsets = {"q": (0, cfg.q_size), "k": (cfg.q_size, cfg.kv_size)}
    qkv_offsets["v"] = (cfg.q_size + cfg.kv_size, cfg.kv_size)
    # NOTE: other architectures (registry.py) may map names themselves (`checkpoint_target(key)
    # -> (target, rows) | None`) and count their tensors (`expected_weight_count()`).
    mapper = getattr(model, "checkpoint_target", None)
    for name, tensor in weights:
        if "rotary_emb" in name or name.endswith(".input_scale"):
            continue
        key = name.removeprefix("model.")
        kv = _KV_SCALE.match(key)
        if kv is not None:
            _load_kv_scale(
                kv_scales, cfg, name, int(kv["layer"]), kv["which"] or kv["proj"], tensor
            )
            continue
        target, rows = key, None
        mapped = mapper(key) if mapper is not None else None
        if mapped is not None:  # an architecture's own names (experts, fused checkpoints)
            target, rows = mapped
        for proj in ("q", "k", "v") if mapped is None else ():
            part = f"self_attn.{proj}_proj."
            if part in key:
                target = key.replace(part, "self_attn.qkv_proj.")
                rows = qkv_offsets[proj]
        for i, proj in enumerate(("gate", "up") if mapped is None else ()):
            part = f"mlp.{proj}_proj."
            if part in key:
                target = key.replace(part, "mlp.gate_up_proj.")
                rows = (i * cfg.intermediate_size, cfg.intermediate_size)
        if target.startswith("lm_head.") and model.lm_head is None:
            continue
        prefix, _, attr = target.rpartition(".")
        if tensor.dtype == _FP8 or attr == "weight_scale":
            linear = _fp8_linear(model, name, prefix, loaded)
            (scale_parts if attr == "weight_scale" else fp8_parts).add(f"{prefix}:{rows}")
            if attr == "weight_scale":
                _load_weight_scale(linear.weight_scale, name, rows, tensor)
                continue
        param = _param(model, target)
        if param is None:
            raise KeyError(f"unexpected weight {name!r} for {cfg.architecture}")
        dst = param.data if rows is None else param.data.narrow(0, rows[0], rows[1])
        if dst.shape != tensor.shape:
            raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} != {tuple(dst.shape)}")
        if tensor.dtype.itemsize == 1 and tensor.dtype != _FP8:
            raise ValueError(f"weight {name!r}: {tensor.dtype} is not supported (FP8: e4m3fn)")
        if dst.dtype == _FP8 and tensor.dtype != _FP8:
            raise ValueError(f"{name!r}: {prefix} mixes FP8 and unquantised parts")
        dst.copy_(tensor)
        loaded.add(f"{target}:{rows}")
    counter = getattr(model, "expected_weight_count", None)
    expected = counter() if counter is not None else _expected_count(cfg)
    if len(loaded) != expected:
        raise ValueError(f"checkpoint is incomplete: loaded {len(loaded)} of {expected} tensors")
    if fp8_parts != scale_parts:
        unpaired = sorted(fp8_parts ^ scale_parts)
        raise ValueError(f"FP8 weights and weight_scale tensors do not pair up: {unpaired}")
    return kv_scales


def _param(model: nn.Module, target: str) -> nn.Parameter | None:
    """The parameter at a dotted name (looked up each time: FP8 storage replaces weights)."""
    prefix, _, attr = target.rpartition(".")
    try:
        param = getattr(model.get_submodule(prefix), attr, None)
    except AttributeError:
        return None
    return param if isinstance(param, nn.Parameter) else None


def _fp8_linear(model: nn.Module, name: str, prefix: str, loaded: set[str]) -> Linear:
    """The Linear at `prefix`, made ready for FP8 rows (before any of its parts is read)."""
    try:
        module = model.get_submodule(prefix)
    except AttributeError:
        module = None
    if not isinstance(module, Linear):
        raise KeyError(f"unexpected FP8 tensor {name!r}: {prefix!r} is not a linear layer")
    if module.weight.dtype != _FP8:
        if any(k.startswith(f"{prefix}.weight:") for k in loaded):
            raise ValueError(f"{name!r}: {prefix} mixes FP8 and unquantised parts")
        module.prepare_fp8_storage()
    return module


def _load_weight_scale(
    scale: torch.Tensor, name: str, rows: tuple[int, int] | None, tensor: torch.Tensor
) -> None:
    dst = scale if rows is None else scale.narrow(0, rows[0], rows[1])
    if tensor.numel() == 1:  # per tensor
        dst.fill_(float(tensor.reshape(())))
    elif tensor.numel() == dst.numel():  # per output channel ([N] or [N, 1])
        dst.copy_(tensor.reshape(-1))
    else:
        raise ValueError(
            f"{name!r}: {tuple(tensor.shape)} is neither one scale nor one per row "
            f"({dst.numel()}); block-wise FP8 scales are not supported"
        )


def _load_kv_scale(
    kv_scales: dict[int, list[float]],
    cfg: ModelConfig,
    name: str,
    layer: int,
    which: str,
    tensor: torch.Tensor,
) -> None:
    value = float(tensor.reshape(()))
    if not (math.isfinite(value) and value > 0.0) or layer >= cfg.num_hidden_layers:
        raise ValueError(f"KV-cache scale {name!r} = {value} (layer {layer}) is not usable")
    scales = kv_scales.setdefault(layer, [1.0, 1.0])
    for i in {"k": (0,), "v": (1,), "kv": (0, 1)}[which]:
        scales[i] = value


def _expected_count(cfg: ModelConfig) -> int:
    per_layer = (
        3 + (3 if cfg.attention_bias else 0) + 1 + 2 + 1 + 2
    )  # qkv(+bias), o, gate/up, down, norms
    return cfg.num_hidden_layers * per_layer + 2 + (0 if cfg.tie_word_embeddings else 1)
