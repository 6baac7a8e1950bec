"""The model registry: checkpoint architecture names -> the radixlm class that runs them.

Two keys find an entry: a Hugging Face `config.json`'s `architectures` (or its `model_type`), and a
GGUF file's `general.architecture` (llama.cpp's name). `MODEL_CLASSES` is the seam's `Registry`
(runtime/registry.py) built from the table: classes are imported lazily, so reading a config never
imports torch modules it does not need. docs/models.md lists this table
(a test checks the two agree).
"""

from __future__ import annotations

from typing import NamedTuple

from radixlm.runtime.registry import Registry


class ArchInfo(NamedTuple):
    model_type: str  # HF `model_type`
    module: str  # radixlm.runtime.models.<module>
    cls: str  # class in that module
    gguf_arch: str | None  # llama.cpp `general.architecture`, None when no GGUF support


ARCHITECTURES: dict[str, ArchInfo] = {
    "LlamaForCausalLM": ArchInfo("llama", "llama", "LlamaForCausalLM", "llama"),
    "MistralForCausalLM": ArchInfo("mistral", "llama", "LlamaForCausalLM", None),
    "Qwen2ForCausalLM": ArchInfo("qwen2", "llama", "LlamaForCausalLM", "qwen2"),
    "Qwen2MoeForCausalLM": ArchInfo("qwen2_moe", "qwen2_moe", "Qwen2MoeForCausalLM", "qwen2moe"),
    "Qwen3ForCausalLM": ArchInfo("qwen3", "qwen3", "Qwen3ForCausalLM", "qwen3"),
    "Qwen3MoeForCausalLM": ArchInfo("qwen3_moe", "qwen3", "Qwen3ForCausalLM", "qwen3moe"),
    "MixtralForCausalLM": ArchInfo("mixtral", "mixtral", "MixtralForCausalLM", None),
    "Gemma2ForCausalLM": ArchInfo("gemma2", "gemma", "GemmaForCausalLM", "gemma2"),
    "Gemma3ForCausalLM": ArchInfo("gemma3_text", "gemma", "GemmaForCausalLM", "gemma3"),
    # Gemma 3 4B/12B/27B checkpoints: the text decoder of the image-text model (images unsupported)
    "Gemma3ForConditionalGeneration": ArchInfo("gemma3", "gemma", "GemmaForCausalLM", None),
    "Phi3ForCausalLM": ArchInfo("phi3", "phi3", "Phi3ForCausalLM", "phi3"),
    # speculative-decoding draft heads (runtime/speculative/draft_worker.py), not models of their own
    "LlamaForCausalLMEagle": ArchInfo("llama_eagle", "eagle", "EagleHead", None),
    "LlamaForCausalLMEagle3": ArchInfo("llama_eagle3", "eagle3", "Eagle3Head", None),
}


# NOTE: built from ARCHITECTURES (add a row there): architecture name -> model class.
MODEL_CLASSES: Registry[type] = Registry("model architecture")
for _name, _info in ARCHITECTURES.items():
    MODEL_CLASSES.register(_name, f"radixlm.runtime.models.{_info.module}:{_info.cls}")


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its settings is not implemented."""


def supported_list() -> str:
    return ", ".join(sorted(ARCHITECTURES))


def arch_from_hf(cfg: dict) -> str:
    """The registered architecture of a `config.json` dict (its `architectures`, else its
    `model_type`); UnsupportedModelError listing the supported ones otherwise."""
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        by_type = {info.model_type: name for name, info in ARCHITECTURES.items()}
        arch = by_type.get(cfg.get("model_type", ""))
    if arch is None:
        raise UnsupportedModelError(
            f"unsupported architecture {archs or cfg.get('model_type')!r}; "
            f"supported: {supported_list()}"
        )
    return arch


def arch_from_gguf(gguf_arch: str) -> str:
    """The registered architecture of a GGUF `general.architecture`."""
    for name, info in ARCHITECTURES.items():
        if info.gguf_arch == gguf_arch:
            return name
    names = sorted(i.gguf_arch for i in ARCHITECTURES.values() if i.gguf_arch)
    raise UnsupportedModelError(
        f"GGUF architecture {gguf_arch!r} is not supported; supported: {', '.join(names)}"
    )


def model_class(architecture: str) -> type:
    """The class that runs `architecture` (constructor: config, max_positions, device,
    fused_ops)."""
    if architecture not in MODEL_CLASSES:
        raise UnsupportedModelError(
            f"unsupported architecture {architecture!r}; supported: {supported_list()}"
        )
    return MODEL_CLASSES.load(architecture)
