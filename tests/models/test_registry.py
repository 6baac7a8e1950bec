"""The model registry: docs/models.md's table against it, unsupported architectures at start-up."""

from __future__ import annotations

import json
import os
import re

import pytest

from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.registry import (
    ARCHITECTURES,
    UnsupportedModelError,
    arch_from_gguf,
    model_class,
)

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "models.md")


def _doc_rows() -> dict[str, tuple[str, str | None]]:
    rows = {}
    with open(DOC) as f:
        for line in f:
            m = re.match(r"^\| (\w+For\w+) \| (\w+) \| ([\w-]+) \|", line)
            if m:
                rows[m[1]] = (m[2], None if m[3] == "-" else m[3])
    return rows


def test_docs_table_equals_the_registry() -> None:
    assert _doc_rows() == {
        name: (info.model_type, info.gguf_arch) for name, info in ARCHITECTURES.items()
    }


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_registered_class_imports(name) -> None:
    assert callable(model_class(name))


def test_unsupported_architecture_lists_the_supported_ones() -> None:
    cfg = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox"}
    with pytest.raises(UnsupportedModelError, match="GPTNeoXForCausalLM") as err:
        ModelConfig.from_hf_dict(cfg)
    for name in ARCHITECTURES:
        assert name in str(err.value)
    with pytest.raises(UnsupportedModelError, match="qwen3moe"):
        arch_from_gguf("falcon")


def test_engine_refuses_an_unsupported_checkpoint_at_start(tmp_path) -> None:
    from radixlm.runtime.frontend.engine import Engine

    cfg = {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "vocab_size": 8}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(Exception, match=r"BloomForCausalLM.*supported: .*Qwen3ForCausalLM"):
        Engine(model_path=str(tmp_path), load_format="dummy", skip_tokenizer_init=True)


def test_qwen2_moe_windows_without_layer_types_follow_transformers() -> None:
    """A Qwen2-MoE config.json without `layer_types` windows the layers transformers does (the
    even ones below `max_window_layers`), not Qwen2's rule (the ones from it on)."""
    from transformers import Qwen2MoeConfig

    raw = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 5}
    shape = {"num_hidden_layers": 7, "hidden_size": 64, "num_attention_heads": 4}
    shape.update(vocab_size=256, intermediate_size=96, num_experts=4, num_experts_per_tok=2)
    hf_types = Qwen2MoeConfig(**raw, **shape).layer_types
    ours = ModelConfig.from_hf_dict(
        {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", **raw, **shape}
    )
    assert [w is not None for w in ours.layer_windows] == [
        t == "sliding_attention" for t in hf_types
    ]
    assert ours.attention_bias and not ours.norm_topk_prob  # Qwen2-MoE's defaults


def test_partial_rotary_factor_from_either_place_and_odd_dims_refused() -> None:
    """`partial_rotary_factor` at the top level (transformers 4) or in `rope_parameters`
    (transformers 5) sets the rotary dims; a factor giving an odd or empty rotary part fails at
    start-up naming it."""
    base = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 256}
    base.update(hidden_size=512, num_attention_heads=4, intermediate_size=96, num_hidden_layers=1)
    top = ModelConfig.from_hf_dict({**base, "partial_rotary_factor": 0.75})
    nested = ModelConfig.from_hf_dict(
        {**base, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.75}}
    )
    assert top.rotary_dim == nested.rotary_dim == 96 and top.head_dim == 128
    assert ModelConfig.from_hf_dict(base).rotary_dim == 128
    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor"):
        ModelConfig.from_hf_dict({**base, "partial_rotary_factor": 0.7})  # 89.6 -> 89 dims
