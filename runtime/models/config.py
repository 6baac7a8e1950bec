"""Model configuration: the subset of a Hugging Face `config.json` the Llama-family decoders need."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its settings is not implemented."""


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

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            by_type = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
            arch = by_type.get(cfg.get("model_type", ""))
        if arch is None:
            raise UnsupportedModelError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eos = cfg.get("eos_token_id", 2)
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None and isinstance(cfg.get("rope_parameters"), dict):
            # transformers >= 5 nests rope settings under `rope_parameters`.
            params = cfg["rope_parameters"]
            rope_theta = params.get("rope_theta")
            if params.get("rope_type", "default") != "default":
                rope_scaling = params
        if rope_scaling is not None:
            kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            if kind not in ("default", "linear", "llama3"):
                raise UnsupportedModelError(f"unsupported rope_scaling type {kind!r}")
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
        dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            sliding_window=int(window) if window else None,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos_ids,
            torch_dtype=str(dtype).replace("torch.", ""),
            quantization=checkpoint_quantization(cfg.get("quantization_config")),
            hf_config=dict(cfg),
        )

    @classmethod
    def from_path(cls, path: str) -> ModelConfig:
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        with open(file) as f:
            return cls.from_hf_dict(json.load(f))

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` for transformers (used to build the reference model in tests)."""
        out = dict(self.hf_config)
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
            rope_scaling=self.rope_scaling,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=self.bos_token_id,
            eos_token_id=list(self.eos_token_id),
        )
        if self.model_type == "llama":
            out["attention_bias"] = self.attention_bias
        return out


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
