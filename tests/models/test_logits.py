"""Every registered architecture's forward against transformers on its tiny model: all-position
logits of one prompt (the torch attention backend, CPU, fp32); also Mistral and Qwen2 with their
sliding windows enabled (the prompt is longer than the window)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY, WINDOWED, save_tiny

from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

IDS = [1, 5, 17, 250, 3, 99, 42, 7, 7, 7, 128, 64, 11, 2, 3, 255, 0, 9, 31, 200]


@pytest.mark.parametrize("name", [*TINY, *WINDOWED])
def test_logits_match_transformers(tmp_path, name) -> None:
    hf = save_tiny(name, str(tmp_path))
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]
    args = ServerArgs(model_path=str(tmp_path), max_total_tokens=256, max_running_requests=2)
    ours = runner_logits(ModelRunner(args, resolve_model(str(tmp_path))), IDS)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_gemma3_image_text_checkpoint_runs_its_text_decoder(tmp_path) -> None:
    """Gemma 3 4B/12B/27B ship as `Gemma3ForConditionalGeneration` (text + vision): radixlm
    loads the text decoder (vision weights skipped) and matches transformers on text input."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {k: v for k, v in TINY["gemma3"].items() if k not in ("architectures", "model_type")}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    vision.update(num_attention_heads=2, image_size=28, patch_size=14)
    cfg = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=255,
        boi_token_index=253,
        eoi_token_index=254,
    )
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if "norm" in pname else 0.05))
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([IDS[:-5]])).logits[0]
    args = ServerArgs(model_path=str(tmp_path), max_total_tokens=256, max_running_requests=2)
    source = resolve_model(str(tmp_path))
    assert source.config.architecture == "Gemma3ForConditionalGeneration"
    ours = runner_logits(ModelRunner(args, source), IDS[:-5])
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "phi4_mini"])
def test_gpu_model_path_in_the_interpreter(tmp_path, name) -> None:
    """The model's GPU path run by Triton's interpreter: fused RMSNorms (Gemma's unit offset, the
    qk-norms), the rotary embedding fused with the K/V store (Gemma 3's local-layer rotary too,
    Phi-4-mini's partial LongRoPE) and the triton attention backend with windows, against
    transformers."""
    import dataclasses

    from radixlm.runtime.models.llama import RMSNorm
    from radixlm.runtime.models.rotary import RotaryEmbedding

    hf = save_tiny(name, str(tmp_path))
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]
    args = ServerArgs(
        model_path=str(tmp_path),
        max_total_tokens=256,
        max_running_requests=2,
        attention_backend="triton",
    )
    runner = ModelRunner(args, resolve_model(str(tmp_path)))
    model, cfg = runner.model, runner.config
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.fused = True
    model.rotary = type(model.rotary)(cfg, runner.context_len, runner.device, fused=True)
    if cfg.rope_local_theta is not None:
        local = dataclasses.replace(cfg, rope_theta=cfg.rope_local_theta, rope_scaling=None)
        local_rotary = RotaryEmbedding(local, runner.context_len, runner.device, fused=True)
        for layer in model.layers:
            if layer.self_attn.rotary is not None:
                layer.self_attn.rotary = local_rotary
    torch.testing.assert_close(runner_logits(runner, IDS), ref, rtol=1e-4, atol=1e-4)
