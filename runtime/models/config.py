"""Model configuration: the subset of a Hugging Face `config.json` the registered decoders need
(`runtime/models/registry.py`): Llama-family shapes plus per-layer attention windows, logit
soft-capping, qk-norm and mixture-of-experts settings."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.models.registry import ARCHITECTURES, UnsupportedModelError, arch_from_hf

SUPPORTED_ARCHITECTURES = {name: info.model_type for name, info in ARCHITECTURES.items()}
__all__ = ["SUPPORTED_ARCHITECTURES", "ModelConfig", "UnsupportedModelError"]


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM)."""

    architecture: str = "LlamaForCausalLM"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qkv projections carry a bias (Qwen2)
    sliding_window: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: tuple[int, ...] = (2,)
    torch_dtype: str = "float32"
    quantization: str | None = None  # "fp8": the checkpoint stores FP8 weights (see below)
    # Per layer: its sliding window (keys at positions > q - window), None for a global layer;
    # empty when no layer is windowed.
    layer_windows: tuple[int | None, ...] = ()
    attn_logit_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_logit_softcap: float | None = None
    attn_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar)
    rope_local_theta: float | None = None  # rotary base of windowed layers (Gemma 3)
    # the fraction of each head's dims that rotate (the first ones; Phi-4-mini: 0.75)
    partial_rotary_factor: float = 1.0
    hidden_act: str = "silu"
    num_experts: int = 0  # mixture-of-experts MLP when > 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1
    moe_layers: tuple[bool, ...] = ()  # per layer: sparse MLP (True) or dense
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's sigmoid-gated shared expert
    hf_config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def model_type(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        """Dims of each head the rotary embedding rotates (the first ones; the rest pass)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        arch = arch_from_hf(cfg)
        if isinstance(cfg.get("text_config"), dict):  # an image-text model: its text decoder
            top = {k: v for k, v in cfg.items() if k in ("torch_dtype", "dtype", "eos_token_id")}
            cfg = {**top, **cfg["text_config"], "architectures": [arch]}
            cfg["model_type"] = ARCHITECTURES[arch].model_type
        model_type = ARCHITECTURES[arch].model_type
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        eos = cfg.get("eos_token_id", 2)
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        rope_theta, rope_scaling, local_theta = _rope_settings(cfg)
        if rope_scaling is not None:
            kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            # NOTE: "freq_factors" (per-dim frequency divisors) comes from GGUF files only
            allowed = ("default", "linear", "llama3", "freq_factors") + (
                ("longrope",) if model_type == "phi3" else ()
            )
            if kind not in allowed:
                raise UnsupportedModelError(f"unsupported rope_scaling type {kind!r}")
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
        window = int(window) if window else None
        dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
        scalar = cfg.get("query_pre_attn_scalar") if model_type.startswith("gemma") else None
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        partial = _partial_rotary_factor(cfg, head_dim)
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(
                cfg.get("tie_word_embeddings", model_type.startswith("gemma"))
            ),
            attention_bias=_attention_bias(cfg, arch),
            sliding_window=window,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos_ids,
            torch_dtype=str(dtype).replace("torch.", ""),
            quantization=checkpoint_quantization(cfg.get("quantization_config")),
            layer_windows=_layer_windows(cfg, model_type, layers, window),
            attn_logit_softcap=_opt_float(cfg.get("attn_logit_softcapping")),
            final_logit_softcap=_opt_float(cfg.get("final_logit_softcapping")),
            attn_scale=None if scalar is None else float(scalar) ** -0.5,
            rope_local_theta=local_theta,
            partial_rotary_factor=partial,
            hidden_act=str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"),
            num_experts=experts,
            num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
            if experts
            else 0,
            norm_topk_prob=bool(cfg.get("norm_topk_prob", model_type != "qwen2_moe")),
            moe_layers=_moe_layers(cfg, layers) if experts else (),
            shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
            hf_config=dict(cfg),
        )

    def layer_window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    @classmethod
    def from_path(cls, path: str) -> ModelConfig:
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        with open(file) as f:
            return cls.from_hf_dict(json.load(f))

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` for transformers (used to build the reference model in tests)."""
        out = dict(self.hf_config)
        rope_scaling = self.rope_scaling
        if (rope_scaling or {}).get("rope_type") == "freq_factors":
            rope_scaling = None  # NOTE: no such type in transformers: HFReference sets them
        out.update(
            architectures=[self.architecture],
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=self.bos_token_id,
            eos_token_id=list(self.eos_token_id),
        )
        if self.model_type == "llama":
            out["attention_bias"] = self.attention_bias
        return out


def _attention_bias(cfg: dict[str, Any], arch: str) -> bool:
    """Qwen2 always has a qkv bias, Qwen2-MoE unless `qkv_bias` is false, others by
    `attention_bias`."""
    if arch == "Qwen2ForCausalLM":
        return True
    if arch == "Qwen2MoeForCausalLM":
        return bool(cfg.get("qkv_bias", True))
    return bool(cfg.get("attention_bias", False))


def _partial_rotary_factor(cfg: dict[str, Any], head_dim: int) -> float:
    """`partial_rotary_factor` (top level, or in transformers 5's `rope_parameters`); its rotary
    dims must be a positive even number."""
    params = cfg.get("rope_parameters")
    nested = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    factor = float(cfg.get("partial_rotary_factor") or nested or 1.0)
    rot = int(head_dim * factor)
    if not 0.0 < factor <= 1.0 or rot <= 0 or rot % 2:
        raise UnsupportedModelError(
            f"partial_rotary_factor={factor} gives {rot} rotary dims of head_dim {head_dim}: "
            "a positive even number is required"
        )
    return factor


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _rope_settings(cfg: dict[str, Any]) -> tuple[float | None, dict | None, float | None]:
    """(rope_theta, rope_scaling of the global layers, rotary base of windowed layers) from a
    config of transformers 4 (`rope_theta`, `rope_scaling`, `rope_local_base_freq`) or 5
    (`rope_parameters`, possibly one dict per layer type)."""
    theta, scaling = cfg.get("rope_theta"), cfg.get("rope_scaling")
    local = cfg.get("rope_local_base_freq")
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        local_params = params.get("sliding_attention") or {}
        local = local_params.get("rope_theta", local)
        params = params["full_attention"]
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
        if params.get("rope_type", "default") != "default":
            scaling = params
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return theta, scaling, None if local is None else float(local)


def _layer_windows(
    cfg: dict[str, Any], model_type: str, layers: int, window: int | None
) -> tuple[int | None, ...]:
    """Per-layer sliding windows from `layer_types` (transformers >= 4.5x), else each
    architecture's rule: Gemma 2 alternates (even layers windowed), Gemma 3 windows all but every
    `sliding_window_pattern`-th layer, Qwen windows layers >= `max_window_layers` (Qwen2-MoE:
    the even layers below it), Mistral /
    Mixtral / Phi-3 every layer."""
    if window is None:
        return ()
    types = cfg.get("layer_types")
    if types:
        sliding = [t == "sliding_attention" for t in types]
    elif model_type == "gemma2":
        sliding = [i % 2 == 0 for i in range(layers)]
    elif model_type.startswith("gemma3"):
        pattern = int(cfg.get("sliding_window_pattern", 6))
        sliding = [(i + 1) % pattern != 0 for i in range(layers)]
    elif model_type == "qwen2_moe":  # transformers' rule: even layers below max_window_layers
        last = int(cfg.get("max_window_layers", 0))
        sliding = [i % 2 == 0 and i < last for i in range(layers)]
    elif model_type.startswith("qwen"):
        first = int(cfg.get("max_window_layers", 0))
        sliding = [i >= first for i in range(layers)]
    elif model_type == "llama":
        sliding = [False] * layers
    else:
        sliding = [True] * layers
    if not any(sliding):
        return ()
    return tuple(window if s else None for s in sliding)


def _moe_layers(cfg: dict[str, Any], layers: int) -> tuple[bool, ...]:
    """Qwen3-MoE: layers in `mlp_only_layers` are dense, the rest sparse every
    `decoder_sparse_step`-th layer; Mixtral: every layer sparse."""
    dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step") or 1)
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))


