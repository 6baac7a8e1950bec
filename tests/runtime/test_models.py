"""Model implementations and loaders against transformers (the reference implementation):
Llama (incl. llama3 rope scaling), Mistral and Qwen2 (qkv bias) from HF safetensors directories,
dtypes, dummy weights, the pure-torch reference forward, and the GGUF tokenizer."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.config import ModelConfig
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.models.reference import reference_logits
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

BASE = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
}
CONFIGS = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **BASE},
    "llama3_rope": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **BASE,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "llama_tied_mha": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **BASE,
        "num_key_value_heads": 4,
        "tie_word_embeddings": True,
    },
    "mistral": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        **BASE,
        "sliding_window": None,
    },
    "qwen2": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        **BASE,
        "num_key_value_heads": 1,
    },
}
IDS = [5, 17, 250, 3, 99, 42, 7, 7, 7, 128, 64, 1, 2, 3, 299, 0]


def _save_hf(tmp_path, cfg: dict, dtype=torch.float32):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # HF's init leaves biases at zero; make them matter
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model.to(dtype)


def _runner(path, dtype: str = "float32") -> ModelRunner:
    args = ServerArgs(
        model_path=str(path), dtype=dtype, max_total_tokens=256, max_running_requests=2
    )
    return ModelRunner(args, resolve_model(str(path)))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_directory_matches_transformers(tmp_path, name) -> None:
    hf = _save_hf(tmp_path, CONFIGS[name])
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]
    ours = runner_logits(_runner(tmp_path), IDS)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    # The dense reference forward (the test oracle) agrees too.
    weights = {k: v for k, v in hf.state_dict().items()}
    oracle = reference_logits(weights, ModelConfig.from_path(str(tmp_path)), IDS)
    torch.testing.assert_close(oracle, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_matches_transformers(tmp_path, dtype) -> None:
    torch_dtype = getattr(torch, dtype)
    hf = _save_hf(tmp_path, CONFIGS["llama"], torch_dtype)
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0].float()
    ours = runner_logits(_runner(tmp_path, dtype), IDS)
    assert (ours - ref).abs().max() < 0.05 * ref.abs().max()
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_dummy_weights_are_deterministic_and_shaped_like_the_preset() -> None:
    a = ModelRunner(
        ServerArgs(model_path="tiny-qwen2", load_format="dummy", max_total_tokens=128),
        resolve_model("tiny-qwen2", "dummy"),
    )
    b = ModelRunner(
        ServerArgs(model_path="tiny-qwen2", load_format="dummy", max_total_tokens=128),
        resolve_model("tiny-qwen2", "dummy"),
    )
    assert a.model.layers[0].self_attn.qkv_proj.bias is not None  # qwen2: qkv bias
    torch.testing.assert_close(runner_logits(a, IDS), runner_logits(b, IDS))


def test_gguf_tokenizer_equals_transformers_gguf_conversion() -> None:
    import os

    from transformers import AutoTokenizer

    from radixlm.runtime.frontend.tokenizer import load_tokenizer
    from radixlm.runtime.models.default_model import default_model_path

    path = default_model_path()
    ours = load_tokenizer(path)
    ref = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    texts = [
        "Hello world! 12345 The capital of France is",
        "  spaces\n\nnewlines\ttabs üñîçødé 日本語 🤖",
        "<|im_start|>user\nHi<|im_end|>\n",
        "def f(x):\n    return x ** 2  # comment",
    ]
    for text in texts:
        assert ours.encode(text) == ref.encode(text)
        assert ours.decode(ours.encode(text)) == ref.decode(ref.encode(text))
    assert ours.eos_token_id == ref.eos_token_id == 2
    assert ours.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False
    ) == ref.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
