"""The same model in Hugging Face `transformers`: the peer of benchmarks and the oracle of parity
tests. Built from the very tensors radixlm loads (a GGUF is de-quantized by our loader, not by
transformers' 20 s GGUF path), so both sides compute with identical weights."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.models.rotary import rope_inv_freq


@dataclass
class HFReference:
    model: Any  # transformers PreTrainedModel, eval mode
    tokenizer: Any
    weights: dict[str, torch.Tensor]
    config: Any  # our ModelConfig

    @classmethod
    def load(
        cls,
        model_path: str | None = None,
        dtype: torch.dtype = torch.float32,
        load_format: str = "auto",
        device: str = "cpu",
    ) -> HFReference:
        """`device` also decides where `dummy` weights are drawn: use the engine's device to get
        the engine's exact weights (each device's generator gives its own random stream)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        from radixlm.runtime.frontend.tokenizer import load_tokenizer

        source = resolve_model(model_path, load_format)
        dev = torch.device(device)
        weights = {name: t.to(dtype) for name, t in source.iter_weights(dev, dtype)}
        hf_cfg = source.config.to_hf_dict()
        config = AutoConfig.for_model(**hf_cfg)
        with dev:
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, attn_implementation="sdpa"
            )
        missing, unexpected = model.load_state_dict(weights, strict=False)
        missing = [
            m for m in missing if not (m == "lm_head.weight" and source.config.tie_word_embeddings)
        ]
        if missing or unexpected:
            raise ValueError(
                f"reference weights mismatch: missing={missing} unexpected={unexpected}"
            )
        if source.config.tie_word_embeddings:
            model.tie_weights()
        if (source.config.rope_scaling or {}).get("rope_type") == "freq_factors":
            _set_rotary_frequencies(model, rope_inv_freq(source.config))
        tokenizer = (
            None if source.load_format == "dummy" else load_tokenizer(source.path, source.gguf)
        )
        return cls(model.eval(), tokenizer, weights, source.config)

    @classmethod
    def default(cls) -> HFReference:
        return cls.load()

    @torch.no_grad()
    def greedy(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy decoding with transformers' KV cache, exactly as `generate` does it, but never
        stopping at EOS (and never banning it, unlike `min_new_tokens`)."""
        dev = self.model.device
        out = self.model(torch.tensor([input_ids], device=dev), use_cache=True)
        tokens: list[int] = []
        for _ in range(max_new_tokens):
            tok = int(out.logits[0, -1].argmax())
            tokens.append(tok)
            if len(tokens) == max_new_tokens:
                break
            with warnings.catch_warnings():  # transformers >= 5.2x renames past_key_values
                warnings.simplefilter("ignore", FutureWarning)
                out = self.model(
                    torch.tensor([[tok]], device=dev),
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
        return tokens

    @torch.no_grad()
    def logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """log-softmax over the vocabulary at every position `[len, vocab]` (float32)."""
        logits = self.model(torch.tensor([token_ids], device=self.model.device)).logits[0].float()
        return torch.log_softmax(logits, dim=-1)


def _set_rotary_frequencies(model: Any, inv_freq: torch.Tensor) -> None:
    """A GGUF's per-dim rotary frequencies (llama.cpp's `rope_freqs`), which no transformers rope
    type expresses, written into the model's rotary embeddings."""
    rotaries = [
        m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)
    ]
    assert rotaries, "no rotary embedding with an inv_freq buffer"
    for module in rotaries:
        module.inv_freq.copy_(inv_freq)
        if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
            module.original_inv_freq.copy_(inv_freq)