def checkpoint_quantization(qcfg: dict[str, Any] | None) -> str | None:
    """The quantisation of a checkpoint's weights, from its `quantization_config`: "fp8" for
    FP8 weights with per-tensor or per-channel scales (HF's `quant_method: fp8`, as written by
    AutoFP8 / vLLM, or llm-compressor's `compressed-tensors` FP8 schemes); None for an
    unquantised one. Anything else (block-wise FP8, int4/int8 weights, GPTQ, AWQ, ...) raises
    UnsupportedModelError naming the setting.

    Static input scales (`activation_scheme: static`) are accepted and ignored: inputs are always
    quantised per token at run time, which is at least as accurate."""
    if not qcfg:
        return None
    method = qcfg.get("quant_method")
    if method == "fp8":
        if qcfg.get("weight_block_size"):
            raise UnsupportedModelError(
                f"block-wise FP8 weights (weight_block_size={qcfg['weight_block_size']}) are not "
                "supported; per-tensor and per-channel FP8 scales are"
            )
        return "fp8"
    if method == "compressed-tensors":
        for name, group in (qcfg.get("config_groups") or {}).items():
            w = group.get("weights") or {}
            scheme = (w.get("type"), w.get("num_bits"), w.get("strategy"))
            if scheme[:2] != ("float", 8) or scheme[2] not in ("tensor", "channel"):
                raise UnsupportedModelError(
                    f"compressed-tensors group {name!r}: weights {scheme} are not supported; "
                    "FP8 (type float, 8 bits) with a tensor or channel strategy is"
                )
        return "fp8"
    raise UnsupportedModelError(
        f"quantization_config.quant_method={method!r} is not supported; FP8 checkpoints "
        "(fp8, compressed-tensors FP8) are"
    )
